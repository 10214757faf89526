"""How far to trust the draft's p̂: an online reliability map (``nodes="auto"``).

p̂ (``DraftTree.path_probs``) is the draft's own probability that the path root → node is
accepted. ``"auto"`` sums it (E_m, :mod:`opttree.budget.policy`) to judge how many tokens a tree of m
nodes is worth, but drafts are rarely calibrated: a small draft is typically over-confident (most
of all at depth 1), and E_m then pays for nodes the target rejects. A :class:`ReliabilityMap`
learns, from every verified tree, how often nodes of a given p̂ were really accepted (on the
accepted path), and :meth:`ReliabilityMap.apply` maps p̂ to that rate.

*Bins* over p̂ (:data:`EDGES`): a log scale from 1e-4 up to 0.1, then finer linear steps up to
the top bin [0.97, 1], where a draft's over-confidence is concentrated and where most of E_m
comes from. Each bin holds exponentially weighted sums over the verified nodes that fell in it
(nodes, accepted nodes, Σp̂; each step's evidence decays by :data:`DECAY` per later step, so
the map follows a change of topic), plus a prior of :data:`PRIOR_NODES` pseudo-nodes at the
bin's centre accepted at exactly that rate ("p̂ is right"): a fresh map, and any bin without
evidence, is the identity, and a bin moves as evidence arrives.

*The curve*: one point per bin, (mean p̂, acceptance rate), made non-decreasing by
pool-adjacent-violators (weighted by the bin's nodes); :meth:`~ReliabilityMap.apply` interpolates
linearly between the points and scales p̂ by the first (last) point's rate / p̂ below (above)
them. It is MONOTONE non-decreasing in p̂: a child's p̂ never exceeds its parent's, so neither
does its calibrated value, and the top-m nodes by p̂ (ties in p̂'s order) are also the top-m by
calibrated value, a valid tree. The policy therefore keeps choosing nodes by p̂ and only sums
calibrated values.

Pure: no clock, no lock (the caller serialises :meth:`~ReliabilityMap.update`; :meth:`apply`
reads one immutable curve and may run beside it). Host work: a few small tensor ops.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

EDGES = (1e-4, 3e-4, 1e-3, 3e-3, 0.01, 0.03, 0.1, 0.2, 0.35, 0.5, 0.65, 0.8, 0.9, 0.97)  # bin b: [EDGES[b-1], EDGES[b])
BINS = len(EDGES) + 1  # below 1e-4 … [0.97, 1]
PRIOR_NODES = 8.0  # pseudo-nodes per bin saying "p̂ is right"
DECAY = 0.005  # each step's evidence decays by this much per later step (~200 steps' memory)


def _centres() -> tuple[float, ...]:
    """Each bin's prior p̂: the geometric middle of its edges (half the first edge for the first)."""
    lows, highs = (0.0,) + EDGES, EDGES + (1.0,)
    return tuple(hi / 2 if lo == 0 else math.sqrt(lo * hi) for lo, hi in zip(lows, highs))


CENTRES = _centres()


def pool_adjacent_violators(ys: list[float], weights: list[float]) -> list[float]:
    """The non-decreasing sequence nearest ``ys`` in weighted least squares (len(ys) values)."""
    blocks: list[list] = []  # [value, weight, members]
    for y, w in zip(ys, weights):
        blocks.append([y, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            value, weight, members = blocks.pop()
            last = blocks[-1]
            last[0] = (last[0] * last[1] + value * weight) / (last[1] + weight)
            last[1] += weight
            last[2] += members
    return [value for value, _, members in blocks for _ in range(members)]


@dataclass(frozen=True)
class Curve:
    """The fitted map: points (x, y) and the line of each segment between and beyond them."""

    x: torch.Tensor  # [BINS] float64: each bin's mean p̂, ascending
    y: torch.Tensor  # [BINS] float64: its acceptance rate, non-decreasing
    slope: torch.Tensor  # [BINS + 1] float64: segment i (searchsorted(x, p̂, right=True)) is slope[i] · p̂ + offset[i]
    offset: torch.Tensor  # [BINS + 1] float64


class ReliabilityMap:
    """p̂ → the probability that a node of that p̂ is accepted, learnt online (see the module)."""

    def __init__(self, decay: float = DECAY, prior: float = PRIOR_NODES):
        self.decay, self.prior = decay, prior
        self.edges = torch.tensor(EDGES, dtype=torch.float64)  # [BINS - 1]
        self.centres = torch.tensor(CENTRES, dtype=torch.float64)  # [BINS]
        self.nodes = torch.zeros(BINS, dtype=torch.float64)  # [BINS] weighted count of verified nodes
        self.hits = torch.zeros(BINS, dtype=torch.float64)  # [BINS] … of those accepted
        self.mass = torch.zeros(BINS, dtype=torch.float64)  # [BINS] … their Σp̂
        self.steps = 0  # updates with at least one node
        self.curve: Curve | None = None  # None: the identity

    def update(self, path_probs: torch.Tensor, accepted: torch.Tensor) -> None:
        """One verified tree. path_probs: [n] float, its nodes' p̂; accepted: [n] bool, on the
        accepted path. One host read; the curve is refitted (a loop over BINS floats)."""
        if path_probs.shape[0] == 0:
            return
        p = path_probs.detach().double().cpu()  # [n]
        hit = accepted.detach().cpu().double()  # [n]
        b = torch.bucketize(p, self.edges, right=True)  # [n] bin ids in [0, BINS)
        keep = 1.0 - self.decay
        self.nodes = keep * self.nodes + torch.bincount(b, minlength=BINS).double()
        self.hits = keep * self.hits + torch.bincount(b, weights=hit, minlength=BINS)
        self.mass = keep * self.mass + torch.bincount(b, weights=p, minlength=BINS)
        self.steps += 1
        self.curve = self._fit()

    def _fit(self) -> Curve:
        weight = self.nodes + self.prior  # [BINS]
        x = (self.mass + self.prior * self.centres) / weight  # [BINS] mean p̂, strictly ascending
        rate = (self.hits + self.prior * self.centres) / weight  # [BINS] acceptance rate
        y = torch.tensor(pool_adjacent_violators(rate.tolist(), weight.tolist()), dtype=torch.float64)  # [BINS]
        # segment i (searchsorted's index) is value = slope[i] · p̂ + offset[i]: 0 below x[0] and BINS from x[-1] on
        # (p̂ scaled by the first / last point's rate / p̂), i between x[i - 1] and x[i]
        inner = (y[1:] - y[:-1]) / (x[1:] - x[:-1])  # [BINS - 1]
        slope = torch.cat([y[:1] / x[:1], inner, y[-1:] / x[-1:]])  # [BINS + 1]
        offset = torch.cat([y.new_zeros(1), y[:-1] - inner * x[:-1], y.new_zeros(1)])  # [BINS + 1]
        return Curve(x, y, slope, offset)

    def apply(self, path_probs: torch.Tensor) -> torch.Tensor:
        """path_probs: [k] float, any order -> [k], same dtype and device: each node's calibrated
        probability of being accepted, non-decreasing in p̂ (p̂ itself until the first update).
        A few ops whatever k: it runs several times before every draft forward of an "auto" step."""
        curve = self.curve  # one read: update() replaces it whole
        if curve is None:
            return path_probs
        p = path_probs.detach().double().cpu()  # [k]
        i = torch.searchsorted(curve.x, p, right=True)  # [k] segment, 0 … BINS
        out = torch.addcmul(curve.offset[i], curve.slope[i], p).clamp_(0.0, 1.0)
        return out.to(dtype=path_probs.dtype, device=path_probs.device)

    def at(self, p: float) -> float:
        """The calibrated value of one p̂ (for reports and tests)."""
        return float(self.apply(torch.tensor([p], dtype=torch.float64))[0])


__all__ = ["BINS", "CENTRES", "Curve", "DECAY", "EDGES", "PRIOR_NODES", "ReliabilityMap", "pool_adjacent_violators"]
