"""Tree strategies behind one interface: ``grow(root_probs, config, max_depth) -> Growth``.

Each strategy grows a :class:`~opttree.tree.builder.BuiltTree` from the draft's q at the root,
yielding each draft request ``(pool, frontier)`` and receiving the draft's answer (a
:data:`~opttree.tree.builder.Growth`; its ``build_*`` twin takes an ``expand(pool, frontier)``
callable instead, see builder.py). The pool a strategy asks about only ever grows by appending
(pool ids are stable), every frontier node's parent was expanded before it (a model drafter has
its ancestors in its cache), and ``BuiltTree.pool_ids`` index that pool.

Each strategy is one :class:`~opttree.tree.registry.Strategy` record, registered at the end of this
module: its builder, its words in the docs, whether the budget plan sizes it, whether it draws.

- ``"opt"``: OPT-Tree (Wang et al., arXiv 2406.17276), layer by layer; builder.py.
- ``"heap"``: DySpec's greedy expansion (Xiong et al., arXiv 2410.11744): always expand the most
  probable node that could still change the best tree, ``batch`` nodes per draft forward. The
  result is the E(A)-optimal ``nodes``-node tree (within ``max_depth``) — not an approximation:
  expansion only stops when no unexpanded node can have a child among the best ``nodes``.
- ``"delayed"``: delayed tree expansion (arXiv "Dynamic Delayed Tree Expansion For Improved
  Multi-Path Speculative Decoding"): a single path of ``delay`` draft-greedy tokens first, the
  branching only below it (an OPT-Tree grown from the path's tip with the remaining budget).
- ``"chain"``: one path of up to ``min(nodes, max_depth)`` draft-greedy tokens (classic
  speculative decoding).
- ``"sampled"``: children drawn from the draft's q (sampled.py), for the sampling verifiers.
- ``"static"``: a fixed shape, ``config.static_tree`` (root-to-node paths of sibling ranks; default
  :data:`~opttree.tree.static_trees.DEFAULT_STATIC_TREE`), filled with the draft's ranked tokens.

Every builder takes the same keywords from the step's :class:`~opttree.tree.plan.StepPlan`: ``width``
(the most nodes one draft forward expands) and ``grow`` (whether to draft one more layer, asked
before each draft forward past the first layer; None: the strategy's own rule). Fixed shapes
("static", "sampled") ignore both. With ``nodes="auto"`` the plan's ``size`` rule then keeps the
top-m nodes by p̂ that maximise the expected tokens per second, for every strategy whose record
``follows_plan`` (all but "sampled", whose drawn tree keeps its own order; opttree.budget).
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from .builder import (BuiltTree, Grow, Growth, best_nodes, callable_form, from_pool, grow_opt_tree, select,
                      top_children)
from .config import TreeConfig
from .draft_tree import DraftTree
from .plan import LayerState, StepPlan
from .registry import Strategy, register_strategies
from .sampled import grow_sampled_tree
from .static_trees import DEFAULT_STATIC_TREE, check_paths

HEAP_NODES_PER_FORWARD = 8  # "heap": expand about nodes / 8 nodes per draft forward (at least 1)
DELAY = 2  # "delayed": tokens on the single path before the tree branches


def _depth_cap(config: TreeConfig, max_depth: int | None) -> int:
    return config.max_depth if max_depth is None else min(config.max_depth, max_depth)


def _empty(device) -> BuiltTree:
    return BuiltTree(DraftTree.empty(device), torch.empty(0, dtype=torch.long, device=device))


def keep_best(built: BuiltTree, m: int) -> BuiltTree:
    """The top-``m`` nodes by p̂ (ties: the earlier node, so parents before children)."""
    if m >= len(built.tree):
        return built
    return select(built, best_nodes(built.tree.path_probs, m))


# ---------------------------------------------------------------------------------------------
# "heap": DySpec's greedy expansion, batched


def heap_batch(budget: int) -> int:
    return max(1, math.ceil(budget / HEAP_NODES_PER_FORWARD))


def grow_heap_tree(root_probs: torch.Tensor, config: TreeConfig, max_depth=None, batch: int | None = None, *,
                   width: int | None = None, grow: Grow | None = None) -> Growth:
    """The E(A)-optimal ``config.nodes``-node tree, by best-first expansion.

    root_probs: [vocab] float. batch: nodes expanded per draft forward (default: nodes / 8, at
    most ``width``). grow: asked before each draft forward; stopping early gives up optimality.
    Invariant: every sequence missing from the pool has p̂ no higher than the current n-th best
    pool node, once no unexpanded node above that line (and above the depth cap) remains. Each
    forward expands the ``batch`` most probable such nodes; only the ``nodes`` best children of a
    forward can matter, so only those join the pool.
    """
    budget, depth_cap = config.nodes, _depth_cap(config, max_depth)
    if depth_cap < 1:
        return _empty(root_probs.device)
    batch = batch or min(heap_batch(budget), width or budget)
    one = torch.ones(1, dtype=root_probs.dtype, device=root_probs.device)
    _, tokens, probs = top_children(one, root_probs[None, :], budget)
    pool = DraftTree.first_layer(tokens[probs > 0], probs[probs > 0])
    expanded = torch.zeros(len(pool), dtype=torch.bool, device=tokens.device)
    q_of_pool = {-1: root_probs}
    gains = [pool.path_probs[best_nodes(pool.path_probs, budget)].sum().item()]
    forwards = 0
    previous_size = 0  # pool size before the last draft forward's children
    while True:
        best = best_nodes(pool.path_probs, budget)
        line = pool.path_probs[best].min() if len(best) == budget else pool.path_probs.new_tensor(0.0)
        open_ = best[~expanded[best] & (pool.depths()[best] < depth_cap) & (pool.path_probs[best] > line)]
        if len(open_) == 0:
            break
        order = torch.sort(pool.path_probs[open_], descending=True, stable=True).indices[:batch]
        frontier = torch.sort(open_[order]).values
        if grow is not None and not grow(LayerState(pool.path_probs, pool.parents, previous_size, len(frontier))):
            break
        previous_size = len(pool)
        child_probs = (yield pool, frontier).full()  # [k, vocab]
        forwards += 1
        expanded[frontier] = True
        q_of_pool.update(zip(frontier.tolist(), child_probs))
        rows, tokens, probs = top_children(pool.path_probs[frontier], child_probs.to(pool.path_probs.dtype), budget)
        positive = probs > 0  # q = 0 tokens are never drafted
        rows, tokens, probs = rows[positive], tokens[positive], probs[positive]
        pool = pool.extend(tokens, frontier[rows], probs)
        expanded = torch.cat([expanded, torch.zeros(len(tokens), dtype=torch.bool, device=expanded.device)])
        gains.append(pool.path_probs[best_nodes(pool.path_probs, budget)].sum().item())
    return from_pool(pool, best_nodes(pool.path_probs, budget), q_of_pool, gains, forwards)


build_heap_tree = callable_form(grow_heap_tree)


# ---------------------------------------------------------------------------------------------
# "chain" and "delayed"


def _greedy_path(root_probs: torch.Tensor, length: int, grow: Grow | None = None):
    """Grows a path of up to ``length`` draft-argmax tokens, returns (pool, q_of_pool, forwards);
    the tip not expanded. grow: asked before each draft forward (None: always). One host read per
    token (whether its p̂ is still positive)."""
    device = root_probs.device
    q_of_pool = {-1: root_probs}
    q, pool, forwards = root_probs, DraftTree.empty(device, root_probs.dtype), 0
    for i in range(length):
        if i > 0:
            if grow is not None and not grow(LayerState(pool.path_probs, pool.parents, i - 1, 1)):
                break
            q = (yield pool, torch.arange(i - 1, i, device=device)).full()[0]
            forwards += 1
            q_of_pool[i - 1] = q
        best = q.max(dim=0)  # ties: the first maximal token, as argmax
        p = best.values.to(pool.path_probs.dtype).view(1) * (pool.path_probs[i - 1] if i else 1.0)  # [1]
        if float(p) <= 0:
            break
        token = best.indices.view(1)
        pool = (DraftTree.first_layer(token, p) if i == 0
                else pool.extend(token, torch.full((1,), i - 1, dtype=torch.long, device=device), p))
    return pool, q_of_pool, forwards


def grow_chain(root_probs: torch.Tensor, config: TreeConfig, max_depth=None, *,
               width: int | None = None, grow: Grow | None = None) -> Growth:
    """root_probs: [vocab] float. One path of min(nodes, depth cap) draft-greedy tokens (fewer
    when ``grow`` stops it; ``width`` is always 1)."""
    length = min(config.nodes, _depth_cap(config, max_depth))
    if length < 1:
        return _empty(root_probs.device)
    pool, q_of_pool, forwards = yield from _greedy_path(root_probs, length, grow)
    ids = torch.arange(len(pool), device=pool.tokens.device)
    expected = pool.expected_length
    return BuiltTree(pool, ids, [expected], forwards, q_of_pool, depth_bound=len(pool), expected_length=expected)


build_chain = callable_form(grow_chain)


def _graft(stem: DraftTree, sub: DraftTree) -> DraftTree:
    """``sub`` (a tree under the stem's last node, p̂ relative to it) appended below ``stem``."""
    tip = len(stem) - 1
    parents = torch.where(sub.parents >= 0, sub.parents + len(stem), torch.full_like(sub.parents, tip))
    return DraftTree(torch.cat([stem.tokens, sub.tokens]), torch.cat([stem.parents, parents]),
                     torch.cat([stem.path_probs, sub.path_probs * stem.path_probs[tip]]))


def _below(stem: DraftTree, growth: Growth) -> Growth:
    """``growth``, a tree grown under the stem's tip, with its requests asked of the whole pool (the
    stem, then the sub-tree's pool behind it)."""
    answer = None
    while True:
        try:
            sub_pool, frontier = growth.send(answer)
        except StopIteration as done:
            return done.value
        answer = yield _graft(stem, sub_pool), frontier + len(stem)


def grow_delayed_tree(root_probs: torch.Tensor, config: TreeConfig, max_depth=None, delay: int = DELAY, *,
                      width: int | None = None, grow: Grow | None = None) -> Growth:
    """root_probs: [vocab] float. ``delay`` draft-greedy tokens, then an OPT-Tree below the last
    one with the remaining budget and depth (``width`` and ``grow`` apply to that OPT-Tree)."""
    budget, depth_cap = config.nodes, _depth_cap(config, max_depth)
    stem_len = min(delay, budget, depth_cap)
    if stem_len < 1:
        return _empty(root_probs.device)
    stem, q_of_pool, forwards = yield from _greedy_path(root_probs, stem_len)
    whole = torch.arange(len(stem), device=stem.tokens.device)
    if len(stem) < stem_len or budget == stem_len or depth_cap == stem_len:
        return from_pool(stem, whole, q_of_pool, [stem.expected_length], forwards)

    # the branching part: an OPT-Tree rooted at the stem's tip, its pool kept behind the stem's
    tip = len(stem) - 1
    tip_probs = (yield stem, torch.tensor([tip], device=stem.tokens.device)).full()[0]
    forwards += 1
    q_of_pool[tip] = tip_probs

    sub_grow = None
    if grow is not None:  # the policy sees absolute p̂: the stem's, then the sub-tree's below the tip
        def sub_grow(state: LayerState) -> bool:
            probs = torch.cat([stem.path_probs, state.path_probs * stem.path_probs[tip]])
            parents = torch.cat([stem.parents, torch.where(state.parents >= 0, state.parents + len(stem),
                                                           torch.full_like(state.parents, tip))])
            return grow(LayerState(probs, parents, state.previous + len(stem), state.next_width))

    sub = yield from _below(stem, grow_opt_tree(tip_probs, replace(config, nodes=budget - stem_len),
                                                depth_cap - stem_len, width=width, grow=sub_grow))
    tree = _graft(stem, sub.tree)
    pool_ids = torch.cat([whole, sub.pool_ids + len(stem)])
    draft_probs = {i: q_of_pool[i] for i in range(-1, len(stem))}
    draft_probs.update({(tip if i < 0 else i + len(stem)): q for i, q in sub.draft_probs.items()})
    gains = [stem.expected_length + g * float(stem.path_probs[tip]) for g in sub.expected_lengths]
    return BuiltTree(tree, pool_ids, gains, forwards + sub.draft_forwards, draft_probs)


build_delayed_tree = callable_form(grow_delayed_tree)


# ---------------------------------------------------------------------------------------------
# "static": a fixed shape


def grow_static_tree(root_probs: torch.Tensor, config: TreeConfig, max_depth=None, *,
                     width: int | None = None, grow: Grow | None = None) -> Growth:
    """root_probs: [vocab] float. Fill ``config.static_tree`` (sibling-rank paths) with the draft's
    ranked tokens, one draft forward per depth; nodes beyond the depth cap, or whose token has
    q = 0, are dropped (with their descendants); then the best ``nodes`` by p̂ are kept. A fixed
    shape: ``width`` and ``grow`` are ignored."""
    depth_cap = _depth_cap(config, max_depth)
    paths = [p for p in check_paths(config.static_tree or DEFAULT_STATIC_TREE) if len(p) <= depth_cap]
    if not paths:
        return _empty(root_probs.device)
    device = root_probs.device
    index: dict[tuple, int] = {(): -1}
    q_of_pool = {-1: root_probs}
    pool = DraftTree.empty(device)
    forwards = 0
    for depth in range(1, max(map(len, paths)) + 1):
        layer = [p for p in paths if len(p) == depth and p[:-1] in index]
        if not layer:
            break
        parents = sorted({index[p[:-1]] for p in layer})
        if depth > 1:
            frontier = torch.tensor(parents, dtype=torch.long, device=device)
            q_of_pool.update(zip(parents, (yield pool, frontier).full()))
            forwards += 1
        tokens, parent_ids, probs = [], [], []
        for path in layer:
            parent = index[path[:-1]]
            q = q_of_pool[parent].to(pool.path_probs.dtype)
            ranked = torch.sort(q, descending=True, stable=True)
            rank = path[-1]
            if rank >= len(q) or ranked.values[rank] <= 0:
                continue
            index[path] = len(pool) + len(tokens)
            tokens.append(int(ranked.indices[rank]))
            parent_ids.append(parent)
            probs.append(float(ranked.values[rank]) * (1.0 if parent < 0 else float(pool.path_probs[parent])))
        if tokens:
            pool = DraftTree(torch.cat([pool.tokens, torch.tensor(tokens, device=device)]),
                             torch.cat([pool.parents, torch.tensor(parent_ids, device=device)]),
                             torch.cat([pool.path_probs, torch.tensor(probs, dtype=pool.path_probs.dtype, device=device)]))
    keep = best_nodes(pool.path_probs, config.nodes)
    return from_pool(pool, keep, q_of_pool, [pool.expected_length], forwards)


build_static_tree = callable_form(grow_static_tree)


register_strategies(  # one record per strategy (registry.py): the docs list them in this order
    Strategy(name="opt", grow=grow_opt_tree, summary="OPT-Tree", follows_plan=True, draws=False),
    Strategy(name="heap", grow=grow_heap_tree, summary="the E(A)-optimal tree, DySpec's greedy expansion",
             follows_plan=True, draws=False),
    Strategy(name="delayed", grow=grow_delayed_tree, summary="a short path, then a tree", follows_plan=True,
             draws=False),
    Strategy(name="chain", grow=grow_chain, summary="one path: classic speculative decoding", follows_plan=True,
             draws=False),
    Strategy(name="static", grow=grow_static_tree, summary="static_tree=", follows_plan=True, draws=False),
    # a drawn tree keeps its own order, and its shape must not depend on timings
    Strategy(name="sampled", grow=grow_sampled_tree, summary="children drawn from the draft", follows_plan=False,
             draws=True),
)


def grow_tree(root_probs: torch.Tensor, config: TreeConfig, max_depth: int | None = None,
              generator: torch.Generator | None = None, plan: StepPlan | None = None) -> Growth:
    """root_probs: [vocab] float; max_depth: this step's cap (tokens left, context left).

    plan: this step's budget from a :class:`~opttree.tree.plan.BudgetPolicy` (default: ``config``'s
    fixed nodes and threshold); with ``nodes="auto"`` its ``size`` rule then cuts the strategy's
    tree to the top-m nodes by p̂ that maximise the expected tokens per second."""
    if plan is None:
        if config.nodes == "auto" or config.threshold == "auto":
            raise ValueError("nodes/threshold='auto' must be resolved against the models first: "
                             "build_tree(..., plan=opttree.budget.calibration.make_policy(config, target, drafter)"
                             ".plan())")
        plan = StepPlan(nodes=config.nodes, threshold=config.threshold)
    step_config = replace(config, nodes=plan.nodes, threshold=plan.threshold)
    record = config.strategy_record
    extra = {"generator": generator} if record.draws else {}
    built = yield from record.grow(root_probs, step_config, max_depth, width=plan.width, grow=plan.grow, **extra)
    if plan.size is not None and record.follows_plan:
        built = keep_best(built, plan.size(built.tree.path_probs))
    return built


def no_tree(device: torch.device) -> Growth:
    """The builder of a row with no room left to draft: the empty tree, without asking the drafter."""
    yield from ()
    return BuiltTree.empty(device)


build_tree = callable_form(grow_tree)
