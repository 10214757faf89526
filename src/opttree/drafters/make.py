"""``draft_model=`` -> the drafter one generate() call uses (any form the README lists)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ..validation import check_pair, context_length
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
