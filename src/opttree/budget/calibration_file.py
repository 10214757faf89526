"""The calibrations on disk: where they are kept, how a file is read and written, and what it must
hold, checked before any of it is used.

One file per calibration key (:func:`opttree.budget.calibration.calibration_key`), named by its hash,
in :func:`cache_dir`; :func:`cache_mode` says whether to read and write them. A file is JSON that
anything may have written, truncated or edited: ``{"key": <the calibration key>, "latency": {"verify": TABLE,
"layer": TABLE or null, "root_seconds": S}}``, a TABLE being ``{"sizes": [...], "seconds": [...]}``.
It is used only when it is what measuring writes: tables of strictly increasing integer sizes
(0 … MAX_NODES for the target's verification, 1 … MAX_NODES for the draft's layer widths) with
one time for each size, every time a finite number of seconds in [MIN_SECONDS, MAX_SECONDS] (the
root's catch-up may be 0: not measured). Anything else raises ValueError saying what is wrong, so
the caller measures again instead of running on times that would switch speculation off, build
the largest trees, or fail in the middle of a decode.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import threading
from pathlib import Path
from typing import Callable, TypeVar

from ..tree.config import MAX_NODES
from .latency import LatencyModel, LatencyTable, complete_table
from .timing import VERIFY_NODES

logger = logging.getLogger(__name__)

T = TypeVar("T")

MIN_SECONDS = 1e-9  # no measured forward is faster than a nanosecond (smaller times underflow the fit)
MAX_SECONDS = 3600.0  # nor slower than an hour (larger ones overflow the fit's squares)


def cache_dir() -> Path:
    """``$OPTTREE_CALIBRATION_DIR``, else ``$OPTTREE_CACHE/calibration`` (``~/.cache/opttree/calibration``)."""
    if os.environ.get("OPTTREE_CALIBRATION_DIR"):
        return Path(os.environ["OPTTREE_CALIBRATION_DIR"])
    return Path(os.environ.get("OPTTREE_CACHE", Path.home() / ".cache" / "opttree")) / "calibration"


def cache_mode() -> str:
    """``OPTTREE_CALIBRATION``: "on" (default: read, else measure and write), "off" (always
    measure, never touch the disk), "refresh" (measure and overwrite)."""
    mode = os.environ.get("OPTTREE_CALIBRATION", "on").strip().lower() or "on"
    if mode not in ("on", "off", "refresh"):
        raise ValueError(f"OPTTREE_CALIBRATION must be 'on', 'off' or 'refresh', got {mode!r}")
    return mode


def to_json(latency: LatencyModel) -> dict:
    """What a cache file holds: the verification times of the sizes measured (not the fitted ones),
    the drafter's layer table and its catch-up time."""
    layer = None if latency.layer is None else dataclasses.asdict(latency.layer)
    return {"verify": dataclasses.asdict(measured_verify(latency)), "layer": layer,
            "root_seconds": latency.root_seconds}


def measured_verify(latency: LatencyModel) -> LatencyTable:
    """The verification table's timed sizes only (what a file keeps: the others are fitted again on reading)."""
    if latency.verify_measured is None:
        return latency.verify
    pairs = [(n, t) for n, t in zip(latency.verify.sizes, latency.verify.seconds) if n in latency.verify_measured]
    return LatencyTable(tuple(n for n, _ in pairs), tuple(t for _, t in pairs))


def from_json(data: dict) -> LatencyModel:
    """The LatencyModel of :func:`to_json`'s form, its unmeasured sizes fitted; ValueError when it
    holds anything measuring would not write (see :mod:`opttree.budget.calibration_file`)."""
    latency = parse_latency(data)
    return with_fitted_sizes(latency)


def with_fitted_sizes(latency: LatencyModel) -> LatencyModel:
    """``latency`` whose verification table holds every size of VERIFY_NODES: those measured as
    they are, the others fitted (:func:`~opttree.budget.latency.complete_table`)."""
    measured = latency.verify
    latency.verify = complete_table(measured, VERIFY_NODES)
    latency.verify_measured = frozenset(measured.sizes)
    return latency


def stored(key: dict, folder: Path, mode: str, measure: Callable[[], LatencyModel]) -> LatencyModel:
    """``key``'s LatencyModel as :func:`cache_mode` ``mode`` says: read from its file in ``folder``
    (``"on"``), else (none, or one that cannot be used) ``measure()``d and written there (not ``"off"``)."""
    latency = read_cached(key, folder) if mode == "on" else None
    if latency is None:
        latency = measure()
        if mode != "off":
            write_cached(key, latency, folder)
    return latency


def read_cached(key: dict, folder: Path) -> LatencyModel | None:
    """The cached LatencyModel of ``key`` in ``folder``; None when there is none or it cannot be
    used (named in a warning: the caller measures again and rewrites it)."""
    latency = read_keyed_file(folder / f"{key_digest(key)}.json", key, parse_document, "calibration cache", logger)
    return None if latency is None else with_fitted_sizes(latency)


def write_cached(key: dict, latency: LatencyModel, folder: Path) -> Path | None:
    """Write ``latency`` as ``key``'s cache file in ``folder`` (through a temporary file, renamed:
    a concurrent reader never sees half a file); None, with a warning, where that fails."""
    path = folder / f"{key_digest(key)}.json"
    tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"key": key, "latency": to_json(latency)}, indent=1))
        tmp.replace(path)
        return path
    except OSError as error:
        _remove(tmp)
        logger.warning("could not write the calibration cache %s: %s", path, error)
        return None


def _remove(path: Path) -> None:
    """Delete ``path`` if it is there; a file that cannot be deleted is left."""
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass


def key_digest(key: dict) -> str:
    """The hash of a calibration key: its file's name (and the process's memory of it)."""
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]


def read_keyed_file(path: Path, key: dict, parse: Callable[[str, dict], T], what: str,
                    logger: logging.Logger) -> T | None:
    """``parse(text, key)`` of the cache file ``path``; None when there is none. A file that cannot
    be read or used (``parse`` raises ValueError: not JSON, another key, bad values) is named in a
    warning and gives None too: the caller measures again and rewrites it."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as error:
        logger.warning("could not read the %s %s (%s); measuring again", what, path, error)
        return None
    try:
        return parse(text, json.loads(json.dumps(key)))  # the key as the file would hold it
    except ValueError as error:
        logger.warning("ignoring the %s %s: %s; measuring again and rewriting it", what, path, error)
        return None


def parse_document(text: str, key: dict) -> LatencyModel:
    """The latency model a cache file's ``text`` holds for ``key`` (the key as JSON would give it
    back); ValueError when it is not JSON, holds another key, or holds unusable tables."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise ValueError(f"it is not valid JSON ({type(error).__name__})") from None
    if not isinstance(data, dict):
        raise ValueError(f"it holds a JSON {type(data).__name__}, not an object with 'key' and 'latency'")
    if data.get("key") != key:
        raise ValueError("it holds the calibration of another target, drafter or machine setting")
    return parse_latency(data.get("latency"))


def parse_latency(data) -> LatencyModel:
    """A LatencyModel from its JSON form (see the module docstring); ValueError if unusable."""
    if not isinstance(data, dict):
        raise ValueError(f"'latency' must be an object, got {_kind(data)}")
    if data.get("verify") is None:
        raise ValueError("'latency' has no 'verify' table")
    layer = data.get("layer")
    return LatencyModel(verify=parse_table(data["verify"], "verify", smallest=0),
                        layer=None if layer is None else parse_table(layer, "layer", smallest=1),
                        root_seconds=parse_seconds(data.get("root_seconds"), "root_seconds", zero_ok=True))


def parse_table(data, name: str, smallest: int) -> LatencyTable:
    """A LatencyTable from ``{"sizes": [...], "seconds": [...]}``: strictly increasing integer
    sizes in [smallest, MAX_NODES], one time in seconds for each."""
    if not isinstance(data, dict) or not isinstance(data.get("sizes"), list) or not isinstance(data.get("seconds"), list):
        raise ValueError(f"the {name!r} table must be an object with lists 'sizes' and 'seconds', got {_kind(data)}")
    sizes, seconds = data["sizes"], data["seconds"]
    if not sizes or len(sizes) != len(seconds):
        raise ValueError(f"the {name!r} table must have as many seconds as sizes, at least one "
                         f"(it has {len(sizes)} sizes and {len(seconds)} seconds)")
    if not all(_is_int(n) and smallest <= n <= MAX_NODES for n in sizes):
        raise ValueError(f"the {name!r} table's sizes must be integers from {smallest} to {MAX_NODES}")
    if any(b <= a for a, b in zip(sizes, sizes[1:])):
        raise ValueError(f"the {name!r} table's sizes must be strictly increasing, got {sizes}")
    return LatencyTable(tuple(sizes), tuple(parse_seconds(t, f"{name} seconds") for t in seconds))


def parse_seconds(value, name: str, zero_ok: bool = False) -> float:
    """``value`` as seconds: a finite number in [MIN_SECONDS, MAX_SECONDS] (or 0 with ``zero_ok``)."""
    if _is_number(value) and (MIN_SECONDS <= value <= MAX_SECONDS or (zero_ok and value == 0)):
        return float(value)
    low = "0 or " if zero_ok else ""
    raise ValueError(f"{name} must be {low}a number of seconds from {MIN_SECONDS:g} to {MAX_SECONDS:g}, "
                     f"got {value!r}")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x) -> bool:
    return _is_int(x) or (isinstance(x, float) and math.isfinite(x))


def _kind(value) -> str:
    return "null" if value is None else f"a {type(value).__name__}"


__all__ = ["MAX_SECONDS", "MIN_SECONDS", "cache_dir", "cache_mode", "from_json", "key_digest", "measured_verify",
           "parse_document", "parse_latency", "parse_seconds", "parse_table", "read_cached", "read_keyed_file", "stored",
           "to_json", "with_fitted_sizes", "write_cached"]
