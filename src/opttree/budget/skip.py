"""Whether a step drafts at all (:class:`SkipRule`): where drafting has not paid, steps verify the root
alone, as plain decoding does, and drafting is tried again after 1, 2, 4 … ``MAX_BACKOFF`` undrafted steps.

``"auto"`` chooses each tree after drafting it (:func:`~opttree.budget.policy.best_choice`), the drafting
time D sunk; this rule is the other half, whether to pay D at all. A drafted step *paid* when its tree's
expected speed, D included, beats an undrafted step's, both priced by the pair's one latency model:
(E_m + 1) / (T(m) + D + overhead) > 1 / (T(0) + overhead) (:func:`~opttree.budget.policy.drafting_paid`).
After ``UNPAID`` drafted steps in a row that did not pay, the next steps do not draft (no catch-up call, no
tree: the drafter catches up at its next drafted step); each further unpaid drafted step doubles the
undrafted run, a drafted step that pays ends it. The rule reads decisions, not step times, so it is as
steady as the latency model (whose T(n) decoding's clock prices: :class:`~opttree.budget.latency.SeenSize`).
"""

from __future__ import annotations

from dataclasses import dataclass

UNPAID = 2  # drafted steps in a row that did not pay before steps stop drafting
MAX_BACKOFF = 16  # the longest run of undrafted steps before drafting is tried again


@dataclass
class SkipRule:
    """Shared by a pair's calls (on its :class:`~opttree.budget.latency.LatencyModel`)."""

    unpaid: int = 0  # drafted steps in a row that did not pay
    backoff: int = 1  # the undrafted run that the next unpaid drafted step starts
    owed: int = 0  # undrafted steps still to come

    def draft_next(self) -> bool:
        """Whether the next step drafts."""
        return self.owed == 0

    def observe(self, drafted: bool, paid: bool) -> None:
        """A finished step: whether it drafted, and if so whether its drafting paid."""
        if not drafted:
            self.owed = max(self.owed - 1, 0)
        elif paid:
            self.unpaid, self.backoff = 0, 1
        else:
            self.unpaid += 1
            if self.unpaid >= UNPAID:
                self.owed, self.backoff = self.backoff, min(2 * self.backoff, MAX_BACKOFF)


__all__ = ["MAX_BACKOFF", "SkipRule", "UNPAID"]
