"""OPT-Tree: grow the draft tree that maximises E(A) = Σp̂ under a node budget.

Paper: Wang et al., "OPT-Tree: Speculative Decoding with Adaptive Draft Tree Structure",
TACL 2025 (arXiv 2406.17276), Algorithm 1. Layer by layer, each node of the newest layer that is
still among the best ``nodes`` nodes is expanded in ONE draft forward; the layer keeps the
``nodes`` children of highest p̂ = p̂(parent) × q(token); growth stops when E(A) of the best
``nodes``-node tree rises by no more than ``threshold`` or at ``max_depth``. The final tree is the
top-``nodes`` nodes by p̂, which is closed under ancestors (a child's p̂ never exceeds its
parent's, and ties are broken parent-first).

Two departures from the official code, both tested: a draft forward only ever sees the nodes on
its own root path (no stale non-parent nodes in the draft mask), and no draft forward is run
whose output is not used (the newest layer is expanded only if the tree grows again).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from .budget import LayerState
from .config import TreeConfig
from .tree import DraftTree

# expand(pool, frontier) -> draft probabilities for the children of each frontier node.
#   pool:     every node drafted so far this step (a DraftTree in layer order)
#   frontier: [k] long, indices into pool
#   returns:  [k, vocab] float
Expand = Callable[[DraftTree, torch.Tensor], torch.Tensor]
# grow(state) -> draft one more layer? (a budget policy's rule: budget.StepPlan.grow)
Grow = Callable[[LayerState], bool]


@dataclass
class BuiltTree:
    """A step's final tree and how it was built."""

    tree: DraftTree  # the top-``nodes`` nodes of the pool, in pool order
    pool_ids: torch.Tensor  # [n] long: tree node i is pool node pool_ids[i]
    expected_lengths: list[float] = field(default_factory=list)  # E(A) after each layer
    draft_forwards: int = 0  # expand() calls (the root's forward not counted)
    # the draft's q for the children of the root (key -1) and of each expanded tree node
    # (key = tree index): [vocab] float each; what sampling verifiers need.
    draft_probs: dict[int, torch.Tensor] = field(default_factory=dict)


def best_nodes(path_probs: torch.Tensor, budget: int) -> torch.Tensor:
    """Indices of the ``budget`` highest p̂ in a pool stored layer by layer, ties parent-first.

    path_probs: [m] float, in pool order (depth never decreases with the index).
    returns:    [min(budget, m)] long, sorted ascending (so still topological).
    """
    order = torch.sort(path_probs, descending=True, stable=True).indices  # ties: lower index first
    return torch.sort(order[:budget]).values


def top_children(parent_probs: torch.Tensor, child_probs: torch.Tensor, budget: int):
    """The ``budget`` most probable children of a layer, by p̂ = p̂(parent) × q(token).

    parent_probs: [k] float, p̂ of the expanded nodes
    child_probs:  [k, vocab] float, the draft's q for their children
    returns:      (parent row [c] long, token [c] long, p̂ [c] float), c ≤ budget, p̂ > 0.
    """
    scores = parent_probs[:, None] * child_probs  # [k, vocab]
    vocab = scores.shape[1]
    top = torch.topk(scores.flatten(), min(budget, scores.numel()))
    keep = top.values > 0
    flat = top.indices[keep]
    return flat // vocab, flat % vocab, top.values[keep]


def build_opt_tree(root_probs: torch.Tensor, expand: Expand, config: TreeConfig, max_depth=None, *,
                   width: int | None = None, grow: Grow | None = None) -> BuiltTree:
    """Grow an OPT-Tree.

    root_probs: [vocab] float, the draft's q for the root's children.
    max_depth:  a tighter depth cap for this step (e.g. tokens left before max_new_tokens).
    width:      the most nodes one draft forward expands (the layer's best by p̂); None: no cap.
    grow:       after each drafted layer, whether to draft the next (budget.py); None: OPT-Tree's
                rule, while E(A) of the best ``nodes`` nodes grows by more than ``threshold``.
    """
    budget = config.nodes
    depth_cap = config.max_depth if max_depth is None else min(config.max_depth, max_depth)
    if depth_cap < 1:
        return BuiltTree(DraftTree.empty(root_probs.device), torch.empty(0, dtype=torch.long, device=root_probs.device))

    # 1. the first layer: the root's most probable children
    one = torch.ones(1, dtype=root_probs.dtype, device=root_probs.device)
    _, tokens, probs = top_children(one, root_probs[None, :], budget)
    parents = torch.full_like(tokens, -1)
    layer = torch.arange(len(tokens), device=tokens.device)  # pool indices of the newest layer
    pool = DraftTree(tokens, parents, probs)
    gains = [pool.path_probs[best_nodes(pool.path_probs, budget)].sum().item()]
    forwards = 0
    q_of_pool = {-1: root_probs}  # pool id -> q for its children

    # 2. deeper layers while E(A) still grows by more than the threshold (or `grow` says so)
    for _ in range(depth_cap - 1):
        frontier = next_frontier(pool.path_probs, layer, budget, width)
        if len(frontier) == 0:
            break
        if grow is not None and not grow(LayerState(pool.path_probs, pool.parents, int(layer[0]), len(frontier))):
            break
        child_probs = expand(pool, frontier)  # [k, vocab]
        forwards += 1
        q_of_pool.update(zip(frontier.tolist(), child_probs))
        rows, tokens, probs = top_children(pool.path_probs[frontier], child_probs.to(pool.path_probs.dtype), budget)
        if len(tokens) == 0:
            break
        start = len(pool)
        pool = DraftTree(
            torch.cat([pool.tokens, tokens]),
            torch.cat([pool.parents, frontier[rows]]),
            torch.cat([pool.path_probs, probs]),
        )
        layer = torch.arange(start, len(pool), device=tokens.device)
        gains.append(pool.path_probs[best_nodes(pool.path_probs, budget)].sum().item())
        if grow is None and gains[-1] - gains[-2] <= config.threshold:
            break

    # 3. the final tree: the best `budget` nodes, re-indexed
    return from_pool(pool, best_nodes(pool.path_probs, budget), q_of_pool, gains, forwards)


def next_frontier(path_probs: torch.Tensor, layer: torch.Tensor, budget: int, width: int | None) -> torch.Tensor:
    """The newest layer's nodes worth expanding: those still among the pool's best ``budget``
    (no other can have a kept child), at most ``width`` of them, the most probable first.

    path_probs: [m] float, the pool's p̂; layer: [k] long, ascending pool ids of the newest layer.
    returns:    [<= min(k, width)] long, ascending pool ids.
    """
    frontier = layer[torch.isin(layer, best_nodes(path_probs, budget))]
    if width is not None and len(frontier) > width:
        order = torch.sort(path_probs[frontier], descending=True, stable=True).indices[:width]
        frontier = torch.sort(frontier[order]).values
    return frontier


def from_pool(pool: DraftTree, keep: torch.Tensor, q_of_pool: dict, gains: list[float], forwards: int) -> BuiltTree:
    """A BuiltTree of the pool nodes ``keep`` ([k] long, ascending, closed under parents)."""
    everything = BuiltTree(pool, torch.arange(len(pool), device=pool.tokens.device), gains, forwards, q_of_pool)
    return select(everything, keep)


def select(built: BuiltTree, keep: torch.Tensor) -> BuiltTree:
    """The sub-tree of the nodes ``keep`` ([k] long, ascending tree indices, closed under parents)."""
    tree = built.tree
    remap = torch.full((len(tree),), -1, dtype=torch.long, device=keep.device)
    remap[keep] = torch.arange(len(keep), device=keep.device)
    old_parents = tree.parents[keep]
    new_parents = torch.where(old_parents >= 0, remap[old_parents.clamp(min=0)], old_parents)
    if bool((new_parents[old_parents >= 0] < 0).any()):
        raise AssertionError("the kept nodes are not closed under parents; this is a bug")
    new_tree = DraftTree(tree.tokens[keep], new_parents, tree.path_probs[keep])
    draft_probs = {(-1 if i < 0 else int(remap[i])): q for i, q in built.draft_probs.items()
                   if i < 0 or remap[i] >= 0}
    return BuiltTree(new_tree, built.pool_ids[keep], list(built.expected_lengths), built.draft_forwards, draft_probs)
