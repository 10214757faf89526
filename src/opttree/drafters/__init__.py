"""Drafters: what proposes the draft distributions a tree is grown from.

* :mod:`.base`: the interface the loop talks to (``Drafter``, ``DrafterRows``, ``PerRow``);
* :mod:`.model`, :mod:`.batch_model`: a draft model, one row or a batch of rows per forward;
* :mod:`.head`: heads on the target's features, every layout in one folder (opttree's feature head,
  the published EAGLE heads), their layer, KV, fixed-shape step and drafters; :mod:`.ngram`: prompt lookup;
  :mod:`.mixed`: two drafters as one; :mod:`.truncated`: a stand-in draft cut from the target;
* :mod:`.make`: ``draft_model=`` -> a drafter, and the checks of a draft model against its target.

May import: :mod:`opttree.tree`, :mod:`opttree.hf`, :mod:`opttree.kernels`. A draft folder is loaded above, by
:mod:`opttree.loading`. Imported by the loop, the budget's calibration, the loading and the face.
"""

from __future__ import annotations

from .base import Drafter, DrafterRows
from .make import make_drafter
from .mixed import MixedDrafter
from .model import ModelDrafter
from .ngram import PromptLookupDrafter

__all__ = ["Drafter", "DrafterRows", "MixedDrafter", "ModelDrafter", "PromptLookupDrafter", "make_drafter"]
