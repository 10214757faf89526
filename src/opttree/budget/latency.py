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

The :class:`LatencyModel` holds T(n), c(w), the rest of a step and the reliability map, measured by
:mod:`opttree.budget.calibration` and refreshed from every step (T(n) as scale × table + offset, by
exponentially weighted least squares; c(w) by a scale; the rest of a step by an average; the map
from the verified tree and its accepted nodes). Its refresh runs under the model's own lock:
decodes in several threads share one model per pair. T(1 … m) + the rest of a step is a slice of
a tensor cached until those numbers change.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass
from typing import Callable

import torch

from ..tree.config import TreeConfig
from ..tree.plan import LayerState, StepPlan
from ..tree.sizes import padded_nodes
from .reliability import ReliabilityMap

AUTO_MAX_NODES = 63  # the largest tree "auto" will ever verify (the pool budget): with the root, 64 rows
REFRESH = 0.1  # weight of each new step in the online latency averages
SIZE_REFRESH = 0.25  # weight of each step's verified size in the running mean tree size
WIDTH_PER_NODE = 2.0  # layer width cap = this × the running mean tree size
MIN_WIDTH = 2
START_SIZE = 4.0  # the running mean tree size before any step (first width cap: 8)


@dataclass
class LatencyTable:
    """Seconds measured at a few sizes; linear in between."""

    sizes: tuple[int, ...]  # ascending
    seconds: tuple[float, ...]

    def at(self, n: float) -> float:
        """Linear between measured sizes; beyond the last one the last segment's slope goes on
        (never downwards: more nodes never cost less)."""
        xs, ys = self.sizes, self.seconds
        if len(xs) == 1:
            return ys[0]
        i = max(1, min(len(xs) - 1, next((k for k, x in enumerate(xs) if x >= n), len(xs) - 1)))
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        slope = (y1 - y0) / (x1 - x0)
        if n > x1:
            slope = max(slope, 0.0)
            x0, y0 = x1, y1
        return max(y0 + slope * (n - x0), 0.0)


def complete_table(measured: LatencyTable, sizes: tuple[int, ...]) -> LatencyTable:
    """``measured`` with an entry at each of ``sizes`` too: those measured as they are, the others
    on its line (:meth:`LatencyTable.at`: linear between measured sizes, the last slope beyond)."""
    known = dict(zip(measured.sizes, measured.seconds))
    every = tuple(sorted(set(sizes) | set(known)))
    return LatencyTable(every, tuple(known[n] if n in known else measured.at(n) for n in every))


@dataclass
class AffineFit:
    """measured ≈ scale · calibrated + offset, fitted online: exponentially weighted least squares
    (each step weighs REFRESH), shrunk towards a pure scale (offset 0) while the calibrated values
    seen vary little. A load that slows everything shows as a scale; a fixed cost the calibration
    did not see (a longer prefix, the walk) as an offset, which a scale would wrongly multiply."""

    w: float = 0.0  # weighted sums of 1, x, y, x², xy (x: calibrated seconds, y: measured)
    x: float = 0.0
    y: float = 0.0
    xx: float = 0.0
    xy: float = 0.0

    def add(self, x: float, y: float, weight: float) -> None:
        keep = 1.0 - weight
        self.w, self.x, self.y = keep * self.w + weight, keep * self.x + weight * x, keep * self.y + weight * y
        self.xx, self.xy = keep * self.xx + weight * x * x, keep * self.xy + weight * x * y

    def solve(self, spread: float = 0.25) -> tuple[float, float]:
        """(scale, offset). The slope is trusted in proportion var(x) / (var(x) + (spread · mean x)²)."""
        if self.w <= 0 or self.x <= 0:
            return 1.0, 0.0
        mx, my = self.x / self.w, self.y / self.w
        var = max(self.xx / self.w - mx * mx, 0.0)
        ratio = my / mx
        trust = var / (var + (spread * mx) ** 2)
        slope = (self.xy / self.w - mx * my) / var if var > 0 else ratio
        scale = min(max(trust * slope + (1 - trust) * ratio, 0.25 * ratio), 4.0 * ratio)
        return scale, my - scale * mx


@dataclass
class LatencyModel:
    """Measured costs of one step's pieces, in seconds, refreshed from every step."""

    verify: LatencyTable  # T(n): one target forward over the root and n tree nodes
    # the sizes of ``verify`` that were timed; the others are fitted until a step verifies at them
    # (then the step's time replaces the fit). None: every size was timed
    verify_measured: frozenset | None = None
    # fitted sizes a step has verified at once: that first forward warmed them (a compile, kernel trials)
    verify_warmed: set = dataclasses.field(default_factory=set, repr=False, compare=False)
    layer: LatencyTable | None = None  # one drafter.expand_probs() over w nodes; None: not measured yet
    root_seconds: float = 0.0  # drafter.root_probs(): the catch-up at a step's start
    verify_scale: float = 1.0  # online corrections: measured T(n) ≈ verify_scale · table + verify_offset
    verify_offset: float = 0.0
    layer_scale: float = 1.0  # measured c(w) ≈ layer_scale · table
    verify_fit: AffineFit = dataclasses.field(default_factory=AffineFit)
    # running mean of the verified tree sizes per tree setting (sets the width cap); see AutoPolicy
    mean_sizes: dict = dataclasses.field(default_factory=dict)
    overhead: float = 0.0  # the rest of a step (cache surgery, commit, stopping criteria), learnt
    # p̂ -> P(accepted), learnt from the verified trees (AutoPolicy.observe); kept per pair, not on disk
    reliability: ReliabilityMap = dataclasses.field(default_factory=ReliabilityMap, repr=False, compare=False)
    # held by every refresh: concurrent decodes of one pair share this object (opttree.budget.calibration)
    lock: threading.RLock = dataclasses.field(default_factory=threading.RLock, repr=False, compare=False)
    # the calibration as measured or read (calibration.to_json's form), before any step refreshed it: what a
    # sampled call plans from (opttree.budget.calibration.as_calibrated); None: not from a calibration
    calibrated: dict | None = dataclasses.field(default=None, repr=False, compare=False)
    # (verify table, scale, offset, overhead) -> [>= AUTO_MAX_NODES] T(1 …) + overhead; see step_times
    _times: tuple | None = dataclasses.field(default=None, init=False, repr=False, compare=False)

    def verify_time(self, n: int) -> float:
        """T(n): a verification forward of the root and ``n`` nodes, at the size it is padded to."""
        return max(self.verify_table(n) * self.verify_scale + self.verify_offset, 0.0)

    def verify_table(self, n: int) -> float:
        """The calibrated (uncorrected) T(n): the measured time of the size ``n`` nodes are padded to."""
        return self.verify.at(self._padding(n)[0])

    def verify_rows(self, n: int) -> int:
        """The rows a verification of the root and ``n`` nodes is padded to: the size measured cheapest
        among those that hold it (on a CPU a forward of 4 rows may cost less than one of 2)."""
        return self._padding(n)[1]

    def _padding(self, n: int) -> tuple[float, int]:
        """(the node count whose time prices ``n`` nodes, the rows to pad to): the measured size, at or
        above ``n``'s padded size, with the least time (the smallest on ties); beyond the table, its own
        padded size."""
        base = padded_nodes(n)
        xs, ys = self.verify.sizes, self.verify.seconds
        later = [(y, x) for x, y in zip(xs, ys) if x >= base]
        if not later or base > xs[-1]:
            return base, base + 1
        _, best = min(later)
        return best, padded_nodes(best) + 1

    def step_times(self, m: int) -> torch.Tensor:
        """[m] float64: T(1) … T(m), each plus the rest of a step (overhead). A slice of a cached
        tensor, rebuilt only when the numbers it is made of change (a refresh, or a test setting them)."""
        key = (self.verify_scale, self.verify_offset, self.overhead)
        cached = self._times  # one read: a concurrent rebuild replaces it whole
        if cached is None or cached[0] is not self.verify or cached[1] != key or len(cached[2]) < m:
            n = max(m, AUTO_MAX_NODES)
            times = torch.tensor([self.verify_time(k) + self.overhead for k in range(1, n + 1)], dtype=torch.float64)
            cached = self._times = (self.verify, key, times)
        return cached[2][:m]

    def layer_time(self, width: int) -> float:
        """c(w): one draft forward expanding ``width`` nodes (0 while unmeasured)."""
        return 0.0 if self.layer is None else self.layer.at(width) * self.layer_scale

    def observe(self, step) -> None:
        """Refresh from one finished step (a StepStats)."""
        with self.lock:
            self._observe(step)

    def measured_verify(self) -> LatencyTable:
        """The verification table's timed sizes only (what a calibration file keeps)."""
        if self.verify_measured is None:
            return self.verify
        pairs = [(n, t) for n, t in zip(self.verify.sizes, self.verify.seconds) if n in self.verify_measured]
        return LatencyTable(tuple(n for n, _ in pairs), tuple(t for _, t in pairs))

    def _measure_fitted(self, step) -> bool:
        """A step verified at a fitted size: from the second such step on (the first warmed the size:
        a compile, kernel trials), its time, taken back through the online correction, becomes that
        size's entry (measured from now on). Whether the step was at a fitted size."""
        priced = self._padding(step.tree_size)[0]
        if self.verify_measured is None or priced in self.verify_measured or step.verify_seconds <= 0:
            return False
        if priced not in self.verify_warmed:
            self.verify_warmed.add(priced)
            return True
        seconds = max((step.verify_seconds - self.verify_offset) / self.verify_scale, 0.0) or step.verify_seconds
        sizes = self.verify.sizes
        self.verify = LatencyTable(sizes, tuple(seconds if n == priced else t for n, t in zip(sizes, self.verify.seconds)))
        self.verify_measured = self.verify_measured | {priced}
        return True

    def _observe(self, step) -> None:
        calibrated = self.verify_table(step.tree_size)
        if self._measure_fitted(step):
            pass  # a new point of the table, not evidence on the correction
        elif step.verify_seconds > 0 and calibrated > 0:
            if self.verify_fit.w == 0:  # the calibration itself is the prior: weight 1, at this size
                self.verify_fit.add(calibrated, calibrated, 1.0)
            self.verify_fit.add(calibrated, calibrated * _clip(step.verify_seconds / calibrated), REFRESH)
            self.verify_scale, self.verify_offset = self.verify_fit.solve()
        for layer in step.layers:
            if layer.seconds <= 0:
                continue
            if self.layer is None:  # an unmeasured drafter: a constant cost per layer, from now on refreshed
                self.layer = LatencyTable((layer.width,), (layer.seconds,))
                continue
            predicted = self.layer.at(layer.width)
            if predicted > 0:
                self.layer_scale += REFRESH * (_clip(layer.seconds / predicted) - self.layer_scale)
        if step.root_seconds > 0:
            self.root_seconds += REFRESH * (step.root_seconds - self.root_seconds)


def _clip(ratio: float) -> float:
    return min(max(ratio, 0.25), 4.0)  # one outlier step moves a scale at most this far


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
    groups = [torch.sort(ratios[parents[last] == p], descending=True).values for p in torch.unique(parents[last])]
    width = max(len(g) for g in groups)
    profile = torch.stack([torch.nn.functional.pad(g, (0, width - len(g))) for g in groups]).mean(0)  # [width]
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
        # the recent tree size, shared by later calls with the same settings (not by other settings)
        self.setting = f"{config.strategy}/{config.nodes}/{config.threshold}/{config.max_depth}"
        self.mean_size = latency.mean_sizes.get(self.setting, START_SIZE)

    def spent(self) -> float:
        """Seconds of drafting in this step so far: since the plan (timed), or as the model prices it."""
        return self.clock() - self._start if self.timed else self._priced

    def verify_rows(self, nodes: int) -> int:
        """The rows a tree of ``nodes`` nodes is verified at: the measured cheapest size that holds it."""
        return self.latency.verify_rows(nodes)

    def plan(self) -> StepPlan:
        self._start = self.clock()
        self._priced = self.latency.root_seconds
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
        return best_size(path_probs, self.latency, self.spent(), self.max_nodes)

    def observe(self, step) -> None:
        with self.latency.lock:
            if self.timed:
                rest = self.spent() - step.draft_seconds - step.verify_seconds  # since plan(): the whole step
                self.latency.overhead += REFRESH * (max(rest, 0.0) - self.latency.overhead)
                self.latency.observe(step)
            if step.tree is not None and step.accepted_nodes is not None and len(step.tree) > 0:
                accepted = torch.zeros(len(step.tree), dtype=torch.bool)
                accepted[step.accepted_nodes] = True
                self.latency.reliability.update(step.tree.path_probs, accepted)
            if step.tree_size > 0:
                self.mean_size += SIZE_REFRESH * (step.tree_size - self.mean_size)
                self.latency.mean_sizes[self.setting] = self.mean_size


__all__ = ["AUTO_MAX_NODES", "AffineFit", "AutoPolicy", "LatencyModel", "LatencyTable", "MIN_WIDTH", "REFRESH",
           "complete_table",
           "SIZE_REFRESH", "START_SIZE", "WIDTH_PER_NODE", "best_choice", "best_size", "expected_speed", "layer_pays",
           "layer_width", "next_layer_guess"]
