"""``draft_model=`` -> the drafter one generate() call uses (any form the README lists), and the checks
of a draft model against its target (a draft folder of ``opttree distill`` loaded the wrong way included)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ..hf.validation import check_attention, context_length, vocab_size
from .base import Drafter, ToProbs
from .feature_head import FeatureHead, FeatureHeadDrafter
from .model import ModelDrafter
from .ngram import PromptLookupDrafter

DRAFT_META = "opttree_draft.json"  # what `opttree distill` writes into every draft folder


def load_if_path(draft, target):
    """``draft_model=`` given as a folder written by ``opttree distill`` (a str or a Path): the draft
    loaded with :func:`opttree.distill.load_draft` (completed from ``target``). Anything else as is."""
    if not isinstance(draft, (str, os.PathLike)) or draft == "prompt_lookup":
        return draft
    if (Path(draft) / DRAFT_META).is_file():
        from ..distill import load_draft

        return load_draft(draft, target)
    raise ValueError(
        f"draft_model={str(draft)!r}: a string must be 'prompt_lookup' or a folder written by `opttree distill` "
        f"(it holds {DRAFT_META}); load any other draft yourself and pass the model, e.g. "
        "AutoModelForCausalLM.from_pretrained(path, attn_implementation='sdpa')"
    )


def is_draft_model(draft) -> bool:
    """Whether ``draft_model=`` is a draft MODEL (a causal LM), rather than a drafter, a feature
    head, a draft folder or ``"prompt_lookup"``."""
    return isinstance(draft, torch.nn.Module) and not isinstance(draft, FeatureHead)


def make_drafter(draft, target, to_probs: ToProbs | None = None) -> Drafter:
    """What ``draft_model=`` may be: a causal LM sharing the target's vocabulary, ``"prompt_lookup"``
    (model-free n-gram drafting), a folder written by ``opttree distill``, a feature head, or a
    :class:`~opttree.drafters.base.Drafter` (bound afresh with :meth:`Drafter.bind` for each call).
    to_probs: with sampling, the warpers' draft logits -> q (see Drafter.bind); None: greedy."""
    draft = load_if_path(draft, target)
    if isinstance(draft, str) and draft == "prompt_lookup":
        return PromptLookupDrafter().bind(target, to_probs)
    if isinstance(draft, Drafter):
        return draft.bind(target, to_probs)
    if isinstance(draft, FeatureHead):
        return FeatureHeadDrafter(draft).bind(target, to_probs)
    if not is_draft_model(draft):
        raise TypeError(
            f"draft_model= got a {type(draft).__name__}; it takes a causal LM with the target's vocabulary, "
            "'prompt_lookup', a folder written by `opttree distill`, or a subclass of opttree.drafters.Drafter "
            "(a drafter of your own must subclass Drafter: see its docstring)"
        )
    check_pair(target, draft)
    return ModelDrafter(draft, to_probs, context_length(draft))


def check_pair(target, draft, tokenizer=None, draft_tokenizer=None) -> None:
    """The draft must share the target's vocabulary and both must accept tree masks."""
    if getattr(target.config, "is_encoder_decoder", False) or getattr(draft.config, "is_encoder_decoder", False):
        raise NotImplementedError("opttree supports decoder-only causal LMs; encoder-decoder models are not supported")
    check_assembled_draft(draft)
    check_attention(target, "target")
    check_attention(draft, "draft")
    t, d = vocab_size(target), vocab_size(draft)
    if t != d:
        raise ValueError(
            f"the draft and target vocabularies differ (target has {t} output tokens, draft {d}); "
            "the draft must use the target's tokenizer — pick a draft from the same model family "
            "or train one with `opttree distill`"
        )
    if tokenizer is not None and draft_tokenizer is not None and tokenizer.get_vocab() != draft_tokenizer.get_vocab():
        raise ValueError(
            "the draft's tokenizer maps tokens to different ids than the target's; "
            "the draft must use the target's tokenizer"
        )


def check_assembled_draft(draft) -> None:
    """A draft saved by ``opttree distill`` stores only its own weights: loaded with from_pretrained,
    its embedding and output head stay random (it then runs, but drafts noise). Refuse it."""
    from ..distill.model import META_FILE, ReducedVocabHead

    source = str(draft.config.name_or_path or "")
    if not source or not (Path(source) / META_FILE).is_file():
        return
    if isinstance(draft.get_output_embeddings(), ReducedVocabHead):
        return
    raise ValueError(
        f"{source} is an opttree draft: it takes its embedding and output rows from the target, so "
        "from_pretrained() leaves them random. Load it with opttree.distill.load_draft(path, target), "
        "or pass the folder itself: draft_model=path"
    )
