"""A fake clock for the tests of anything timed (the kernel choice, the precision and dtype probes):
it stands still until the test's fake work advances it, so no result depends on this machine's speed
or load (DEVELOPERS.md: no test may depend on wall-clock time)."""

from __future__ import annotations


class FakeClock:
    """Seconds that move only when ``advance`` is called (or ``now`` is set)."""

    def __init__(self, now: float = 0.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


HANG_GUARD = 600.0  # seconds a test's thread may wait for another: a guard against a hang, never a measure of speed
