"""Old import paths of what moved into :mod:`opttree.loading`: they keep working for one release
and warn, naming the new one. A module that lost names gets ``__getattr__ = moved_names(...)``;
a module that moved whole is left as a stub that calls :func:`moved_module`."""

from __future__ import annotations

import importlib
import sys
import warnings
from typing import Callable, Iterable

REMOVED_IN = "0.3"  # the release that drops the old paths


def _warn(old: str, new: str) -> None:
    warnings.warn(f"{old} moved to {new}; import it from there ({old} goes in opttree {REMOVED_IN})",
                  DeprecationWarning, stacklevel=3)


def moved_names(module: str, new_module: str, names: Iterable[str],
                also: dict[str, str] | None = None) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``module``: each of ``names`` (now in ``new_module``) and each
    key of ``also`` (now in the module its value names) is fetched from its new home, with a
    DeprecationWarning naming it; any other name is an AttributeError, as without the hook."""
    homes = {name: new_module for name in names} | dict(also or {})

    def __getattr__(name: str):
        if name not in homes:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        _warn(f"{module}.{name}", f"{homes[name]}.{name}")
        return getattr(importlib.import_module(homes[name]), name)

    return __getattr__


def moved_module(old: str, new: str) -> None:
    """Called by the stub left at ``old``: warn that the module is now ``new``, and make ``old``
    that very module (``sys.modules``), so every name, private ones included, and every patch of
    one reaches the same object under both paths."""
    _warn(old, new)
    sys.modules[old] = importlib.import_module(new)


__all__ = ["REMOVED_IN", "moved_module", "moved_names"]
