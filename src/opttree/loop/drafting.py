"""The loop's step 1: every row's tree, drafted in lockstep (one drafter call per layer for all rows
still growing), and what drafting it cost."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..drafters.base import DrafterRows
from ..tree.builder import BuiltTree, Growth
from ..tree.draft_tree import DraftTree
from ..tree.plan import StepPlan
from ..tree.strategies import grow_tree
from ..verify.acceptance import Acceptance
from .clock import DraftClock
from .lockstep import run_in_lockstep
from .rows import Row, StepOutcome
from .settings import DecodeSettings


@dataclass
class Drafted:
    """Step 1's trees, one per row still decoding, and what drafting them cost."""

    builts: list[BuiltTree]
    trees: list[DraftTree]  # each on its row's device
    drafted: bool  # some row drafted (the drafter has a step to commit)
    clock: DraftClock  # the drafter's calls, timed per row
    forwards: int  # draft forwards of the step
    seconds: float  # the drafting phase

    def outcome(self, acceptances: list[Acceptance], verify_seconds: float) -> StepOutcome:
        """The step as the rows' bookkeeping reads it (step 5)."""
        return StepOutcome(self.builts, self.trees, acceptances, self.forwards, self.seconds, verify_seconds,
                           self.clock.root_seconds, self.clock.layers)


def draft_rows(rows: list[Row], drafters: DrafterRows, settings: DecodeSettings, sync: bool) -> Drafted:
    """Every row's tree, not deeper than its tokens still allowed and the context. sync: time the
    drafter's calls on the device (:class:`DraftClock`; what ``"auto"`` learns from)."""
    start, forwards = time.perf_counter(), drafters.forwards
    caps = [min(row.limit - len(row.sequence) - 1, settings.context_length - len(row.tokens)) for row in rows]
    plans = [row.policy.plan() for row in rows]  # each row's nodes, threshold, layer width
    clock = DraftClock(drafters, len(rows), sync=sync)
    builts = draft_trees(clock, rows, caps, plans, settings)
    drafted = builts is not None
    builts = builts or [empty_tree(row.sequence.device) for row in rows]
    trees = [built.tree.to(row.sequence.device) for built, row in zip(builts, rows)]
    return Drafted(builts, trees, drafted, clock, drafters.forwards - forwards, time.perf_counter() - start)


def empty_tree(device: torch.device) -> BuiltTree:
    return BuiltTree(DraftTree.empty(device), torch.empty(0, dtype=torch.long), depth_bound=0, expected_length=0.0)


def no_tree(device: torch.device) -> Growth:
    """The builder of a row with no room left to draft: the empty tree, without asking the drafter."""
    yield from ()
    return empty_tree(device)


def draft_trees(clock: DraftClock, rows: list[Row], caps: list[int], plans: list[StepPlan],
                settings: DecodeSettings) -> list[BuiltTree] | None:
    """Every row's tree (not deeper than its cap): one catch-up call, then one drafter call per
    layer for all rows still growing (their builders run in lockstep). None: no row may draft."""
    if all(cap < 1 for cap in caps):
        return None
    root_probs = clock.root_probs([row.tokens for row in rows])
    builders = [grow_tree(root_probs[b], settings.config, caps[b], generator=settings.generator, plan=plans[b])
                if caps[b] >= 1 else no_tree(rows[b].sequence.device) for b in range(len(rows))]
    return run_in_lockstep(builders, clock.expand)


__all__ = ["Drafted", "draft_rows", "draft_trees", "empty_tree", "no_tree"]
