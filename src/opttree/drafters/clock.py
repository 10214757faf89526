"""Time one step's drafter calls through the Drafter protocol (any drafter, model or not)."""

from __future__ import annotations

import time

import torch

from ..stats import LayerTiming


def _sync(out) -> None:
    """Wait for the device before reading the clock (CUDA runs asynchronously)."""
    if isinstance(out, torch.Tensor) and out.is_cuda:
        torch.cuda.synchronize(out.device)


class DraftClock:
    """Wraps a drafter's ``root_probs`` and ``expand`` for one step and records their times.

    sync: wait for the device after each call, so the times are the device's (what ``"auto"``
    budgets learn from). Off, a CUDA drafter's calls are only launched when the clock reads, and
    the step is never stalled to time it."""

    def __init__(self, drafter, sync: bool = True):
        self.drafter = drafter
        self.sync = sync
        self.root_seconds = 0.0
        self.layers: list[LayerTiming] = []

    def root_probs(self, sequence: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        """sequence: [T] long -> [vocab] float, as ``drafter.root_probs``."""
        start = time.perf_counter()
        out = self.drafter.root_probs(sequence, *args, **kwargs)
        if self.sync:
            _sync(out)
        self.root_seconds += time.perf_counter() - start
        return out

    def expand(self, pool, frontier: torch.Tensor) -> torch.Tensor:
        """frontier: [k] long pool ids -> [k, vocab] float, as ``drafter.expand``."""
        start = time.perf_counter()
        out = self.drafter.expand(pool, frontier)
        if self.sync:
            _sync(out)
        self.layers.append(LayerTiming(width=len(frontier), seconds=time.perf_counter() - start))
        return out
