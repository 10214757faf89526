"""Drafters: what proposes the draft distributions a tree is grown from."""

from __future__ import annotations

from .base import Drafter, DrafterRows
from .make import DRAFT_META, load_if_path, make_drafter
from .mixed import MixedDrafter
from .model import ModelDrafter
from .ngram import PromptLookupDrafter

__all__ = ["DRAFT_META", "Drafter", "DrafterRows", "MixedDrafter", "ModelDrafter", "PromptLookupDrafter", "load_if_path",
           "make_drafter"]
