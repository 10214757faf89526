"""Step 2's inputs: the verification forward's rows (every row's root, its tree, then dummy rows up to
one of tree.sizes.VERIFY_SIZES) and their masks, positions and cache slots, as :class:`.slots.Slots`
lays the rows out in the target's cache (:mod:`opttree.tree.masks` builds them)."""

from __future__ import annotations

import torch

from ..hf import kv_cache
from ..tree.draft_tree import DraftTree
from ..tree.masks import ForwardInputs, batch_verification_inputs, verification_inputs
from ..tree.sizes import padded_size
from .rows import Row
from .slots import Slots


def verify_size(trees: list[DraftTree], rows: list[Row]) -> int:
    """The rows of this step's verification forward: the root and the largest tree, padded to the size
    the row's policy picks (one row: ``"auto"`` picks the size measured cheapest for one row's forward)
    or to the smallest that holds them (several rows, whose forward no policy has timed)."""
    needed = 1 + max(len(tree) for tree in trees)
    if len(rows) == 1:
        return rows[0].policy.verify_rows(needed - 1)
    return padded_size(needed)


def verify_inputs(slots: Slots, roots: torch.Tensor, trees: list[DraftTree], rows: list[Row], dtype: torch.dtype,
                  cache) -> ForwardInputs:
    """The verification forward's inputs: roots [R] long, then each row's tree, then dummy rows up to
    :func:`verify_size`. Without holes (``slots.holes`` False) the row's tree under its whole prefix, a
    window's mask starting after the slots its layers dropped; with holes each row sees only its own
    slots, at its own positions (each root's: its row's committed tokens before it)."""
    size = verify_size(trees, rows)
    if not slots.holes:
        dropped = kv_cache.window_offsets(cache) if slots.layout is not None and slots.layout.windowed else None
        return verification_inputs(roots, trees[0], slots.length, dtype, size=size, kv_len=slots.kv_len,
                                   layout=slots.layout, dropped=dropped)
    positions = torch.tensor([row.root_position for row in rows], device=roots.device)  # [R]
    if slots.index is None:
        return batch_verification_inputs(roots, trees, positions, slots.valid, dtype, size=size, kv_len=slots.kv_len)
    indices = torch.tensor([row.root_index for row in rows], device=roots.device)  # [R]
    return batch_verification_inputs(roots, trees, positions, slots.valid, dtype, size=size, layout=slots.layout,
                                     prefix_indices=slots.index, root_indices=indices, kv_len=slots.kv_len)


__all__ = ["verify_inputs", "verify_size"]
