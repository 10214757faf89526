"""The few sizes a verification forward takes: its rows (the root, the tree, dummy rows) are padded up
to one of VERIFY_SIZES. Fixed shapes are what packed linear kernels, a compiled forward and CUDA
graphs are made for (one of each per size), and a forward of a few rows costs about what the next
size does anyway on the machines measured (benchmarks/RESULTS.md, "Flat verification").

Dummy rows carry the root's token at the root's position, see at most the prefix, the tree and
themselves, and no real row sees them; their outputs are never read and their cache slots are dropped
with the step's other rejected slots (:mod:`opttree.tree.masks`). The budget prices a tree at its
padded size (:mod:`opttree.budget.timing` times each size once), so ``nodes="auto"`` fills sizes.
"""

from __future__ import annotations

VERIFY_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)  # rows of a verification forward, root included


def padded_size(rows: int) -> int:
    """The smallest of VERIFY_SIZES that holds ``rows`` (>= 1) rows."""
    if rows < 1:
        raise ValueError(f"a verification forward has at least the root's row, got {rows}")
    for size in VERIFY_SIZES:
        if size >= rows:
            return size
    raise ValueError(f"{rows} rows exceed the largest verification size {VERIFY_SIZES[-1]} (tree.config.MAX_NODES caps trees below it)")


def padded_nodes(nodes: int) -> int:
    """The tree size a tree of ``nodes`` nodes is verified at: its padded rows less the root."""
    return padded_size(nodes + 1) - 1


__all__ = ["VERIFY_SIZES", "padded_nodes", "padded_size"]
