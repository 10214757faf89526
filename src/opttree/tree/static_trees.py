"""Fixed draft trees for ``strategy="static"``, written as root-to-node paths of sibling ranks.

A path ``(0, 2)`` is "the draft's most probable token at the root, then its third most probable
token after that" (Medusa's ``choices`` form). A static tree has the same shape at every step;
only its tokens change.

How the named trees are made (our own construction, not copied): assume, like Sequoia
(Chen et al., arXiv 2402.12374), that the draft's rank-r child at any node is accepted with a
fixed probability ``a[r]``, independent of depth. The expected accepted length of a tree is then
Σ over its nodes of the product of ``a`` along the node's path, and the best n-node tree is simply
the n paths with the largest products (a child's product never exceeds its parent's, so the top n
are closed under parents). :func:`positional_tree` enumerates them best first.

- ``EAGLE_STYLE_25`` / ``EAGLE_STYLE_60``: the shape EAGLE (Li et al., arXiv 2401.15077) describes
  for its hand-made trees: wide near the root (a few alternatives for the first token), narrowing
  with depth, mostly following the top-ranked child — here from a steep acceptance profile
  (a strong draft's top-1 is right ~70% of the time).
- ``SEQUOIA_STYLE_32``: a flatter profile, i.e. a weaker draft, so the tree is bushier and shallower.
- ``BINARY_DEPTH_3``: the full binary tree of depth 3 (14 nodes), a textbook baseline.
"""

from __future__ import annotations

import heapq
import itertools

Paths = tuple  # tuple[tuple[int, ...], ...]


def positional_tree(nodes: int, rank_acceptance: tuple[float, ...], max_depth: int) -> Paths:
    """The ``nodes`` paths (depth <= ``max_depth``) with the largest product of
    ``rank_acceptance[rank]`` along them, parents before children (sorted by depth, then rank)."""
    if nodes < 1 or max_depth < 1 or not rank_acceptance:
        return ()
    counter = itertools.count()  # tie-break: earlier-pushed paths first (parents before children)
    frontier = [(-a, next(counter), (r,)) for r, a in enumerate(rank_acceptance) if a > 0]
    heapq.heapify(frontier)
    chosen: list[tuple[float, tuple[int, ...]]] = []
    while frontier and len(chosen) < nodes:
        neg, _, path = heapq.heappop(frontier)
        chosen.append((-neg, path))
        if len(path) < max_depth:
            for r, a in enumerate(rank_acceptance):
                if a > 0:
                    heapq.heappush(frontier, (neg * a, next(counter), path + (r,)))
    return tuple(sorted((p for _, p in chosen), key=lambda p: (len(p), p)))


def full_tree(branching: int, depth: int) -> Paths:
    """Every path of ranks < ``branching`` up to ``depth`` (``branching`` ** d nodes at depth d)."""
    paths = [p for d in range(1, depth + 1) for p in itertools.product(range(branching), repeat=d)]
    return tuple(sorted(paths, key=lambda p: (len(p), p)))


def check_paths(paths) -> Paths:
    """Validate a static tree and return it as a tuple of int tuples, parents first."""
    if paths is None or len(paths) == 0:
        raise ValueError("static_tree must list at least one root-to-node path, e.g. ((0,), (1,), (0, 0))")
    clean = []
    for path in paths:
        if isinstance(path, int) or len(path) == 0:
            raise ValueError(f"each static_tree entry must be a non-empty tuple of sibling ranks, got {path!r}")
        if not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in path):
            raise ValueError(f"sibling ranks must be integers >= 0, got {path!r}")
        clean.append(tuple(path))
    listed = set(clean)
    if len(listed) != len(clean):
        raise ValueError("static_tree lists a path twice")
    for path in clean:
        if len(path) > 1 and path[:-1] not in listed:
            raise ValueError(f"static_tree path {path} has no parent {path[:-1]} in the tree")
    return tuple(sorted(clean, key=lambda p: (len(p), p)))


EAGLE_STYLE_25 = positional_tree(25, (0.70, 0.12, 0.05, 0.03), max_depth=6)
EAGLE_STYLE_60 = positional_tree(60, (0.70, 0.12, 0.05, 0.03, 0.02), max_depth=8)
SEQUOIA_STYLE_32 = positional_tree(32, (0.45, 0.20, 0.10, 0.06, 0.04, 0.03), max_depth=6)
BINARY_DEPTH_3 = full_tree(2, 3)

DEFAULT_STATIC_TREE = EAGLE_STYLE_25

NAMED_TREES = {
    "eagle25": EAGLE_STYLE_25,
    "eagle60": EAGLE_STYLE_60,
    "sequoia32": SEQUOIA_STYLE_32,
    "binary3": BINARY_DEPTH_3,
}
