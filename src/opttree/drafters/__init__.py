"""Drafters: what proposes the draft distributions a tree is grown from."""

from __future__ import annotations

from ..validation import check_pair, context_length
from .base import Drafter
from .mixed import MixedDrafter
from .model import ModelDrafter
from .ngram import PromptLookupDrafter

__all__ = ["Drafter", "MixedDrafter", "ModelDrafter", "PromptLookupDrafter", "make_drafter"]


def make_drafter(draft, target) -> Drafter:
    """What ``draft_model=`` may be: a causal LM sharing the target's vocabulary, ``"prompt_lookup"``
    (model-free n-gram drafting), or a Drafter (one with ``for_target(target)`` is bound afresh to
    this target for each call, so its per-call state never leaks into the next)."""
    if isinstance(draft, str) and draft == "prompt_lookup":
        return PromptLookupDrafter().for_target(target)
    if hasattr(draft, "for_target"):
        return draft.for_target(target)
    if hasattr(draft, "root_probs") and hasattr(draft, "expand") and hasattr(draft, "commit"):
        return draft
    check_pair(target, draft)
    drafter = ModelDrafter(draft)
    drafter.context_length = context_length(draft)
    return drafter
