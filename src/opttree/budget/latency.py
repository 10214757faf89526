"""The latency model of one (target, drafter) pair on this machine: what ``"auto"`` plans with
(:mod:`opttree.budget.policy`).

:class:`LatencyModel` holds T(n) (one verification forward over the root and n nodes), c(w) (one
draft layer over w nodes), the rest of a step and the reliability map, measured by
:mod:`opttree.budget.calibration` and refreshed from every step (T(n) as scale × table + offset, by
exponentially weighted least squares; c(w) by a scale; the rest of a step by an average; the map
from the verified tree and its accepted nodes). A size decoding has verified at often enough is priced
by decoding's own clock there (:class:`SeenSize`), not by the corrected table: the calibration's few-token
context and its fastest trial can misjudge how much a larger tree costs beside the smallest (the Xeon AMX in
float32: 15 nodes 1.5× the root at calibration, 1.75× in decoding), and one correction for every size cannot
undo a wrong ratio; smaller sizes are probed so that the clock prices them too (:meth:`LatencyModel.probe`).
Its refresh runs under the model's own lock: decodes in several threads share one model per pair.
T(1 … m) + the rest of a step is a slice of a tensor cached until those numbers change.
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
SEEN_AFTER = 2  # steps counted at a size (its first step warms it, uncounted) before decoding's clock prices it
PROBE_EVERY = 8  # while a size below the chosen one is not priced by decoding's clock, every this many steps ...
PROBE_AGAIN = 64  # ... else every this many, a step verifies at that smaller size instead (LatencyModel.probe)


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
class SeenSize:
    """Decoding's own clock at one verification size: the running mean of its steps' seconds, the first step
    (which warms the size: kernel trials, a compile) not counted, each later one clipped to 0.25-4× the mean."""

    steps: int = 0  # steps observed at this size, the warming one included
    seconds: float = 0.0

    @property
    def counted(self) -> int:
        return max(self.steps - 1, 0)

    def add(self, seconds: float) -> None:
        self.steps += 1
        if self.counted == 0:
            return
        if self.counted > 1:
            seconds = self.seconds * _clip(seconds / self.seconds) if self.seconds > 0 else seconds
        self.seconds += max(REFRESH, 1.0 / self.counted) * (seconds - self.seconds)


@dataclass
class LatencyModel:
    """Measured costs of one step's pieces, in seconds, refreshed from every step."""

    verify: LatencyTable  # T(n): one target forward over the root and n tree nodes
    # the sizes of ``verify`` that were timed; the others are fitted until a step verifies at them
    # (then the step's time replaces the fit). None: every size was timed
    verify_measured: frozenset | None = None
    # verify only at the sizes calibration timed (``verify_measured``): a compiled verification forward, where
    # any other size would compile a graph while decoding (tens of seconds on a CPU); a tree is padded to the
    # nearest of them, and a tree larger than the largest is priced out (T = inf)
    measured_only: bool = False
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
    # decoding's clock per priced size (SeenSize); from SEEN_AFTER counted steps it prices that size
    seen: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)
    steps: int = 0  # timed steps observed: the clock of the probes (LatencyModel.probe)
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
        """T(n): a verification forward of the root and ``n`` nodes, at the size it is padded to (inf where
        :attr:`measured_only` leaves no size that holds it)."""
        priced = self._padding(n)[0]
        return self.size_time(priced) if self.may_verify_at(priced) else float("inf")

    def may_verify_at(self, size: int) -> bool:
        """Whether a step may verify at table size ``size``: any size, or with :attr:`measured_only` one that
        calibration timed."""
        return not self.measured_only or self.verify_measured is None or size in self.verify_measured

    def size_time(self, size: float) -> float:
        """The seconds of a verification at table size ``size``: decoding's clock there once it has counted
        SEEN_AFTER steps, else the calibrated time through the online correction."""
        if self.priced_by_clock(size):
            return self.seen[size].seconds
        return max(self.verify.at(size) * self.verify_scale + self.verify_offset, 0.0)

    def priced_by_clock(self, size: int) -> bool:
        """Whether decoding's clock prices table size ``size`` (SEEN_AFTER counted steps there)."""
        seen = self.seen.get(size)
        return seen is not None and seen.counted >= SEEN_AFTER

    def probe(self, nodes: int) -> int:
        """The nodes to verify this step when the policy chose ``nodes``: ``nodes``, or on a probe step a
        smaller table size that decoding's clock does not price yet (the fewest counted steps, the nearest
        below on ties), every PROBE_EVERY timed steps while one is left; then the nearest size below every
        PROBE_AGAIN steps, to follow a drift. A probe is verified at its own size (the policy pads it there,
        :meth:`~opttree.budget.policy.AutoPolicy.verify_rows`), even where the table prices a larger size
        cheaper: a noisy calibration that made 4 rows dearer than 16 is corrected by decoding's clock, not kept
        for good. A smaller tree keeps the most probable nodes: lossless as any cut."""
        if nodes <= 0 or self.steps == 0:
            return nodes
        chosen = self._padding(nodes)[0]
        below = [x for x in self.verify.sizes if x < chosen and self.may_verify_at(x)]
        if not below:
            return nodes
        open_ = [x for x in below if not self.priced_by_clock(x)]  # not priced by the clock yet
        if open_ and self.steps % PROBE_EVERY == 0:
            return min(open_, key=lambda x: (self.seen[x].counted if x in self.seen else 0, -x))
        if not open_ and self.steps % PROBE_AGAIN == 0:
            return below[-1]
        return nodes

    def verify_table(self, n: int) -> float:
        """The calibrated (uncorrected) T(n): the measured time of the size ``n`` nodes are padded to."""
        return self.verify.at(self._padding(n)[0])

    def verify_rows(self, n: int) -> int:
        """The rows a verification of the root and ``n`` nodes is padded to: the size measured cheapest
        among those that hold it (on a CPU a forward of 4 rows may cost less than one of 2)."""
        return self._padding(n)[1]

    def _padding(self, n: int) -> tuple[float, int]:
        """(the node count whose time prices ``n`` nodes, the rows to pad to): the measured size, at or
        above ``n``'s padded size, with the least time (the smallest on ties), among those a step may verify
        at (:meth:`may_verify_at`); beyond them, its own padded size."""
        base = padded_nodes(n)
        xs = [x for x in self.verify.sizes if self.may_verify_at(x)]
        later = [(self.size_time(x), x) for x in xs if x >= base]
        if not later or base > xs[-1]:
            return base, base + 1
        _, best = min(later)
        return best, padded_nodes(best) + 1

    def step_times(self, m: int) -> torch.Tensor:
        """[m] float64: T(1) … T(m), each plus the rest of a step (overhead). A slice of a cached
        tensor, rebuilt only when the numbers it is made of change (a refresh, or a test setting them): after
        every timed step, so a rebuild prices each padded size once, not each of the m sizes."""
        key = (self.verify_scale, self.verify_offset, self.overhead, self.steps)
        cached = self._times  # one read: a concurrent rebuild replaces it whole
        if cached is None or cached[0] is not self.verify or cached[1] != key or len(cached[2]) < m:
            n = max(m, AUTO_MAX_NODES)
            priced: dict[int, float] = {}  # padded size -> T + overhead: T(k) depends on k only through it
            for k in range(1, n + 1):
                size = padded_nodes(k)
                if size not in priced:
                    priced[size] = self.verify_time(k) + self.overhead
            times = torch.tensor([priced[padded_nodes(k)] for k in range(1, n + 1)], dtype=torch.float64)
            cached = self._times = (self.verify, key, times)
        return cached[2][:m]

    def layer_time(self, width: int) -> float:
        """c(w): one draft forward expanding ``width`` nodes (0 while unmeasured)."""
        return 0.0 if self.layer is None else self.layer.at(width) * self.layer_scale

    def observe(self, step, size: int | None = None) -> None:
        """Refresh from one finished step (a StepStats) verified at table size ``size`` (None: the size its
        tree is padded to, :meth:`verify_rows`)."""
        with self.lock:
            self._observe(step, size)

    def _measure_fitted(self, priced: float, verify_seconds: float) -> bool:
        """A step verified at a fitted size ``priced``: from the second such step on (the first warmed the size:
        a compile, kernel trials), its time, taken back through the online correction, becomes that
        size's entry (measured from now on). Whether the step was at a fitted size."""
        if self.verify_measured is None or priced in self.verify_measured or verify_seconds <= 0:
            return False
        if priced not in self.verify_warmed:
            self.verify_warmed.add(priced)
            return True
        seconds = max((verify_seconds - self.verify_offset) / self.verify_scale, 0.0) or verify_seconds
        sizes = self.verify.sizes
        self.verify = LatencyTable(sizes, tuple(seconds if n == priced else t for n, t in zip(sizes, self.verify.seconds)))
        self.verify_measured = self.verify_measured | {priced}
        return True

    def _observe(self, step, size: int | None) -> None:
        priced = self._padding(step.tree_size)[0] if size is None else size  # the size the step verified at
        calibrated = self.verify.at(priced)
        if step.verify_seconds > 0:
            self.steps += 1
            self.seen.setdefault(priced, SeenSize()).add(step.verify_seconds)
        if self._measure_fitted(priced, step.verify_seconds):
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


__all__ = ["AUTO_MAX_NODES", "AffineFit", "LatencyModel", "LatencyTable", "PROBE_AGAIN", "PROBE_EVERY", "REFRESH",
           "SEEN_AFTER", "SeenSize", "complete_table"]
