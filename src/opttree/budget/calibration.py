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
import time
from pathlib import Path
from typing import Callable

import torch

from ..drafters.base import Drafter
from ..kernels import linears
from ..hf.compat import with_cache
from ..hf.inflated import carried_width
from ..tree.config import TreeConfig
from ..tree.draft_tree import DraftTree
from ..tree.layout import MaskLayout
from ..tree.masks import verification_inputs
from ..tree.plan import BudgetPolicy, FixedPolicy
from .calibration_file import parse_document, parse_latency, read_keyed_file
from ..tree.sizes import VERIFY_SIZES, padded_size
from .latency import AUTO_MAX_NODES, AutoPolicy, LatencyModel, LatencyTable, complete_table

logger = logging.getLogger(__name__)

# tree sizes timed at calibration, in nodes: the node counts that fill each verification size (rows,
# tree.sizes.VERIFY_SIZES: the root and n nodes), up to AUTO_MAX_NODES; T is a step between them
VERIFY_NODES = tuple(rows - 1 for rows in VERIFY_SIZES if rows - 1 <= AUTO_MAX_NODES)
DRAFT_WIDTHS = (1, 2, 4, 8, 16, 32)  # layer widths timed at calibration
CALIBRATION_PREFIX = 32  # committed tokens under the timed forwards (a longer context's cost is learnt online)
MIN_CALIBRATION_PREFIX = 16  # a shorter context cannot be calibrated: "auto" is refused
REPEATS = 5  # timed rounds per size (after one warm-up round); sizes interleaved within a round
# The sizes calibration times, in this order, while its budget lasts (the first two always): the
# ends of the range that matters first; the others are fitted between them (latency.complete_table)
# and replaced by what the steps measure once a step verifies at them (LatencyModel.observe).
TIMING_ORDER = (0, 15, 63, 3, 31, 7, 1)
BUDGET_FORWARDS = 6.0  # the verification timing's budget, in forwards of one row (warm-ups included) ...
BUDGET_SECONDS = 0.5  # ... or this many seconds, whichever is more (a GPU times every size in well under it)
DRAFTER_REPEATS = 3  # timed rounds of the drafter's protocol
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


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _median(xs) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2]


class VerifyRig:
    """A target prefilled with ``prefix`` made-up tokens, ready to time verification forwards as
    decoding runs them: ``run(n)`` is one forward over the root and ``n`` tree nodes (children of the
    root, padded to their verification size; a sliding-window or chunked layer holding its window,
    masked per layer type), the cache cropped back after it; its seconds."""

    def __init__(self, target, prefix: int, forward=None, hidden: bool = False):
        from transformers import StaticCache

        from ..hf import kv_cache
        from ..hf.compiled import MIN_SLOTS

        self.target, self.prefix, self.kv_cache = target, prefix, kv_cache
        self.forward, self.hidden = (forward if forward is not None and forward.compiles else None), hidden
        self.device, self.vocab = target.device, int(target.get_input_embeddings().weight.shape[0])
        self.layout = MaskLayout.of(target.config)
        self.inputs: dict[int, dict] = {}
        self.kv_len = None if self.forward is None else MIN_SLOTS  # a compiled forward runs on a static cache
        with torch.inference_mode():
            if self.forward is None:
                self.cache = kv_cache.new_cache(target)
            else:  # the size of a short call's: the graphs it compiles are decoding's too
                self.cache = StaticCache(config=target.config, max_cache_len=MIN_SLOTS)
            ids = (torch.arange(prefix, dtype=torch.long) * 7 % self.vocab)[None, :].to(self.device)
            target(input_ids=ids, **with_cache(target, self.cache), use_cache=True, logits_to_keep=1)
            kv_cache.keep_slots(self.cache, prefix, [])  # a sliding window's layers keep the window, as after a step
        self.dropped = kv_cache.window_offsets(self.cache)

    def _inputs(self, n: int) -> dict:
        if n not in self.inputs:
            device = self.device
            tree = DraftTree((torch.arange(n, dtype=torch.long) % self.vocab).to(device),
                             torch.full((n,), -1, dtype=torch.long, device=device), torch.ones(n, device=device))
            self.inputs[n] = verification_inputs(1, tree, self.prefix, self.target.dtype, size=padded_size(n + 1),
                                                 kv_len=self.kv_len, layout=self.layout,
                                                 dropped=self.dropped).as_kwargs()
        return self.inputs[n]

    def run(self, n: int) -> float:
        inputs = self._inputs(n)
        kwargs = dict(inputs, **with_cache(self.target, self.cache), use_cache=True, logits_to_keep=0,
                      output_hidden_states=self.hidden)  # as the decoding loop calls it (hence its graphs)
        with torch.inference_mode():
            start = time.perf_counter()
            if self.forward is None:
                self.target(**kwargs)
            else:
                self.forward(self.cache, padded_size(n + 1), **kwargs)
            _sync(self.device)
            seconds = time.perf_counter() - start
            self.kv_cache.keep_slots(self.cache, self.prefix, [])
        return seconds


def measure_verify(target, sizes=VERIFY_NODES, prefix: int = CALIBRATION_PREFIX,
                   repeats: int = REPEATS) -> tuple[float, ...]:
    """T(n) for each n in ``sizes``: one target forward over a root and n tree nodes (children of
    the root) on a ``prefix``-token cache, cropped back after each, as decoding runs it (a sliding-window
    or chunked layer holding its window, masked per layer type). The sizes take turns within each
    round, so a burst of load hits them alike; the first round warms up; medians."""
    rig = VerifyRig(target, prefix)
    times: dict[int, list[float]] = {n: [] for n in sizes}
    for round_ in range(repeats + 1):
        for n in sizes:
            seconds = rig.run(n)
            if round_ > 0:
                times[n].append(seconds)
    return tuple(_median(times[n]) for n in sizes)


def warm_then_time(rig: "VerifyRig", n: int, most: int = 4) -> tuple[float, int]:
    """(seconds of a timed forward of ``n`` nodes, forwards run): forwards are run until one is no
    faster than 0.8 × the one before (the first forwards of a size choose its CPU kernels and pack
    their weights, or compile its graph), at most ``most``; the last is the timed one."""
    runs = [rig.run(n), rig.run(n)]
    while len(runs) < most and runs[-1] < 0.8 * runs[-2]:
        runs.append(rig.run(n))
    return runs[-1], len(runs)


def measure_verify_budgeted(target, prefix: int = CALIBRATION_PREFIX, order=TIMING_ORDER,
                            forwards: float = BUDGET_FORWARDS, seconds: float = BUDGET_SECONDS, forward=None,
                            hidden: bool = False) -> LatencyTable:
    """T(n) at as many sizes of ``order`` as a budget allows: each size warmed (:func:`warm_then_time`)
    then timed, in ``order``, the first two always, a next one only where the time spent so far plus
    its predicted cost stays within max(``forwards`` × T(the first), ``seconds``); then more timed rounds
    of the timed sizes while the budget lasts, and one whatever the budget where a size needed more than
    one warm-up (the first of a process: a size timed early may have paid for a later one's packing); at
    most REPEATS rounds in all, the fastest of each size kept. Time is counted in
    steady forwards (a warm-up at its size's timed cost): what a size's first forwards pay once (a
    kernel's trials and packed weights, a compile) decoding would pay at its first step there too.
    ``forward``, ``hidden``: as :class:`VerifyRig`. -> the table of the sizes timed."""
    rig = VerifyRig(target, prefix, forward, hidden)
    times: dict[int, list[float]] = {}
    spent, budget, warming = 0.0, None, False
    for n in order:
        if len(times) >= 2:
            fit = LatencyTable(tuple(sorted(times)), tuple(times[k][0] for k in sorted(times)))
            if spent + 2 * fit.at(n) > budget:
                break
        timed, runs = warm_then_time(rig, n)
        warming = warming or runs > 2  # a size needed more than one warm-up: the process was still preparing
        spent += runs * timed
        times[n] = [timed]
        budget = budget if budget is not None else max(forwards * timed, seconds)
    for round_ in range(REPEATS - 1):  # where the pass was still preparing (packing weights in its forwards),
        round_cost = sum(min(t) for t in times.values())  # a size timed early may have paid for a later one:
        if (round_ > 0 or not warming) and spent + round_cost > budget:  # one more round, whatever the budget
            break
        for n in times:
            times[n].append(rig.run(n))
        spent += round_cost
    sizes = tuple(sorted(times))
    return LatencyTable(sizes, tuple(min(times[n]) for n in sizes))  # load only ever adds time


def measure_drafter(drafter, vocab: int, device, widths=DRAFT_WIDTHS, prefix: int = CALIBRATION_PREFIX,
                    repeats: int = DRAFTER_REPEATS, hidden_size: int | None = None) -> tuple[float, tuple[float, ...]]:
    """Time a (scratch) drafter through its protocol: (root_probs seconds, expand seconds per width).

    Each round commits one more token (``root_probs``: the catch-up of a step), expands ``w``
    children of the root in ONE call, and commits none of them, exactly as a step that accepts
    nothing. A drafter that ``wants_hidden_states`` is handed zero features [n, hidden_size] where
    the decoding loop would hand the target's. The first round warms up; medians of the rest."""
    sequence = (torch.arange(prefix, dtype=torch.long) * 7 % vocab).to(device)
    roots: list[float] = []
    layers: dict[int, list[float]] = {w: [] for w in widths}

    def features(n: int) -> None:  # as the loop does: the prompt's but the root's, then 1 + accepted per step
        if drafter.wants_hidden_states:
            drafter.add_features(torch.zeros(n, hidden_size, device=device))

    with torch.inference_mode():
        features(prefix - 1)
        drafter.root_probs(sequence)  # the prefill
        for round_ in range(repeats + 1):
            for w in widths:
                token = torch.tensor([(len(sequence) * 5 + 1) % vocab], dtype=torch.long, device=device)
                sequence = torch.cat([sequence, token])
                features(1)
                start = time.perf_counter()
                q = drafter.root_probs(sequence)
                _sync(q.device)
                root_end = time.perf_counter()
                top = torch.topk(q.float(), min(w, q.shape[-1])).indices.to(device)
                pool = DraftTree(top, torch.full_like(top, -1), torch.ones(len(top), device=device))
                frontier = torch.arange(len(top), device=device)
                expand_start = time.perf_counter()
                out = drafter.expand_probs(pool, frontier)  # what decoding calls
                _sync(out.device)
                end = time.perf_counter()
                drafter.commit([])
                if round_ > 0:
                    roots.append(root_end - start)
                    layers[w].append(end - expand_start)
    return _median(roots), tuple(_median(layers[w]) for w in widths)


def lower_envelope(times) -> tuple[float, ...]:
    """T(n) := min over m >= n of the measured T(m): non-decreasing in n, and robust to spikes
    (a busy machine only ever adds time to a measurement)."""
    out, low = [], float("inf")
    for t in reversed(list(times)):
        low = min(low, t)
        out.append(low)
    return tuple(reversed(out))


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
                 forward=None) -> Callable[[], BudgetPolicy]:
    """Makes the step policy of each batch row for ``config``: :class:`FixedPolicy`, or for
    ``nodes``/``threshold="auto"`` an :class:`AutoPolicy` on the latency model of ``target`` and
    the drafter (see :func:`calibrate`: measured once, through ``forward``, shared by every row and
    later call)."""
    if config.nodes != "auto" and config.threshold != "auto":
        return lambda: FixedPolicy(config)
    latency = calibrate(target, drafter, new_drafter, forward=forward)
    return lambda: AutoPolicy(config, latency)


def make_policy(config: TreeConfig, target, drafter=None, new_drafter: Callable[[], object] | None = None) -> BudgetPolicy:
    """One step policy for ``config`` (see :func:`policy_maker`)."""
    return policy_maker(config, target, drafter, new_drafter)()


__all__ = ["CALIBRATION_PREFIX", "CALIBRATION_VERSION", "DRAFT_WIDTHS", "MIN_CALIBRATION_PREFIX", "REPEATS",
           "VERIFY_NODES", "cache_dir", "cache_mode", "calibrate", "calibration_key", "calibration_prefix",
           "clear_calibrations", "drafter_fingerprint", "forward_kind", "from_json", "known_latency", "lower_envelope", "make_policy", "policy_maker",
           "measure", "measure_drafter", "measure_verify", "measure_verify_budgeted", "model_fingerprint",
           "read_cached", "to_json", "VerifyRig", "warm_then_time", "with_fitted_sizes", "write_cached"]
