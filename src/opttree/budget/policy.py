"""``nodes="auto"`` / ``threshold="auto"``: the tree that maximises tokens per SECOND on this machine.

OPT-Tree (arXiv 2406.17276) maximises E(A) = Σp̂ for a fixed node budget n and leaves the depth
threshold δ open. On a GPU verifying 60 nodes costs about one token; on a CPU it does not (8 nodes
~2x, 16-64 nodes ~3-4x one token). So each step :class:`AutoPolicy` maximises the expected speed instead:

    speed(m) = (E_m + 1) / (T(m) + D)

E_m  = the expected number of accepted nodes among the m most probable: the sum of their
       CALIBRATED p̂, r(p̂), over the top-m nodes by p̂ (they form a valid tree for every m; +1 is
       the bonus token). r is the pair's :class:`~opttree.budget.reliability.ReliabilityMap`, learnt from
       every verified tree (how often nodes of a given p̂ were really accepted); it starts as the
       identity (E_m = Σp̂, OPT-Tree's E(A)) and is non-decreasing in p̂, so ranking by p̂ and by
       r(p̂) agree and an over-confident draft gets smaller trees,
T(m) = the target's latency to verify the root and m nodes (measured; plus the rest of a step:
       cache surgery, commit): a forward padded to the next of :data:`~opttree.tree.sizes.VERIFY_SIZES`
       rows, so T is a step function of m and the best m fills a size,
D    = the drafting time of the step so far (measured: the catch-up forward, the layers actually
       drafted and the tree building; sunk, the same for every m).

*Budget*: verify the m that maximises speed(m), m = 0 (the root alone, as plain decoding) included.
*Depth* (the paper's open δ): before each draft forward the policy compares the best speed now with
the best speed after one more layer of w nodes, its cost c(w) (one ``drafter.expand`` over w nodes,
measured) added to D and its p̂ guessed from the last layer (:func:`next_layer_guess`, calibrated
like the drafted ones); it stops when the layer would not pay, i.e. when the layer's expected gain
per second of drafting falls below the current rate. *Width*: a layer never expands more than about
twice the recent verified tree size (:func:`layer_width`), so a step never pays for 64-wide layers
it then prunes.

*Probes*: now and then a step verifies a smaller tree than chosen, so that decoding's clock prices the
smaller sizes too (:meth:`~opttree.budget.latency.LatencyModel.probe`).

T, c and the map are the pair's :class:`~opttree.budget.latency.LatencyModel`; each call's policies are
made on it by :func:`opttree.budget.calibration.policy_maker`.
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from ..tree.config import TreeConfig
from ..tree.plan import LayerState, StepPlan
from ..tree.sizes import padded_nodes
from .latency import AUTO_MAX_NODES, REFRESH, LatencyModel

SIZE_REFRESH = 0.25  # weight of each step's verified size in the running mean tree size
WIDTH_PER_NODE = 2.0  # layer width cap = this × the running mean tree size
MIN_WIDTH = 2
START_SIZE = 4.0  # the running mean tree size before any step (first width cap: 8)


# ---------------------------------------------------------------------------------------------
# the decisions, as small pure functions


def expected_speed(path_probs: torch.Tensor, latency: LatencyModel, draft_seconds: float,
                   cap: int | None = None) -> torch.Tensor:
    """speed(m) for m = 1 … min(len, cap): (E_m + 1) / (T(m) + D).

    path_probs: [k] float, any order (the m largest are taken; E_m sums their calibrated values).
    returns:    [min(k, cap)] float64, entry m - 1 is speed(m).
    """
    ranked = torch.sort(path_probs.double().cpu(), descending=True).values[:cap]  # chosen by p̂
    gain = torch.cumsum(latency.reliability.apply(ranked), 0) + 1.0  # [k]: E_m + 1, E_m calibrated
    return gain / (latency.step_times(len(ranked)) + draft_seconds)


def best_choice(path_probs: torch.Tensor, latency: LatencyModel, draft_seconds: float,
                cap: int | None = None) -> tuple[int, float]:
    """(m, speed(m)) for the m in 0 … min(len, cap) that maximises speed(m) (E_m calibrated by the
    latency model's reliability map, see :func:`expected_speed`). m = 0 verifies the
    root alone, speed(0) = 1 / (T(0) + D): where verifying even one node costs more than its E(A)
    is worth (a weak draft on a CPU), a step falls back to what plain decoding does."""
    alone = 1.0 / (latency.verify_time(0) + latency.overhead + draft_seconds)
    if len(path_probs) == 0:
        return 0, alone
    speed = expected_speed(path_probs, latency, draft_seconds, cap)
    m = int(torch.argmax(speed)) + 1  # first maximum: the smaller tree on ties
    return (m, float(speed[m - 1])) if float(speed[m - 1]) > alone else (0, alone)


def best_size(path_probs: torch.Tensor, latency: LatencyModel, draft_seconds: float, cap: int | None = None) -> int:
    """The m (0 <= m <= cap) that maximises speed(m) (see :func:`best_choice`)."""
    return best_choice(path_probs, latency, draft_seconds, cap)[0]


def next_layer_guess(state: LayerState, cap: int | None = None) -> torch.Tensor:
    """The p̂ the next layer would add, guessed from the last one: each of the ``next_width`` most
    probable last-layer nodes gets children whose q (child p̂ / parent p̂) by rank is the last
    layer's mean q by rank (exact for a draft whose q looks alike everywhere).

    returns: [<= cap] float64, descending.
    """
    probs = state.path_probs.double().cpu()
    parents = state.parents.cpu()
    last = torch.arange(state.previous, len(probs))
    if len(last) == 0:
        return probs.new_zeros(0)
    parent_probs = torch.where(parents[last] >= 0, probs[parents[last].clamp(min=0)], probs.new_ones(len(last)))
    ratios = probs[last] / parent_probs  # [k]: the q of each last-layer node
    _, group = torch.unique(parents[last], return_inverse=True)  # [k]: each node's sibling group, 0 … g - 1
    by_q = torch.sort(ratios, descending=True, stable=True).indices
    order = by_q[torch.sort(group[by_q], stable=True).indices]  # [k]: by group, within one by q descending
    sizes = torch.bincount(group)  # [g]
    rank = torch.arange(len(order)) - (torch.cumsum(sizes, 0) - sizes)[group[order]]  # [k]: q's rank among siblings
    # [width]: the mean q by rank over the groups (a group without that rank counts 0), in ops that do not
    # grow with the groups (this runs before every draft forward)
    profile = ratios.new_zeros(int(sizes.max())).index_add_(0, rank, ratios[order]) / len(sizes)
    frontier = torch.sort(probs[last], descending=True).values[:state.next_width]  # [w]
    guess = torch.sort((frontier[:, None] * profile[None, :]).flatten(), descending=True).values
    return guess[:cap]


def layer_pays(state: LayerState, latency: LatencyModel, draft_seconds: float, cap: int | None = None) -> bool:
    """Draft one more layer? Yes if the best expected speed with it (its p̂ guessed by
    :func:`next_layer_guess` and calibrated with the drafted ones in :func:`best_choice`, its cost
    c(w) added to the drafting time) beats the best speed now;
    in OPT-Tree's terms, while the layer's E(A) gain per second of drafting beats the current rate."""
    if len(state.path_probs) == 0 or state.next_width < 1:
        return False
    _, now = best_choice(state.path_probs, latency, draft_seconds, cap)
    grown = torch.cat([state.path_probs.double().cpu(), next_layer_guess(state, cap)])
    _, later = best_choice(grown, latency, draft_seconds + latency.layer_time(state.next_width), cap)
    return later > now


def layer_width(mean_size: float, max_nodes: int) -> int:
    """The layer width cap: about WIDTH_PER_NODE × the recent tree size, never the whole budget
    (at most half of it), at least MIN_WIDTH (or the budget, when smaller)."""
    return max(min(MIN_WIDTH, max_nodes), min(round(WIDTH_PER_NODE * mean_size), max_nodes // 2))


def largest_tree(config: TreeConfig) -> int:
    """The most nodes a step of ``config`` verifies (what caches must make room for), known before any
    calibration: AUTO_MAX_NODES for ``nodes="auto"``, else ``nodes``."""
    return AUTO_MAX_NODES if config.nodes == "auto" else config.nodes


def as_calibrated(latency: LatencyModel) -> LatencyModel:
    """What a sampled call's rows plan from: a new model holding the pair's tables as its calibration
    measured or read them (``latency.calibrated``, else ``latency``'s own), whatever steps have
    refreshed since; nothing learnt."""
    base = latency.calibrated or latency
    return LatencyModel(verify=base.verify, verify_measured=base.verify_measured, layer=base.layer,
                        root_seconds=base.root_seconds, measured_only=base.measured_only)


class AutoPolicy:
    """``nodes="auto"`` and/or ``threshold="auto"`` against a measured :class:`LatencyModel`.

    ``timed=False`` (a sampled call's policy, see :func:`opttree.budget.calibration.policy_maker`):
    every decision is a function of the step's tree and ``latency`` alone, so the same call draws the
    same random numbers (DESIGN.md, *Seeded sampling repeats*): the drafting time so far is the model's
    price of what was drafted (the catch-up, then c(w) of each layer granted), not the clock's, and a
    step's measured times are not learnt (its acceptances are: deterministic given the draws)."""

    def __init__(self, config: TreeConfig, latency: LatencyModel, clock: Callable[[], float] | None = None,
                 *, timed: bool = True):
        """clock: seconds, for the step's drafting time so far (tests pass a fake machine's; default
        time.perf_counter, read at each call)."""
        self.config = config
        self.latency = latency
        self.clock = clock or (lambda: time.perf_counter())
        self.timed = timed  # the loop times the step's phases (device syncs) only for a timed policy
        self.auto_nodes = config.nodes == "auto"
        self.auto_threshold = config.threshold == "auto"
        self.max_nodes = largest_tree(config)
        self.threshold = 0.0 if self.auto_threshold else config.threshold  # with "auto", `grow` decides
        self._start = self.clock()
        self._priced = latency.root_seconds  # untimed: the model's drafting time of the step so far
        self._probing: int | None = None  # this step's probed size (LatencyModel.probe), verified at its own rows
        # the recent tree size, shared by later calls with the same settings (not by other settings)
        self.setting = f"{config.strategy}/{config.nodes}/{config.threshold}/{config.max_depth}"
        self.mean_size = latency.mean_sizes.get(self.setting, START_SIZE)

    def spent(self) -> float:
        """Seconds of drafting in this step so far: since the plan (timed), or as the model prices it."""
        return self.clock() - self._start if self.timed else self._priced

    def verify_rows(self, nodes: int) -> int:
        """The rows a tree of ``nodes`` nodes is verified at: the measured cheapest size that holds it, or on a
        probe step the probed size (:meth:`LatencyModel.probe`)."""
        if self._probing is not None and nodes <= self._probing:
            return self._probing + 1
        return self.latency.verify_rows(nodes)

    def plan(self) -> StepPlan:
        self._start = self.clock()
        self._priced = self.latency.root_seconds
        self._probing = None
        return StepPlan(
            nodes=self.max_nodes,
            threshold=self.threshold,
            width=layer_width(self.mean_size, self.max_nodes),
            grow=self._grow if self.auto_threshold else None,
            size=self._size if self.auto_nodes else None,
        )

    def _grow(self, state: LayerState) -> bool:
        pays = layer_pays(state, self.latency, self.spent(), self.max_nodes)
        if pays:
            self._priced += self.latency.layer_time(state.next_width)
        return pays

    def _size(self, path_probs: torch.Tensor) -> int:
        size = best_size(path_probs, self.latency, self.spent(), self.max_nodes)
        if not self.timed:
            return size
        probe = self.latency.probe(size)  # probes: decoding's clock prices smaller sizes, each at its own size
        self._probing = padded_nodes(probe) if probe != size else None  # a table size: the rows it is verified at
        return probe

    def observe(self, step) -> None:
        with self.latency.lock:
            if self.timed:
                rest = self.spent() - step.draft_seconds - step.verify_seconds  # since plan(): the whole step
                self.latency.overhead += REFRESH * (max(rest, 0.0) - self.latency.overhead)
                self.latency.observe(step, self._probing)
            if step.tree is not None and step.accepted_nodes is not None and len(step.tree) > 0:
                accepted = torch.zeros(len(step.tree), dtype=torch.bool)
                accepted[step.accepted_nodes] = True
                self.latency.reliability.update(step.tree.path_probs, accepted)
            if step.tree_size > 0:
                self.mean_size += SIZE_REFRESH * (step.tree_size - self.mean_size)
                self.latency.mean_sizes[self.setting] = self.mean_size


__all__ = ["AutoPolicy", "MIN_WIDTH", "SIZE_REFRESH", "START_SIZE", "WIDTH_PER_NODE", "as_calibrated", "best_choice",
           "best_size", "expected_speed", "largest_tree", "layer_pays", "layer_width",
           "next_layer_guess"]
