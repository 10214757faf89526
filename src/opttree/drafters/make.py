"""``draft_model=`` -> a per-call drafter (any form the README lists)."""

from __future__ import annotations

import os
from pathlib import Path

from ..validation import check_pair, context_length
from .base import Drafter
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


def make_drafter(draft, target) -> Drafter:
    """What ``draft_model=`` may be: a causal LM sharing the target's vocabulary, ``"prompt_lookup"``
    (model-free n-gram drafting), a folder written by ``opttree distill``, or a Drafter (one with ``for_target(target)`` is bound afresh to
    this target for each call, so its per-call state never leaks into the next)."""
    draft = load_if_path(draft, target)
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
