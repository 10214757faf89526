"""Calibration of the latency model (:class:`~opttree.budget.latency.LatencyModel`) and its on-disk cache.

T(n) is timed on the target for a few n; the drafter is timed through its own protocol
(``root_probs`` / ``expand`` over w nodes / ``commit``) on a scratch drafter made for the purpose,
so any Drafter works (a model, prompt lookup, a head drafter). A drafter that cannot be copied
starts with c = 0 and is learnt from the first steps. Later generate() calls in the process start
from the model the earlier ones refreshed (one per pair, kept in a process-wide table under a lock;
one calibration measures at a time, so concurrent ``"auto"`` calls neither time each other nor
measure the same pair twice).
Measurements are cached on disk per (target, drafter, device, dtype, torch threads) as JSON under
``$OPTTREE_CALIBRATION_DIR`` (default ``$OPTTREE_CACHE/calibration``, i.e.
``~/.cache/opttree/calibration``); ``OPTTREE_CALIBRATION=off`` neither reads nor writes it,
``OPTTREE_CALIBRATION=refresh`` measures again and overwrites it. A file that cannot be used (not
JSON, or times no measurement gives: :mod:`opttree.budget.calibration_file`) is named in a warning,
measured again and rewritten.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import threading
from pathlib import Path
from typing import Callable

import torch

from ..drafters.base import Drafter
from ..kernels import linears
from ..hf.width import carried_width
from ..tree.config import TreeConfig
from ..tree.plan import BudgetPolicy, FixedPolicy
from .calibration_file import parse_document, parse_latency, read_keyed_file
from .latency import AutoPolicy, LatencyModel, LatencyTable, complete_table
from .timing import (BUDGET_FORWARDS, BUDGET_SECONDS, CALIBRATION_PREFIX, DRAFTER_REPEATS, DRAFT_WIDTHS, TIMING_ORDER,
                     VERIFY_NODES, lower_envelope, measure_drafter, measure_verify_budgeted)

logger = logging.getLogger(__name__)

MIN_CALIBRATION_PREFIX = 16  # a shorter context cannot be calibrated: "auto" is refused
CALIBRATION_VERSION = 8  # bump when what is measured changes: old files are then ignored (8: a few sizes timed, warmed)

_PAIRS: dict[str, LatencyModel] = {}  # key digest -> the process's (refreshed) model of that pair
_pairs_lock = threading.Lock()  # guards _PAIRS; held for a dict read or write only
_measuring = threading.Lock()  # one calibration at a time: concurrent ones would time each other


def known_latency(target, drafter=None, forward=None) -> LatencyModel | None:
    """This process's (refreshed) LatencyModel of the pair, if it was calibrated; else None."""
    prefix = calibration_prefix(target, drafter)
    return None if prefix is None else _remembered(_digest(calibration_key(target, drafter, prefix, forward)))


def _remembered(digest: str) -> LatencyModel | None:
    with _pairs_lock:
        return _PAIRS.get(digest)


def clear_calibrations() -> None:
    """Forget this process's calibrations (the on-disk cache stays)."""
    with _pairs_lock:
        _PAIRS.clear()


def model_fingerprint(model) -> dict:
    """What a model's latency depends on: class, name_or_path, a hash of its config (of its module
    tree for a plain torch module), size, device and dtype (not its weights)."""
    config = getattr(model, "config", None)
    name = getattr(config, "name_or_path", "") or getattr(config, "_name_or_path", "")
    text = config.to_json_string(use_diff=False) if hasattr(config, "to_json_string") else str(model)
    first = next(model.parameters(), None)
    return {
        "class": type(model).__name__,
        "name": str(name),
        "config": hashlib.sha256(text.encode()).hexdigest()[:16],
        "params": sum(p.numel() for p in model.parameters()),
        "device": str(getattr(model, "device", None) or (first.device if first is not None else "")),
        "dtype": str(getattr(model, "dtype", None) or (first.dtype if first is not None else "")),
    }


def drafter_fingerprint(drafter, depth: int = 2) -> dict | None:
    """A drafter's class, the models it holds and the drafters it wraps (two levels deep)."""
    if drafter is None:
        return None
    parts = vars(drafter) if hasattr(drafter, "__dict__") else {}
    models = {k: model_fingerprint(v) for k, v in sorted(parts.items()) if isinstance(v, torch.nn.Module)}
    inner = {k: drafter_fingerprint(v, depth - 1) for k, v in sorted(parts.items())
             if depth > 0 and isinstance(v, Drafter)}
    scalars = {k: v for k, v in sorted(parts.items()) if not k.startswith("_") and isinstance(v, (int, float, str))
               and k not in ("forwards", "prefix_len", "context_length")}  # settings, not running state
    return {"class": f"{type(drafter).__module__}.{type(drafter).__qualname__}", "models": models,
            "inner": inner, "settings": scalars}


def forward_kind(forward) -> str:
    """How the verification forward runs: "compiled" (generate()'s compiled callable) or "eager"."""
    return "compiled" if forward is not None and forward.compiles else "eager"


def calibration_key(target, drafter, prefix: int = CALIBRATION_PREFIX, forward=None) -> dict:
    """Everything a calibration depends on; its hash names the cache file (and says which
    verification forward it timed: ``"forward"``)."""
    return {
        "version": CALIBRATION_VERSION,
        "target": model_fingerprint(target),
        "drafter": drafter_fingerprint(drafter),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "linear": linears.mode(),  # the few-row linears' kernel (kernels.linears): auto or a fixed one
        "verify_nodes": list(VERIFY_NODES),
        "timing": {"order": list(TIMING_ORDER), "forwards": BUDGET_FORWARDS, "seconds": BUDGET_SECONDS},
        "draft_widths": list(DRAFT_WIDTHS),
        "prefix": prefix,
        "forward": forward_kind(forward),
    }


def _digest(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]


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
    return {"verify": dataclasses.asdict(latency.measured_verify()), "layer": layer,
            "root_seconds": latency.root_seconds}


def from_json(data: dict) -> LatencyModel:
    """The LatencyModel of :func:`to_json`'s form, its unmeasured sizes fitted; ValueError when it
    holds anything measuring would not write (see :mod:`opttree.budget.calibration_file`)."""
    return with_fitted_sizes(parse_latency(data))


def with_fitted_sizes(latency: LatencyModel) -> LatencyModel:
    """``latency`` whose verification table holds every size of VERIFY_NODES: those measured as
    they are, the others fitted (:func:`~opttree.budget.latency.complete_table`)."""
    measured = latency.verify
    latency.verify = complete_table(measured, VERIFY_NODES)
    latency.verify_measured = frozenset(measured.sizes)
    return latency


def read_cached(key: dict, folder: Path) -> LatencyModel | None:
    """The cached LatencyModel of ``key`` in ``folder``; None when there is none or it cannot be
    used (named in a warning: the caller measures again and rewrites it)."""
    latency = read_keyed_file(folder / f"{_digest(key)}.json", key, parse_document, "calibration cache", logger)
    return None if latency is None else with_fitted_sizes(latency)


def write_cached(key: dict, latency: LatencyModel, folder: Path) -> Path | None:
    """Write ``latency`` as ``key``'s cache file in ``folder`` (through a temporary file, renamed:
    a concurrent reader never sees half a file); None, with a warning, where that fails."""
    path = folder / f"{_digest(key)}.json"
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


def measure(target, new_drafter: Callable[[], object] | None, prefix: int = CALIBRATION_PREFIX,
            forward=None, hidden: bool = False) -> LatencyModel:
    """A fresh LatencyModel: T(n) on the target, through ``forward`` (the verification forward decoding
    runs; ``hidden``: it returns the hidden states); the drafter through a scratch one from
    ``new_drafter()`` (without one, or if timing it fails, the draft cost is learnt from the steps)."""
    from ..hf.validation import vocab_size

    timed = measure_verify_budgeted(target, prefix=prefix, forward=forward, hidden=hidden)  # the rest fitted
    latency = LatencyModel(verify=complete_table(timed, VERIFY_NODES), verify_measured=frozenset(timed.sizes))
    if new_drafter is not None:
        try:
            root, layers = measure_drafter(new_drafter(), vocab_size(target), target.device, prefix=prefix,
                                           hidden_size=carried_width(target.config))
        except Exception as error:  # a drafter that cannot run on synthetic text: learn online instead
            logger.warning("could not time the drafter (%s: %s); learning its cost from the steps",
                           type(error).__name__, error)
        else:
            latency.layer = LatencyTable(DRAFT_WIDTHS, lower_envelope(layers))
            latency.root_seconds = root
    logger.info("calibration at %d tokens (%s): %s (the other sizes fitted); draft layer %s", prefix,
                forward_kind(forward),
                ", ".join(f"T({n})={t * 1e3:.1f}ms" for n, t in zip(timed.sizes, timed.seconds)),
                "unmeasured" if latency.layer is None else
                ", ".join(f"c({w})={t * 1e3:.1f}ms" for w, t in zip(latency.layer.sizes, latency.layer.seconds)))
    return latency


def calibrate(target, drafter=None, new_drafter: Callable[[], object] | None = None, *,
              folder: Path | None = None, mode: str | None = None, prefix: int | None = None,
              forward=None) -> LatencyModel:
    """The LatencyModel of this (target, drafter) pair on this machine: from this process's
    memory, else from the on-disk cache, else measured (and written). ``drafter`` names the pair
    (its fingerprint), ``new_drafter()`` makes a scratch drafter to time; ``forward`` is the
    verification forward decoding runs (compiled or eager: timed as it runs). ``folder`` / ``mode``
    default to :func:`cache_dir` / :func:`cache_mode`, ``prefix`` to :func:`calibration_prefix`.
    Every generate() call of the process shares (and refreshes) the returned object; calls from
    several threads measure one at a time, and a pair is measured once (``mode="refresh"``: once
    per call)."""
    mode = mode or cache_mode()
    folder = folder or cache_dir()
    prefix = prefix or calibration_prefix(target, drafter)
    if prefix is None:
        raise ValueError(f"nodes/threshold='auto' needs a context of at least {MIN_CALIBRATION_PREFIX + _ROOM} "
                         f"tokens to calibrate")
    key = calibration_key(target, drafter, prefix, forward)
    digest = _digest(key)
    known = None if mode == "refresh" else _remembered(digest)
    if known is not None:
        return known
    with _measuring:
        known = None if mode == "refresh" else _remembered(digest)  # measured while this call waited
        if known is not None:
            return known
        latency = read_cached(key, folder) if mode == "on" else None
        if latency is None:
            compiled = forward_kind(forward) == "compiled"  # a compiled target's linears are the compiler's
            kernels = [m for m in (target, *drafter.modules()) if not (compiled and m is target)]
            with linears.fast_linears(*kernels, on=bool(kernels)):  # as the decoding loops run (integration/entry.py)
                latency = measure(target, new_drafter, prefix, forward, hidden=drafter.wants_hidden_states)
            if mode != "off":
                write_cached(key, latency, folder)
        latency.calibrated = json.loads(json.dumps(to_json(latency)))  # as a file holds it: sampled calls plan from it
        with _pairs_lock:
            _PAIRS[digest] = latency
        return latency


_ROOM = max(max(VERIFY_NODES), max(DRAFT_WIDTHS)) + (DRAFTER_REPEATS + 1) * len(DRAFT_WIDTHS) + 2  # past the prefix


def calibration_prefix(target, drafter=None) -> int | None:
    """The cached tokens under the timed forwards: CALIBRATION_PREFIX, less where the target's or
    the drafter's context is shorter; None where even MIN_CALIBRATION_PREFIX does not fit."""
    from ..hf.validation import context_length

    limits = [x for x in (context_length(target), None if drafter is None else drafter.context_length) if x]
    prefix = min([CALIBRATION_PREFIX] + [limit - _ROOM for limit in limits])
    return prefix if prefix >= MIN_CALIBRATION_PREFIX else None


def policy_maker(config: TreeConfig, target, drafter=None, new_drafter: Callable[[], object] | None = None,
                 forward=None, *, sampling: bool = False) -> Callable[[], BudgetPolicy]:
    """Makes the step policy of each batch row for ``config``: :class:`FixedPolicy`, or for
    ``nodes``/``threshold="auto"`` an :class:`AutoPolicy` on the latency model of ``target`` and
    the drafter (see :func:`calibrate`: measured once, through ``forward``, shared by every row and
    later call, and refreshed by their timings). ``sampling``: the call samples, so its trees must not
    depend on the clock nor on earlier calls (DESIGN.md, *Seeded sampling repeats*): its rows share
    one copy of the calibration as measured (:func:`as_calibrated`) and plan untimed."""
    if config.nodes != "auto" and config.threshold != "auto":
        return lambda: FixedPolicy(config)
    latency = calibrate(target, drafter, new_drafter, forward=forward)
    if sampling:
        own = as_calibrated(latency)
        return lambda: AutoPolicy(config, own, timed=False)
    return lambda: AutoPolicy(config, latency)


def as_calibrated(latency: LatencyModel) -> LatencyModel:
    """A new model of the pair as its calibration measured it, whatever steps have refreshed since."""
    return from_json(latency.calibrated if latency.calibrated is not None else json.loads(json.dumps(to_json(latency))))


def make_policy(config: TreeConfig, target, drafter=None, new_drafter: Callable[[], object] | None = None) -> BudgetPolicy:
    """One step policy for ``config`` (see :func:`policy_maker`)."""
    return policy_maker(config, target, drafter, new_drafter)()


__all__ = ["CALIBRATION_VERSION", "MIN_CALIBRATION_PREFIX", "as_calibrated", "cache_dir", "cache_mode", "calibrate", "calibration_key",
           "calibration_prefix", "clear_calibrations", "drafter_fingerprint", "forward_kind", "from_json",
           "known_latency", "make_policy", "measure", "model_fingerprint", "policy_maker", "read_cached", "to_json",
           "with_fitted_sizes", "write_cached"]
