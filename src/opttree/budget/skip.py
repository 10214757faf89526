"""Whether a step drafts at all (:class:`SkipRule`): where drafting has not paid lately, steps verify the
root alone, as plain decoding does, and drafting is tried again after 1, 2, 4 … ``MAX_BACKOFF`` undrafted
steps.

``"auto"`` chooses each tree after drafting it (:func:`~opttree.budget.policy.best_choice`), the drafting
time D sunk; this rule is the other half, whether to pay D at all. A drafted step's *worth* is its tree's
expected speed, D included, over an undrafted step's, both priced by the pair's one latency model:
(E_m + 1) / (T(m) + D + overhead) × (T(0) + overhead) (:func:`~opttree.budget.policy.drafting_worth`).
Single steps vary with the text (a hard stretch, then an easy one), so the rule reads the running mean of
the worth over the recent drafted steps (weight ``WEIGHT`` each, after ``SETTLE`` of them): below 1, steps
stop drafting; a retried step worth 1 or more starts drafting again (and restarts the mean there), one
worth less doubles the next undrafted run. The rule reads the model's prices, not step times, so it is
as steady as the latency model (whose T(n) decoding's clock prices: :class:`~opttree.budget.latency.SeenSize`).
"""

from __future__ import annotations

from dataclasses import dataclass

WEIGHT = 0.1  # each drafted step's weight in the running mean of the worth
SETTLE = 8  # drafted steps of a pair before the mean decides anything
MAX_BACKOFF = 16  # the longest run of undrafted steps before drafting is tried again


@dataclass
class SkipRule:
    """Shared by a pair's calls (on its :class:`~opttree.budget.latency.LatencyModel`)."""

    worth: float = 1.0  # running mean of the drafted steps' worth
    drafted: int = 0  # drafted steps seen
    backoff: int = 1  # the next undrafted run's length
    owed: int = 0  # undrafted steps still to come

    def draft_next(self) -> bool:
        """Whether the next step drafts."""
        return self.owed == 0

    def observe(self, drafted: bool, worth: float | None) -> None:
        """A finished step: whether it drafted, and its worth (None: no tree was priced)."""
        if not drafted:
            self.owed = max(self.owed - 1, 0)
            return
        if worth is None:
            return
        self.drafted += 1
        retried = self.worth < 1.0 and self.drafted > SETTLE  # the step after an undrafted run
        if retried and worth >= 1.0:
            self.worth, self.backoff = worth, 1
            return
        self.worth += max(WEIGHT, 1.0 / self.drafted) * (worth - self.worth)
        if self.worth < 1.0 and self.drafted >= SETTLE:
            self.owed = self.backoff
            self.backoff = min(2 * self.backoff, MAX_BACKOFF)
        elif self.worth >= 1.0:
            self.backoff = 1


__all__ = ["MAX_BACKOFF", "SETTLE", "SkipRule", "WEIGHT"]
