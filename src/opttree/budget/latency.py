"""The latency model of one (target, drafter) pair on this machine: what ``"auto"`` plans with
(:mod:`opttree.budget.policy`).

:class:`LatencyModel` holds T(n) (one verification forward over the root and n nodes), c(w) (one
draft layer over w nodes), the rest of a step and the reliability map, measured by
:mod:`opttree.budget.calibration` and refreshed from every step (T(n) as scale × table + offset, by
exponentially weighted least squares; c(w) by a scale; the rest of a step by an average; the map
from the verified tree and its accepted nodes). Its refresh runs under the model's own lock:
decodes in several threads share one model per pair. T(1 … m) + the rest of a step is a slice of
a tensor cached until those numbers change.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass

import torch

from ..tree.sizes import padded_nodes
from .reliability import ReliabilityMap

AUTO_MAX_NODES = 63  # the largest tree "auto" will ever verify (the pool budget): with the root, 64 rows
REFRESH = 0.1  # weight of each new step in the online latency averages


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
    # the calibration as measured or read, before any step refreshed it (its tables, nothing learnt): what a
    # sampled call plans from (opttree.budget.policy.as_calibrated); None: not from a calibration
    calibrated: LatencyModel | None = dataclasses.field(default=None, repr=False, compare=False)
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


__all__ = ["AUTO_MAX_NODES", "AffineFit", "LatencyModel", "LatencyTable", "REFRESH", "complete_table"]
