"""Tree strategies behind one interface: ``build_tree(root_probs, expand, config, max_depth)``.

Each strategy grows a :class:`~opttree.builder.BuiltTree` from the draft's q at the root and an
``expand(pool, frontier)`` callback (see builder.py). ``"opt"`` is OPT-Tree (builder.py).
"""

from __future__ import annotations

import torch

from .builder import BuiltTree, Expand, build_opt_tree
from .config import TreeConfig

BUILDERS = {
    "opt": build_opt_tree,
}


def build_tree(root_probs: torch.Tensor, expand: Expand, config: TreeConfig, max_depth: int | None = None) -> BuiltTree:
    """root_probs: [vocab] float; max_depth: this step's cap (tokens left, context left)."""
    return BUILDERS[config.strategy](root_probs, expand, config, max_depth)
