"""Timing candidates against each other on a shared machine: they take turns.

One round calls each candidate once, in order, timing each call; a load that comes and goes then
slows every candidate alike. The draft-dtype probe (dtype_probe.time_rounds: medians of a fixed
number of rounds) and the training-precision probe (precision.time_alternating: totals until each
candidate has run long enough) differ only in when they stop and what they keep.
"""

from __future__ import annotations

import time
from typing import Callable


def take_turns(fns: dict[str, Callable[[], object]], go_on: Callable[[int, dict[str, list[float]]], bool],
               clock: Callable[[], float] = time.perf_counter) -> dict[str, list[float]]:
    """``{name: [seconds of each call]}``: rounds of one call of each in turn, at least one, while
    ``go_on(rounds done, times so far)`` says so (asked after each round)."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    rounds = 0
    while True:
        for name, fn in fns.items():
            start = clock()
            fn()
            times[name].append(clock() - start)
        rounds += 1
        if not go_on(rounds, times):
            return times


__all__ = ["take_turns"]
