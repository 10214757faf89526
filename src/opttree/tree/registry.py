"""The tree strategies and the verifiers by name: ONE record each, from which everything else derives.

A :class:`Strategy` holds its builder, its words in the docs, whether the step's budget plan sizes its
tree (so ``nodes``/``threshold`` ``"auto"`` can drive it) and whether it draws; a :class:`Verifier` holds
its sampling walk, its words and whether "auto" may size the trees it verifies.
TreeConfig's validation and its message, generate()'s choice of "auto" (integration/defaults.py),
grow_tree's dispatch (strategies.py), verify()'s dispatch (verify/walk.py), ``opttree bench``'s help and
``docs/arguments.md`` all read these records, so a new strategy or verifier is one record.

The records are made and registered where their code lives: the strategies in tree/strategies.py (which
opttree.tree's ``__init__`` imports, so they are registered before any TreeConfig is checked), the
verifiers in verify/walk.py. This module is pure Python: config.py imports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True, kw_only=True)
class Strategy:
    """How a tree grows: ``strategy=name``."""

    name: str
    grow: Callable[..., Any]  # (root_probs, config, max_depth, *, width, grow[, generator]) -> Growth (builder.py)
    summary: str  # its words in docs/arguments.md (the strategy row)
    follows_plan: bool  # the step's budget plan sizes its tree (its size rule keeps the best m by p̂): "auto" may
    # drive it; False: its tree keeps its own order and size
    draws: bool  # its builder draws from generate()'s generator (grow_tree hands it over)


@dataclass(frozen=True, kw_only=True)
class Verifier:
    """How the target accepts drafted tokens: ``verifier=name``."""

    name: str
    summary: str  # its words in docs/arguments.md (the verifier row)
    sized_by_auto: bool  # "auto" may size the trees it verifies (False: the shape is left to the strategy)
    sampling_walk: Callable[..., Any] | None  # (built, tree, logits, process, generator) -> Acceptance when
    # sampling; None: the match walk (the target's own token at each node)


STRATEGIES: dict[str, Strategy] = {}  # name -> record, in registration order (the docs' order)
VERIFIERS: dict[str, Verifier] = {}


def _register(table: dict, kind: str, records: tuple) -> None:
    for record in records:
        if record.name in table:
            raise ValueError(f"{kind} {record.name!r} is registered twice: give the new one another name")
        table[record.name] = record


def register_strategies(*records: Strategy) -> None:
    _register(STRATEGIES, "strategy", records)


def register_verifiers(*records: Verifier) -> None:
    _register(VERIFIERS, "verifier", records)


def strategy_names() -> tuple[str, ...]:
    return tuple(STRATEGIES)


def verifier_names() -> tuple[str, ...]:
    return tuple(VERIFIERS)


def strategy(name: str) -> Strategy:
    """The record of ``strategy=name``; an unknown name is refused, naming the known ones."""
    if not isinstance(name, str) or name not in STRATEGIES:
        raise ValueError(f"strategy must be one of {strategy_names()}, got {name!r}")
    return STRATEGIES[name]


def verifier(name: str) -> Verifier:
    """The record of ``verifier=name``; an unknown name is refused, naming the known ones."""
    if not isinstance(name, str) or name not in VERIFIERS:
        raise ValueError(f"verifier must be one of {verifier_names()}, got {name!r}")
    return VERIFIERS[name]


def listing(records) -> str:
    """``"a" (its summary), "b" (its summary)``: the records as the docs list them."""
    return ", ".join(f'"{r.name}" ({r.summary})' for r in records)


def not_auto() -> tuple[list[str], list[str]]:
    """The strategies and the verifiers with which "auto" cannot run (their records say so)."""
    return ([s.name for s in STRATEGIES.values() if not s.follows_plan],
            [v.name for v in VERIFIERS.values() if not v.sized_by_auto])


__all__ = ["STRATEGIES", "VERIFIERS", "Strategy", "Verifier", "listing", "not_auto", "register_strategies",
           "register_verifiers", "strategy", "strategy_names", "verifier", "verifier_names"]
