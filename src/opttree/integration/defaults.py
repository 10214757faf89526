"""What generate() does with the tree arguments a user left out.

:class:`~opttree.tree.config.TreeConfig`'s defaults (``nodes=60, threshold=0.5``, OPT-Tree as published)
are what any tree argument you pass is completed with. With NEITHER ``nodes`` NOR ``threshold``
given, generate() instead measures this machine: ``nodes="auto", threshold="auto"`` (opttree.budget: each
step keeps the tree that maximises expected tokens per second, from timed latencies of this target
and this draft; the first call on a machine spends a few seconds timing them, cached on disk).

Where "auto" cannot run, the left-out arguments fall back to TreeConfig's fixed defaults:

- a strategy whose record does not follow the budget plan (``Strategy.follows_plan``, opttree.tree.registry:
  ``"sampled"``, a drawn tree whose shape must not depend on timings);
- a verifier whose record leaves the tree's size to the strategy (``Verifier.sized_by_auto``: ``"rrs"`` and
  ``"traversal"`` check their trees against the draft's own q; ``"match"``, the default, accepts any tree);
- a context too short to time a 16-token prefix (:func:`opttree.budget.calibration.calibration_prefix`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..tree import registry
from ..tree.config import TreeConfig

TREE_ARGS = ("nodes", "threshold", "max_depth", "strategy", "verifier", "static_tree")
AUTO = {"nodes": "auto", "threshold": "auto"}


@dataclass(frozen=True)
class TreeArguments:
    """The tree arguments one call passed, checked once (``fixed`` is built on construction, so bad
    settings fail before generate() prepares anything)."""

    given: dict  # the arguments passed (a left-out one is absent)
    fixed: TreeConfig  # TreeConfig(**given): the given ones completed with TreeConfig's defaults

    @classmethod
    def of(cls, **given) -> "TreeArguments":
        """From keyword arguments where None means left out."""
        unknown = set(given) - set(TREE_ARGS)
        if unknown:
            raise TypeError(f"unknown tree arguments {sorted(unknown)}; known: {', '.join(TREE_ARGS)}")
        given = {k: v for k, v in given.items() if v is not None}
        return cls(given, TreeConfig(**given))

    @classmethod
    def taken_from(cls, kwargs: dict, under: "TreeArguments | None" = None) -> "TreeArguments":
        """The tree arguments among generate()'s keyword arguments, taken out of ``kwargs`` (in place),
        over those of ``under`` (a SpeculativeGenerator's constructor's)."""
        taken = {k: v for k in TREE_ARGS if (v := kwargs.pop(k, None)) is not None}
        return cls.of(**{**(under.given if under else {}), **taken}) if taken or under is None else under


def wants_default_size(given: dict) -> bool:
    """True when neither ``nodes`` nor ``threshold`` was given: the size is opttree's to choose."""
    return "nodes" not in given and "threshold" not in given


def auto_applies(arguments: TreeArguments, *, can_calibrate: bool) -> bool:
    """Whether left-out ``nodes``/``threshold`` become "auto" (see the module docstring)."""
    fixed = arguments.fixed
    return (wants_default_size(arguments.given) and can_calibrate
            and fixed.strategy_record.follows_plan and fixed.verifier_record.sized_by_auto)


def resolve(arguments: TreeArguments, *, can_calibrate: bool = True) -> TreeConfig:
    """The TreeConfig a generate() call runs with: the given arguments exactly as given; left-out
    ``nodes`` and ``threshold`` "auto" where :func:`auto_applies`, else TreeConfig's defaults."""
    if auto_applies(arguments, can_calibrate=can_calibrate):
        return TreeConfig(**{**arguments.given, **AUTO})
    return arguments.fixed
