"""What generate() does with the tree arguments a user left out.

:class:`~opttree.tree.config.TreeConfig`'s defaults (``nodes=60, threshold=0.5``, OPT-Tree as published)
are what any tree argument you pass is completed with. With NEITHER ``nodes`` NOR ``threshold``
given, generate() instead measures this machine: ``nodes="auto", threshold="auto"`` (opttree.budget: each
step keeps the tree that maximises expected tokens per second, from timed latencies of this target
and this draft; the first call on a machine spends a few seconds timing them, cached on disk).

Where "auto" cannot run, the left-out arguments fall back to TreeConfig's fixed defaults:

- ``strategy="sampled"``: a drawn tree whose shape must not depend on timings;
- ``verifier="rrs"`` or ``"traversal"``: their trees are checked against the draft's own q, so the
  shape is left to the strategy (``"match"``, the default, accepts any tree);
- a context too short to time a 16-token prefix (:func:`opttree.budget.calibration.calibration_prefix`).
"""

from __future__ import annotations

from ..tree.config import TreeConfig

TREE_ARGS = ("nodes", "threshold", "max_depth", "strategy", "verifier", "static_tree")
AUTO = {"nodes": "auto", "threshold": "auto"}
AUTO_STRATEGIES = ("opt", "heap", "delayed", "chain", "static")  # builders that follow a budget plan
AUTO_VERIFIERS = ("match",)


def given_settings(**given) -> dict:
    """The tree arguments a user actually passed (None = left out)."""
    unknown = set(given) - set(TREE_ARGS)
    if unknown:
        raise TypeError(f"unknown tree arguments {sorted(unknown)}; known: {', '.join(TREE_ARGS)}")
    return {k: v for k, v in given.items() if v is not None}


def wants_default_size(given: dict) -> bool:
    """True when neither ``nodes`` nor ``threshold`` was given: the size is opttree's to choose."""
    return "nodes" not in given and "threshold" not in given


def auto_applies(given: dict, *, can_calibrate: bool) -> bool:
    """Whether left-out ``nodes``/``threshold`` become "auto" (see the module docstring)."""
    fixed = TreeConfig(**given)  # validates what was given
    return (wants_default_size(given) and can_calibrate
            and fixed.strategy in AUTO_STRATEGIES and fixed.verifier in AUTO_VERIFIERS)


def resolve(given: dict, *, can_calibrate: bool = True) -> TreeConfig:
    """The TreeConfig a generate() call runs with: the given arguments exactly as given; left-out
    ``nodes`` and ``threshold`` "auto" where :func:`auto_applies`, else TreeConfig's defaults."""
    if auto_applies(given, can_calibrate=can_calibrate):
        return TreeConfig(**{**given, **AUTO})
    return TreeConfig(**given)
