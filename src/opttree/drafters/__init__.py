"""Drafters: what proposes the draft distributions a tree is grown from."""

from __future__ import annotations

from ..validation import check_pair, context_length
from .base import Drafter
from .model import ModelDrafter

__all__ = ["Drafter", "ModelDrafter", "make_drafter"]


def make_drafter(draft, target) -> Drafter:
    """What ``draft_model=`` may be: a causal LM sharing the target's vocabulary, or a Drafter."""
    if hasattr(draft, "root_probs") and hasattr(draft, "expand") and hasattr(draft, "commit"):
        return draft
    check_pair(target, draft)
    drafter = ModelDrafter(draft)
    drafter.context_length = context_length(draft)
    return drafter
