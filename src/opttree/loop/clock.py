"""Time one step's drafter calls, per batch row, whatever the drafter."""

from __future__ import annotations

import time

import torch

from ..drafters.base import DrafterRows
from .stats import LayerTiming


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
