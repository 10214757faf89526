"""``strategy="sampled"``: a draft tree whose children are drawn from the draft's q.

The sampling verifiers (:mod:`opttree.verify.sampling`) gain over the argmax walk only when a node's
children are drawn from q rather than taken as its top tokens. They also need every node's
existence decided before its token is drawn, from tokens drawn earlier in depth-first order only
(the order they visit subtrees in): :func:`grow_sampled_tree` grows such a tree, budgeted like
OPT-Tree, and records each child's proposal law (``draws``: i.i.d. from q, or without replacement).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import torch

from .builder import BuiltTree, Growth, callable_form
from .config import TreeConfig
from .draft_tree import DraftTree

DRAWS = ("without_replacement", "iid")


def generator_device(generator, default) -> torch.device:
    """Where ``generator`` draws (a torch Generator only draws on its own device); ``default`` without one."""
    return generator.device if generator is not None else default


@dataclass
class SampledTree(BuiltTree):
    """A BuiltTree whose children were drawn from the draft's q (``draft_probs``), in sibling order."""

    draws: str = "without_replacement"  # one of DRAWS


def sample_children(q: torch.Tensor, k: int, generator=None, draws: str = "without_replacement") -> torch.Tensor:
    """k tokens drawn from q ([vocab] float): i.i.d., or one after the other without replacement
    (an exponential race: the k smallest E/q, E ~ Exp(1), are a without-replacement sequence)."""
    q = q.to(generator_device(generator, q.device))  # a generator only draws on its own device
    if draws == "iid":
        drawn = torch.multinomial(q.float(), k, replacement=True, generator=generator)
    else:
        race = torch.empty(q.shape, dtype=torch.float64, device=q.device).exponential_(generator=generator)
        race = race / q.double()  # q = 0 -> inf: never drawn
        drawn = torch.topk(race, k, largest=False).indices
    return drawn.cpu()


def slot_threshold(root_probs: torch.Tensor, budget: int, depth_cap: int) -> float:
    """τ: the ``budget``-th largest path probability of a tree in which every node had the root's q
    ([vocab] float). Known before anything is drawn, so it may decide every node's existence."""
    top = torch.topk(root_probs.double(), min(budget, int((root_probs > 0).sum()))).values.tolist()
    if not top:
        return 1.0
    # best-first over rank sequences: (−p̂, ranks); a sequence's successors extend it with rank 0
    # or bump its last rank (each sequence is reached once)
    heap, value = [(-top[0], (0,))], top[0]
    for _ in range(budget):
        if not heap:
            break
        neg, ranks = heapq.heappop(heap)
        value = -neg
        if len(ranks) < depth_cap:
            heapq.heappush(heap, (neg * top[0], ranks + (0,)))
        if ranks[-1] + 1 < len(top):
            heapq.heappush(heap, (neg / top[ranks[-1]] * top[ranks[-1] + 1], ranks[:-1] + (ranks[-1] + 1,)))
    return value


def _slot_count(path_prob: float, q: torch.Tensor, tau: float, cap: int) -> int:
    """How many children a node of p̂ ``path_prob`` gets: slots whose p̂ × (i-th largest q) ≥ τ."""
    ranked = torch.topk(q.double(), min(cap, q.shape[0])).values
    return int(((path_prob * ranked >= tau) & (ranked > 0)).sum())


def _preorder(parents: list[int]) -> list[int]:
    kids: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        kids.setdefault(p, []).append(i)
    order, stack = [], list(reversed(kids.get(-1, [])))
    while stack:
        i = stack.pop()
        order.append(i)
        stack.extend(reversed(kids.get(i, [])))
    return order


def grow_sampled_tree(root_probs: torch.Tensor, config: TreeConfig, max_depth=None,
                      generator: torch.Generator | None = None, draws: str = "without_replacement", *,
                      width: int | None = None, grow=None) -> Growth:
    """A tree whose children are drawn from the draft's q, budgeted like OPT-Tree.

    root_probs: [vocab] float. A node of path probability p̂ gets as many children as there are
    ranks i with p̂ × q_(i) ≥ τ (q_(i): its i-th largest q; τ from :func:`slot_threshold`, so a draft
    whose q looked alike everywhere would fill about ``nodes`` nodes), drawn from q (``draws``).
    Layer by layer, one draft forward per layer; the final tree is the first ``nodes`` nodes in
    depth-first order. Every decision uses only tokens drawn before the node in that order, which
    is what the sampling verifiers need (module docstring). ``width`` and ``grow`` (a budget
    policy's) are ignored: cutting the layers short would bias the draws the verifiers rely on.
    """
    if draws not in DRAWS:
        raise ValueError(f"draws must be one of {DRAWS}, got {draws!r}")
    budget = config.nodes
    depth_cap = config.max_depth if max_depth is None else min(config.max_depth, max_depth)
    device = root_probs.device
    if depth_cap < 1:
        return SampledTree(DraftTree.empty(device), torch.empty(0, dtype=torch.long, device=device), draws=draws)
    tau = slot_threshold(root_probs, budget, depth_cap)
    tokens: list[int] = []
    parents: list[int] = []
    probs: list[float] = []
    q_of_pool = {-1: root_probs}

    def add_children(parent: int, q: torch.Tensor, parent_prob: float) -> None:
        k = _slot_count(parent_prob, q, tau, budget)
        if k == 0:
            return
        drawn = sample_children(q, k, generator, draws).tolist()
        q64 = q.double()
        for token in drawn:
            tokens.append(token)
            parents.append(parent)
            probs.append(parent_prob * float(q64[token]))

    # 1. the root's children, then one layer per draft forward
    add_children(-1, root_probs, 1.0)
    layer = list(range(len(tokens)))
    forwards = 0
    for _ in range(depth_cap - 1):
        rank = {node: r for r, node in enumerate(_preorder(parents))}
        # a node that is already past the budget in depth-first order can never be kept
        frontier = [i for i in layer if probs[i] >= tau and rank[i] < budget - 1]
        if not frontier:
            break
        pool = _pool(tokens, parents, probs, device, root_probs.dtype)
        child_probs = (yield pool, torch.tensor(frontier, dtype=torch.long, device=device)).full()  # [k, vocab]
        forwards += 1
        start = len(tokens)
        for node, q in zip(frontier, child_probs):
            q_of_pool[node] = q
            add_children(node, q, probs[node])
        layer = list(range(start, len(tokens)))
        if not layer:
            break

    # 2. the first `budget` nodes in depth-first order (ascending pool ids stay topological)
    keep = torch.tensor(sorted(_preorder(parents)[:budget]), dtype=torch.long, device=device)
    pool = _pool(tokens, parents, probs, device, root_probs.dtype)
    remap = torch.full((len(pool),), -1, dtype=torch.long, device=device)
    remap[keep] = torch.arange(len(keep), device=device)
    tree = pool.subtree(keep)
    draft_probs = {(-1 if pid < 0 else int(remap[pid])): q for pid, q in q_of_pool.items() if pid < 0 or remap[pid] >= 0}
    return SampledTree(tree, keep, [tree.expected_length], forwards, draft_probs, draws=draws)


build_sampled_tree = callable_form(grow_sampled_tree)


def _pool(tokens, parents, probs, device, dtype) -> DraftTree:
    return DraftTree(torch.tensor(tokens, dtype=torch.long, device=device),
                     torch.tensor(parents, dtype=torch.long, device=device),
                     torch.tensor(probs, dtype=dtype, device=device))
