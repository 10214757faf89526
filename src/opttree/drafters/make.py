"""``draft_model=`` -> the drafter one generate() call uses (any form the README lists, a draft folder
once :func:`opttree.loading.prepare_draft` has loaded it), and the checks of a draft model against its target."""

from __future__ import annotations

import os

import torch

from ..hf.validation import check_attention, check_causal_lm, check_weights, context_length
from ..hf.width import vocab_size
from ..tree.layout import MaskLayout
from .base import Drafter, ToProbs
from .head.base import DraftHead
from .head.drafter import FeatureHeadDrafter
from .model import ModelDrafter
from .ngram import PromptLookupDrafter


def is_draft_model(draft) -> bool:
    """Whether ``draft_model=`` is a draft MODEL (a causal LM), rather than a drafter, a feature
    head, a draft folder or ``"prompt_lookup"``."""
    return isinstance(draft, torch.nn.Module) and not isinstance(draft, DraftHead)


def make_drafter(draft, target, to_probs: ToProbs | None = None) -> Drafter:
    """What ``draft_model=`` may be: a causal LM sharing the target's vocabulary, ``"prompt_lookup"``
    (model-free n-gram drafting), a feature head, or a :class:`~opttree.drafters.base.Drafter` (bound
    afresh with :meth:`Drafter.bind` for each call). A folder written by ``opttree distill`` is loaded
    before (:func:`opttree.loading.prepare_draft`, which every entry point calls).
    to_probs: with sampling, the warpers' draft logits -> q (see Drafter.bind); None: greedy."""
    if isinstance(draft, (str, os.PathLike)):
        if draft == "prompt_lookup":
            return PromptLookupDrafter().bind(target, to_probs)
        raise ValueError(f"draft_model={str(draft)!r}: a string must be 'prompt_lookup'; load a draft folder "
                         "first with opttree.load_draft(path, target) and pass what it returns")
    if isinstance(draft, Drafter):
        return draft.bind(target, to_probs)
    if isinstance(draft, DraftHead):
        return FeatureHeadDrafter(draft).bind(target, to_probs)
    if not is_draft_model(draft):
        raise TypeError(
            f"draft_model= got a {type(draft).__name__}; it takes a causal LM with the target's vocabulary, "
            "'prompt_lookup', a folder written by `opttree distill` (loaded with opttree.load_draft), or a subclass of opttree.drafters.Drafter "
            "(a drafter of your own must subclass Drafter: see its docstring)"
        )
    check_pair(target, draft)
    return ModelDrafter(draft, to_probs, context_length(draft))


def check_pair(target, draft, tokenizer=None, draft_tokenizer=None) -> None:
    """The draft must be a causal LM with weights, sharing the target's vocabulary, and both must accept tree
    masks over every layer they have."""
    check_causal_lm(draft, "draft")
    check_weights(draft, "draft")
    MaskLayout.of(draft.config)  # layer types opttree cannot mask are refused by name
    if getattr(target.config, "is_encoder_decoder", False) or getattr(draft.config, "is_encoder_decoder", False):
        raise NotImplementedError("opttree supports decoder-only causal LMs; encoder-decoder models are not supported")
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
