"""The step policies of a generate() call (:func:`policy_maker`, the entry the generate() face calls):
fixed, or ``"auto"``'s :class:`~opttree.budget.policy.AutoPolicy` on the latency model
(:class:`~opttree.budget.latency.LatencyModel`) of the (target, drafter) pair on this machine,
:func:`calibrate`: remembered by the process, else read from its file
(:mod:`opttree.budget.calibration_file`), else measured (:mod:`opttree.budget.timing`) and written.

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

import hashlib
import threading
from pathlib import Path
from typing import Callable

import torch

from ..drafters.base import Drafter
from ..hf.validation import context_length
from ..kernels import linears
from ..tree.config import TreeConfig
from ..tree.plan import BudgetPolicy, FixedPolicy
from .calibration_file import cache_dir, cache_mode, key_digest, stored
from .latency import LatencyModel
from .policy import AutoPolicy, as_calibrated
from .timing import (BUDGET_FORWARDS, BUDGET_SECONDS, CALIBRATION_PREFIX, DRAFTER_REPEATS, DRAFT_WIDTHS, TIMING_ORDER,
                     VERIFY_NODES, forward_kind, measure, warm_compiled)

MIN_CALIBRATION_PREFIX = 16  # a shorter context cannot be calibrated: "auto" is refused
CALIBRATION_VERSION = 8  # bump when what is measured changes: old files are then ignored (8: a few sizes timed, warmed)

_PAIRS: dict[str, LatencyModel] = {}  # key digest -> the process's (refreshed) model of that pair
_pairs_lock = threading.Lock()  # guards _PAIRS; held for a dict read or write only
_measuring = threading.Lock()  # one calibration at a time: concurrent ones would time each other


def known_latency(target, drafter=None, forward=None) -> LatencyModel | None:
    """This process's (refreshed) LatencyModel of the pair, if it was calibrated; else None."""
    key = calibration_key(target, drafter, forward=forward)
    return None if key["prefix"] is None else _remembered(key_digest(key))


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


def calibration_key(target, drafter, prefix: int | None = None, forward=None) -> dict:
    """Everything a calibration depends on; its hash names the cache file (and says which
    verification forward it timed: ``"forward"``). ``prefix``: the tokens under the timed forwards
    (default :func:`calibration_prefix`; None there: the pair's contexts are too short)."""
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
        "prefix": prefix or calibration_prefix(target, drafter),
        "forward": forward_kind(forward),
    }


def calibrate(target, drafter=None, new_drafter: Callable[[], object] | None = None, *,
              folder: Path | None = None, mode: str | None = None, prefix: int | None = None,
              forward=None, kernels=(), slots: int | None = None) -> LatencyModel:
    """The LatencyModel of this (target, drafter) pair on this machine: from this process's
    memory, else from the on-disk cache, else measured (and written). ``drafter`` names the pair
    (its fingerprint), ``new_drafter()`` makes a scratch drafter to time; ``forward`` is the
    verification forward decoding runs (compiled or eager: timed as it runs), ``kernels`` the modules whose
    few-row linears decoding runs through opttree's CPU kernels (timed so: :func:`~.timing.measure`), ``slots``
    the static cache decoding runs a compiled forward on (calibration's graphs are made on one as long: they
    are decoding's). A compiled forward's model verifies only at the sizes timed (``measured_only``).
    ``folder`` / ``mode`` default to :func:`~.calibration_file.cache_dir` / :func:`~.calibration_file.cache_mode`,
    ``prefix`` to :func:`calibration_prefix`. Every generate() call of the process shares (and refreshes) the
    returned object; calls from several threads measure one at a time, and a pair is measured once
    (``mode="refresh"``: once per call)."""
    mode = mode or cache_mode()
    folder = folder or cache_dir()
    key = calibration_key(target, drafter, prefix, forward)
    prefix = key["prefix"]
    if prefix is None:
        raise ValueError(f"nodes/threshold='auto' needs a context of at least {MIN_CALIBRATION_PREFIX + _ROOM} "
                         f"tokens to calibrate")
    digest = key_digest(key)
    known = None if mode == "refresh" else _remembered(digest)
    if known is not None:
        return known
    with _measuring:
        known = None if mode == "refresh" else _remembered(digest)  # measured while this call waited
        if known is not None:
            return known
        latency = stored(key, folder, mode, lambda: measure(target, new_drafter, prefix, forward,
                                                            hidden=drafter.wants_hidden_states, kernels=kernels,
                                                            slots=slots))
        # compiled: decoding verifies only at the sizes timed, whose graphs calibration compiled (on ``slots``)
        latency.measured_only = key["forward"] == "compiled"
        latency.calibrated = as_calibrated(latency)  # as measured or read: sampled calls plan from it
        with _pairs_lock:
            _PAIRS[digest] = latency
        return latency


_ROOM = max(max(VERIFY_NODES), max(DRAFT_WIDTHS)) + (DRAFTER_REPEATS + 1) * len(DRAFT_WIDTHS) + 2  # past the prefix


def calibration_prefix(target, drafter=None) -> int | None:
    """The cached tokens under the timed forwards: CALIBRATION_PREFIX, less where the target's or
    the drafter's context is shorter; None where even MIN_CALIBRATION_PREFIX does not fit."""
    limits = [x for x in (context_length(target), None if drafter is None else drafter.context_length) if x]
    return prefix_within(min(limits, default=None))


def prefix_within(context: int | None) -> int | None:
    """The cached tokens under the timed forwards in a context of ``context`` tokens (None: unbounded):
    CALIBRATION_PREFIX, less where the context is shorter; None where even MIN_CALIBRATION_PREFIX does not fit."""
    prefix = CALIBRATION_PREFIX if context is None else min(CALIBRATION_PREFIX, context - _ROOM)
    return prefix if prefix >= MIN_CALIBRATION_PREFIX else None


def policy_maker(config: TreeConfig, target, drafter=None, new_drafter: Callable[[], object] | None = None,
                 forward=None, *, sampling: bool = False, kernels=(), slots: int | None = None
                 ) -> Callable[[], BudgetPolicy]:
    """Makes the step policy of each batch row for ``config``: :class:`FixedPolicy`, or for
    ``nodes``/``threshold="auto"`` an :class:`AutoPolicy` on the latency model of ``target`` and
    the drafter (see :func:`calibrate`: measured once, through ``forward``,
    shared by every row and later call, and refreshed by their timings). ``sampling``: the call samples,
    so its trees must not depend on the clock nor on earlier calls (DESIGN.md, *Seeded sampling repeats*):
    ``slots``: the static cache a compiled ``forward`` decodes on (see :func:`calibrate`).
    Its rows share one copy of the calibration as measured
    (:func:`~opttree.budget.policy.as_calibrated`) and plan untimed."""
    if config.nodes != "auto" and config.threshold != "auto":  # compiled: one size, one graph
        return lambda: FixedPolicy(config, one_size=forward_kind(forward) == "compiled")
    latency = calibrate(target, drafter, new_drafter, forward=forward, kernels=kernels, slots=slots)
    if latency.measured_only and slots is not None:  # compiled: every graph decoding verifies at, compiled now
        with _measuring:
            warm_compiled(target, forward, sorted(latency.verify_measured or ()), slots,
                          drafter is not None and drafter.wants_hidden_states, calibration_prefix(target, drafter))
    if sampling:
        own = as_calibrated(latency)
        return lambda: AutoPolicy(config, own, timed=False)
    return lambda: AutoPolicy(config, latency)


def make_policy(config: TreeConfig, target, drafter=None, new_drafter: Callable[[], object] | None = None) -> BudgetPolicy:
    """One step policy for ``config`` (see :func:`policy_maker`)."""
    return policy_maker(config, target, drafter, new_drafter)()


__all__ = ["CALIBRATION_VERSION", "MIN_CALIBRATION_PREFIX", "calibrate", "calibration_key", "calibration_prefix",
           "clear_calibrations", "drafter_fingerprint", "known_latency", "make_policy", "model_fingerprint",
           "policy_maker", "prefix_within"]
