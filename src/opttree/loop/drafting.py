"""The loop's step 1: every row's tree, drafted in lockstep (one drafter call per layer for all rows
still growing), and what drafting it cost: the drafter's calls timed per row (:class:`DraftClock`);
:class:`Drafted` is the step's output."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..drafters.base import DrafterRows
from ..tree.builder import BuiltTree
from ..tree.draft_tree import DraftTree
from ..tree.plan import StepPlan
from ..tree.strategies import grow_tree, no_tree
from ..verify.acceptance import Acceptance
from .lockstep import run_in_lockstep
from .rows import Row
from .settings import DecodeSettings
from .stats import LayerTiming, StepStats


@dataclass(frozen=True)
class Drafted:
    """Step 1's trees, one per row still decoding, and what drafting them cost (the drafting is shared
    by the rows); step 5 records them with what each row's walk accepted (:meth:`row_stats`)."""

    builts: list[BuiltTree]
    trees: list[DraftTree]  # each on its row's device
    drafted: bool  # some row drafted (the drafter has a step to commit)
    forwards: int  # draft forwards of the step, every row's
    seconds: float  # the drafting phase
    root_seconds: list[float]  # each row's share of the drafter's catch-up call
    layers: list[list[LayerTiming]]  # each row's expand calls

    def row_stats(self, b: int, acceptance: Acceptance, emitted: int, verify_seconds: float) -> StepStats:
        """Row b's figures: its tree, what it accepted and emitted, its share (1/R) of the shared phases
        (``verify_seconds``: the verification forward and the walks)."""
        built, tree, share = self.builts[b], self.trees[b], 1.0 / len(self.trees)
        depth = acceptance.tree_depth if acceptance.tree_depth is not None else tree_depth(tree)
        expected = built.expected_length if built.expected_length is not None else tree.expected_length
        return StepStats(tree_size=len(tree), tree_depth=depth, expected_length=expected,
                         accepted=acceptance.accepted, emitted=emitted, draft_forwards=self.forwards,
                         draft_seconds=self.seconds * share, verify_seconds=verify_seconds * share,
                         tree=tree, accepted_nodes=list(acceptance.nodes), root_seconds=self.root_seconds[b],
                         layers=self.layers[b])


def tree_depth(tree: DraftTree) -> int:
    """The deepest node's depth (a host read)."""
    return int(tree.depths().max()) if len(tree) else 0


def draft_rows(rows: list[Row], drafters: DrafterRows, settings: DecodeSettings, sync: bool) -> Drafted:
    """Every row's tree, not deeper than its tokens still allowed and the context. sync: time the
    drafter's calls on the device (:class:`DraftClock`; what ``"auto"`` learns from)."""
    start, forwards = time.perf_counter(), drafters.forwards
    caps = [min(row.limit - len(row.sequence) - 1, settings.context_length - len(row.tokens)) for row in rows]
    plans = [row.policy.plan() for row in rows]  # each row's nodes, threshold, layer width
    clock = DraftClock(drafters, len(rows), sync=sync)
    builts = draft_trees(clock, rows, caps, plans, settings)
    trees = [built.tree.to(row.sequence.device) for built, row in zip(builts, rows)]
    drafted = any(cap >= 1 for cap in caps)
    return Drafted(builts, trees, drafted, drafters.forwards - forwards, time.perf_counter() - start,
                   clock.root_seconds, clock.layers)


def draft_trees(clock: DraftClock, rows: list[Row], caps: list[int], plans: list[StepPlan],
                settings: DecodeSettings) -> list[BuiltTree]:
    """Every row's tree (not deeper than its cap; none where it is below 1): one catch-up call where
    some row may draft, then one drafter call per layer for all rows still growing (their builders
    run in lockstep)."""
    root_probs = clock.root_probs([row.tokens for row in rows]) if any(cap >= 1 for cap in caps) else None
    builders = [grow_tree(root_probs[b], settings.config, caps[b], generator=settings.generator, plan=plans[b])
                if caps[b] >= 1 else no_tree(rows[b].sequence.device) for b in range(len(rows))]
    return run_in_lockstep(builders, clock.expand)


def _sync(out) -> None:
    """Wait for the device before reading the clock (CUDA runs asynchronously)."""
    if isinstance(out, torch.Tensor) and out.is_cuda:
        torch.cuda.synchronize(out.device)


class DraftClock:
    """Wraps a :class:`DrafterRows`' ``root_probs`` and ``expand`` for one step and records their
    times per row. A call that serves several rows (one shared draft forward) counts for each of
    them as an equal share of its time.

    sync: wait for the device after each call, so the times are the device's (what ``"auto"``
    budgets learn from). Off, a CUDA drafter's calls are only launched when the clock reads, and
    the step is never stalled to time it."""

    def __init__(self, drafters: DrafterRows, rows: int, sync: bool = True):
        self.drafters = drafters
        self.sync = sync
        self.root_seconds = [0.0] * rows
        self.layers: list[list[LayerTiming]] = [[] for _ in range(rows)]

    def root_probs(self, sequences: list[torch.Tensor]) -> list[torch.Tensor]:
        """sequences: each row's [T_b] long -> each row's [vocab], as ``DrafterRows.root_probs``."""
        start = time.perf_counter()
        out = self.drafters.root_probs(sequences)
        if self.sync:
            _sync(out[0])
        share = (time.perf_counter() - start) / len(sequences)
        self.root_seconds = [s + share for s in self.root_seconds]
        return out

    def expand(self, requests: list) -> list:
        """requests: per row ``(pool, frontier)`` or None -> per row a DraftProbs or None."""
        start = time.perf_counter()
        out = self.drafters.expand(requests)
        if self.sync:
            _sync(next(o for o in out if o is not None).values)
        active = [b for b, r in enumerate(requests) if r is not None]
        share = (time.perf_counter() - start) / len(active)
        for b in active:
            self.layers[b].append(LayerTiming(width=len(requests[b][1]), seconds=share))
        return out


__all__ = ["DraftClock", "Drafted", "draft_rows", "draft_trees", "tree_depth"]
