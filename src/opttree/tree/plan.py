"""The seam between the decoding loop, the tree builders and a budget policy: what a step's tree may be.

The decoding loop asks a :class:`BudgetPolicy` for each step's :class:`StepPlan` (the node budget,
δ, the widest layer to draft, and for ``"auto"`` a growth rule and a final cut) and tells it what
the step cost (:meth:`BudgetPolicy.observe` with the step's :class:`~opttree.loop.stats.StepStats`).
Builders read the plan and, after each layer, hand :attr:`StepPlan.grow` a :class:`LayerState`.
:class:`FixedPolicy` is ``nodes=<int>, threshold=<float>``: OPT-Tree as published. The measured
policy for ``"auto"`` is :class:`opttree.budget.policy.AutoPolicy`.

This module imports nothing heavy (torch only for type hints), so any builder may import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol

from .config import TreeConfig
from .sizes import padded_size

if TYPE_CHECKING:
    import torch


@dataclass
class LayerState:
    """What a builder knows after drafting a layer, for :attr:`StepPlan.grow`."""

    path_probs: torch.Tensor  # [m] float: p̂ of every pool node drafted so far this step (absolute)
    parents: torch.Tensor  # [m] long: each pool node's parent (-1: the root)
    previous: int  # pool size before the last layer (pool[previous:] is the last layer)
    next_width: int  # nodes the next draft forward would expand (the last layer's most probable)


@dataclass
class StepPlan:
    """One step's tree settings, from a :class:`BudgetPolicy`."""

    nodes: int  # node budget: the pool's best-``nodes`` set; the tree never keeps more
    threshold: float  # δ for a builder's own growth rule when ``grow`` is None
    width: int | None = None  # the most nodes one draft forward expands (None: no cap)
    grow: Callable[[LayerState], bool] | None = None  # draft one more layer? (None: E(A) gain > δ)
    size: Callable[[torch.Tensor], int] | None = None  # pool p̂ [k] -> nodes to verify (None: all kept)


class BudgetPolicy(Protocol):
    max_nodes: int  # the largest tree any step will verify (what caches must make room for)
    timed: bool  # it learns from the step's measured times (the loop then syncs the device to time them)

    def plan(self) -> StepPlan:
        """Called at the start of each step, before the drafter's first call."""

    def observe(self, step) -> None:
        """The finished step (a :class:`~opttree.loop.stats.StepStats`, with its measured times)."""

    def verify_rows(self, nodes: int) -> int:
        """The rows a tree of ``nodes`` nodes is verified at: one of tree.sizes.VERIFY_SIZES that holds
        the root and the tree."""


class FixedPolicy:
    """``nodes`` and ``threshold`` as given: OPT-Tree's rule, nothing measured. ``one_size``: every step is
    verified at the size of the whole budget, a smaller tree (or none) padded to it: a compiled verification
    forward, where each size is a graph compiled at its first forward (tens of seconds on a CPU, mid-answer)."""

    timed = False

    def __init__(self, config: TreeConfig, one_size: bool = False):
        self.config = config
        self.max_nodes = config.nodes
        self.one_size = one_size

    def plan(self) -> StepPlan:
        return StepPlan(nodes=self.config.nodes, threshold=self.config.threshold)

    def observe(self, step) -> None:
        pass

    def verify_rows(self, nodes: int) -> int:
        """The smallest fixed size that holds the root and the tree (nothing is measured); with ``one_size``,
        the one that holds the whole budget."""
        return padded_size((self.max_nodes if self.one_size else nodes) + 1)


__all__ = ["BudgetPolicy", "FixedPolicy", "LayerState", "StepPlan"]
