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

Every builder grows its tree as a generator (a :data:`Growth`): it yields each draft request
``(pool, frontier)``, is sent the draft's answer, and returns its :class:`BuiltTree`. So the loop
can serve every batch row's builder with one draft forward per layer (loop/lockstep.py), and
:func:`grown` serves one builder with a plain ``expand`` callable (the ``build_*`` functions).
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from typing import Callable

import torch

from .config import TreeConfig
from .draft_probs import DraftProbs
from .draft_tree import DraftTree
from .plan import LayerState

# expand(pool, frontier) -> draft probabilities for the children of each frontier node.
#   pool:     every node drafted so far this step (a DraftTree in layer order)
#   frontier: [k] long, indices into pool
#   returns:  [k, vocab] float (what :func:`grown` sends a builder: DraftProbs.dense of it)
Expand = Callable[[DraftTree, torch.Tensor], torch.Tensor]
# grow(state) -> draft one more layer? (a budget policy's rule: plan.StepPlan.grow)
Grow = Callable[[LayerState], bool]
# A builder at work: yields expand's requests (pool, frontier), is sent each answer (a
# DraftProbs: q over the tokens the drafter can propose), returns the BuiltTree.
Growth = Generator[tuple[DraftTree, torch.Tensor], DraftProbs, "BuiltTree"]
# the pool's ancestor store starts with room for nodes × depth nodes, up to this many (then doubles)
POOL_CAPACITY = 1024
# a layer's k × vocab draft probabilities from which top_children takes each row's best first: from 8 rows of
# an 8,192-token head on (Xeon AMX, 2 threads: 16 rows 0.40 against 0.48 ms, 32 rows 0.85 against 1.23 ms, budget 63;
# 4 rows 0.15 against 0.12), it reads the k × vocab values once instead of writing their products and reading them again
WIDE_LAYER = 1 << 16


@dataclass
class BuiltTree:
    """A step's final tree and how it was built."""

    tree: DraftTree  # the top-``nodes`` nodes of the pool, in pool order
    pool_ids: torch.Tensor  # [n] long: tree node i is pool node pool_ids[i]
    expected_lengths: list[float] = field(default_factory=list)  # E(A) after each layer
    draft_forwards: int = 0  # expand() calls (the root's forward not counted)
    # the draft's q for the children of the root (key -1) and of each expanded tree node
    # (key = tree index): [vocab] float each; what sampling verifiers need. Builders that grow by
    # layers record ``layers`` instead and the dict is made on first use (a host read).
    draft_probs: Mapping[int, torch.Tensor] = field(default_factory=dict)
    depth_bound: int | None = None  # no node is deeper (the layers drafted), known without a host read
    expected_length: float | None = None  # E(A) of ``tree``, when the builder knows it without a host read
    layers: list["ExpandedLayer"] = field(default_factory=list)

    def __post_init__(self):
        if self.layers and not self.draft_probs:
            self.draft_probs = LazyDraftProbs(self)

    @classmethod
    def empty(cls, device=None) -> "BuiltTree":
        """No node: the root is verified alone."""
        return cls(DraftTree.empty(device), torch.empty(0, dtype=torch.long), depth_bound=0, expected_length=0.0)


@dataclass
class ExpandedLayer:
    """One expand() call: pool nodes ``frontier`` ([k] long) and the draft's q for their children."""

    frontier: torch.Tensor
    probs: DraftProbs


class LazyDraftProbs(Mapping):
    """BuiltTree.draft_probs made from its ``layers`` when first read (tree index -> [vocab] q):
    a host read of the pool ids, which only the sampling verifiers pay."""

    def __init__(self, built: BuiltTree):
        self.built = built
        self._dict: dict[int, torch.Tensor] | None = None

    def _filled(self) -> dict[int, torch.Tensor]:
        if self._dict is None:
            tree_of_pool = {pid: i for i, pid in enumerate(self.built.pool_ids.tolist())}
            self._dict = {-1: self.built.layers[0].probs.full()[0]}
            for layer in self.built.layers[1:]:
                for pid, q in zip(layer.frontier.tolist(), layer.probs.full()):
                    if pid in tree_of_pool:
                        self._dict[tree_of_pool[pid]] = q
        return self._dict

    def __getitem__(self, key: int) -> torch.Tensor:
        return self._filled()[key]

    def __iter__(self):
        return iter(self._filled())

    def __len__(self) -> int:
        return len(self._filled())


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
    returns:      (parent row [c] long, token [c] long, p̂ [c] float), c = min(budget, k × vocab),
                  p̂ descending; zeros included (the caller cuts them with its host read).

    A wide layer over a large vocabulary (k × vocab ≥ ``WIDE_LAYER``) first keeps each row's best
    ``budget`` tokens (no other can be among the layer's best): one top-k over [k, vocab] instead
    of a product and a top-k over k × vocab values (on CPUs the flat top-k slows ~5x at 2^21 values,
    and from 2^16 on the product's extra pass over memory costs more than the per-row top-k).
    """
    k, vocab = child_probs.shape
    if k * vocab < WIDE_LAYER or vocab <= budget:
        scores = parent_probs.unsqueeze(1) * child_probs  # [k, vocab]
        top = torch.topk(scores.view(-1), min(budget, scores.numel()))
        return torch.div(top.indices, vocab, rounding_mode="floor"), top.indices % vocab, top.values
    row = torch.topk(child_probs, budget, dim=1)  # [k, budget] each row's best tokens
    scores = parent_probs.unsqueeze(1) * row.values  # [k, budget]
    top = torch.topk(scores.view(-1), budget)
    return torch.div(top.indices, budget, rounding_mode="floor"), row.indices.view(-1)[top.indices], top.values


def children_of(parent_probs: torch.Tensor, child: DraftProbs, budget: int):
    """:func:`top_children` of a layer's :class:`DraftProbs`: (parent row [c] long, token [c] long,
    p̂ [c] float), over the columns the drafter filled (its candidates), not the whole vocabulary."""
    rows, columns, probs = top_children(parent_probs, child.values, budget)
    return rows, child.tokens_at(rows, columns), probs


@dataclass
class LayerReading:
    """The one host read per layer: what the next decision needs."""

    positive: int  # the new layer's nodes with p̂ > 0 (a prefix: p̂ is descending)
    expected_length: float  # E(A) of the best ``nodes`` nodes of the pool with the new layer
    frontier: int  # the new layer's nodes among those best (a prefix), the next expand's width
    best: list[float]  # those best p̂ (at most ``nodes``), descending, ties earlier-first (zeros add nothing)


def read_layer(best: list[float], layer_probs: torch.Tensor, budget: int) -> LayerReading:
    """best: the p̂ of the pool's best ``budget`` nodes before the layer, descending (the previous
    reading's ``best``; the pool's other nodes can never be among the best again);
    layer_probs: [c] float, descending. Ties go to the earlier node (the pool before the layer,
    then the layer's own order), as a stable sort of the whole pool would break them.

    The layer's c values are the host read (the same one wait as reading three numbers); merging
    two sorted lists of at most ``budget`` values is then cheaper in Python than a dozen small
    ops on the device."""
    layer = layer_probs.tolist()  # the host read
    top: list[float] = []
    i = j = 0  # next of best, next of layer
    while len(top) < budget and (i < len(best) or j < len(layer)):
        if j == len(layer) or (i < len(best) and best[i] >= layer[j]):  # ties: the earlier node
            top.append(best[i])
            i += 1
        else:
            top.append(layer[j])
            j += 1
    positive = sum(1 for p in layer if p > 0)
    return LayerReading(positive, sum(top), min(j, positive), top)


def grown(growth: Growth, expand: Expand) -> BuiltTree:
    """The tree ``growth`` builds when each of its requests is answered by ``expand(pool, frontier)``."""
    answer = None
    while True:
        try:
            request = growth.send(answer)
        except StopIteration as done:
            return done.value
        answer = DraftProbs.dense(expand(*request))


def callable_form(grow_tree: Callable[..., Growth]) -> Callable[..., BuiltTree]:
    """``build(root_probs, expand, *args, **kwargs)``: the tree ``grow_tree(root_probs, *args, **kwargs)``
    builds with every request answered by ``expand`` (one tree at a time: tests, tools)."""

    def build(root_probs: torch.Tensor, expand: Expand, *args, **kwargs) -> BuiltTree:
        return grown(grow_tree(root_probs, *args, **kwargs), expand)

    build.__name__ = build.__qualname__ = "build_" + grow_tree.__name__.removeprefix("grow_")
    build.__module__ = grow_tree.__module__
    build.__doc__ = f"{grow_tree.__name__} served by a plain ``expand(pool, frontier)``.\n\n{grow_tree.__doc__}"
    return build


def grow_opt_tree(root_probs: torch.Tensor, config: TreeConfig, max_depth=None, *,
                  width: int | None = None, grow: Grow | None = None) -> Growth:
    """Grow an OPT-Tree: whole layers on the draft's device, one host read per layer.

    root_probs: [vocab] float, the draft's q for the root's children.
    max_depth:  a tighter depth cap for this step (e.g. tokens left before max_new_tokens).
    width:      the most nodes one draft forward expands (the layer's best by p̂); None: no cap.
    grow:       after each drafted layer, whether to draft the next (a budget policy's, plan.py); None: OPT-Tree's
                rule, while E(A) of the best ``nodes`` nodes grows by more than ``threshold``.

    The newest layer is stored by descending p̂, so the nodes worth expanding (those still among
    the pool's best ``nodes``: no other can have a kept descendant) are a prefix of it.
    """
    budget = config.nodes
    depth_cap = config.max_depth if max_depth is None else min(config.max_depth, max_depth)
    device = root_probs.device
    if depth_cap < 1:
        return BuiltTree(DraftTree.empty(device, root_probs.dtype), torch.empty(0, dtype=torch.long, device=device),
                         depth_bound=0, expected_length=0.0)

    # 1. the first layer: the root's most probable children
    top = torch.topk(root_probs, min(budget, root_probs.shape[0]))
    reading = read_layer([], top.values, budget)
    capacity = min(budget * depth_cap, POOL_CAPACITY)
    pool = DraftTree.first_layer(top.indices[:reading.positive], top.values[:reading.positive],  # p̂ descending
                                 capacity=capacity)
    pool_ids = None  # [capacity] long 0, 1, ...: made at the first expand; each frontier is a slice of it
    gains, layers = [reading.expected_length], [ExpandedLayer(torch.full((1,), -1, device=device), DraftProbs.dense(root_probs[None]))]
    start, depth = 0, 1 if reading.positive else 0  # the newest layer is pool[start:]

    # 2. deeper layers while E(A) still grows by more than the threshold (or `grow` says so)
    while depth and depth < depth_cap:
        k = min(reading.frontier, width or reading.frontier)
        if k == 0:
            break
        if grow is not None and not grow(LayerState(pool.path_probs, pool.parents, start, k)):
            break
        if pool_ids is None:
            pool_ids = torch.arange(capacity, device=device)
        # [k] pool ids
        frontier = pool_ids[start:start + k] if start + k <= capacity else torch.arange(start, start + k, device=device)
        child_probs = yield pool, frontier  # DraftProbs, k rows
        layers.append(ExpandedLayer(frontier, child_probs))
        rows, tokens, probs = children_of(pool.path_probs[start:start + k], child_probs.to(pool.path_probs.dtype), budget)
        reading = read_layer(reading.best, probs, budget)
        if reading.positive == 0:
            break
        if reading.positive < probs.shape[0]:  # q = 0 tokens are never drafted
            rows, tokens, probs = rows[:reading.positive], tokens[:reading.positive], probs[:reading.positive]
        pool, start = pool.extend(tokens, rows + start, probs), len(pool)
        depth += 1
        gains.append(reading.expected_length)
        if grow is None and gains[-1] - gains[-2] <= config.threshold:
            break

    # 3. the final tree: the best `budget` nodes, re-indexed
    keep = best_nodes(pool.path_probs, budget)
    return BuiltTree(pool.subtree(keep), keep, gains, len(layers) - 1, depth_bound=depth,
                     expected_length=gains[-1] if depth else 0.0, layers=layers)


build_opt_tree = callable_form(grow_opt_tree)


def from_pool(pool: DraftTree, keep: torch.Tensor, q_of_pool: dict, gains: list[float], forwards: int) -> BuiltTree:
    """A BuiltTree of the pool nodes ``keep`` ([k] long, ascending, closed under parents)."""
    everything = BuiltTree(pool, torch.arange(len(pool), device=pool.tokens.device), gains, forwards, q_of_pool)
    return select(everything, keep)


def select(built: BuiltTree, keep: torch.Tensor) -> BuiltTree:
    """The sub-tree of the nodes ``keep`` ([k] long, ascending tree indices, closed under parents)."""
    tree = built.tree.subtree(keep)
    if built.layers:  # draft_probs is made from the layers, by pool id
        return BuiltTree(tree, built.pool_ids[keep], list(built.expected_lengths), built.draft_forwards,
                         depth_bound=built.depth_bound, layers=built.layers)
    remap = torch.full((len(built.tree),), -1, dtype=torch.long, device=keep.device)
    remap[keep] = torch.arange(len(keep), device=keep.device)
    draft_probs = {(-1 if i < 0 else int(remap[i])): q for i, q in built.draft_probs.items()
                   if i < 0 or remap[i] >= 0}
    return BuiltTree(tree, built.pool_ids[keep], list(built.expected_lengths), built.draft_forwards, draft_probs)
