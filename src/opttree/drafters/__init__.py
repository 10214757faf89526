"""Drafters: what proposes the draft distributions a tree is grown from."""

from .base import Drafter
from .model import ModelDrafter

__all__ = ["Drafter", "ModelDrafter"]
