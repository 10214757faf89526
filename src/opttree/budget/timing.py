"""Timing the pair on this machine, as decoding runs it: :func:`measure`, a fresh
:class:`~opttree.budget.latency.LatencyModel` from the target's verification forward over a few tree
sizes (:func:`measure_verify_budgeted`, within a budget; :func:`measure_verify`, every size, for the
benchmarks) and a drafter timed through its own protocol (:func:`measure_drafter`). Where the model
is kept: :mod:`opttree.budget.calibration`."""

from __future__ import annotations

import logging
import time
import weakref
from typing import Callable

import torch

from ..hf.compiled import ScratchTarget
from ..hf.width import carried_width, vocab_size
from ..kernels import linears
from ..tree.draft_tree import DraftTree
from ..tree.layout import MaskLayout
from ..tree.masks import ForwardInputs, verification_inputs
from ..tree.sizes import VERIFY_SIZES, padded_size
from .latency import AUTO_MAX_NODES, LatencyModel, LatencyTable, complete_table

logger = logging.getLogger(__name__)

# tree sizes timed at calibration, in nodes: the node counts that fill each verification size (rows,
# tree.sizes.VERIFY_SIZES: the root and n nodes), up to AUTO_MAX_NODES; T is a step between them
VERIFY_NODES = tuple(rows - 1 for rows in VERIFY_SIZES if rows - 1 <= AUTO_MAX_NODES)
DRAFT_WIDTHS = (1, 2, 4, 8, 16, 32)  # layer widths timed at calibration
CALIBRATION_PREFIX = 32  # committed tokens under the timed forwards (a longer context's cost is learnt online)
SETTLE_FORWARDS = 8  # forwards a size runs at most while the CPU kernels still choose or pack in them
REPEATS = 5  # timed rounds per size (after one warm-up round); sizes interleaved within a round
# The sizes calibration times, in this order, while its budget lasts (the first two always): the
# ends of the range that matters first; the others are fitted between them (latency.complete_table)
# and replaced by what the steps measure once a step verifies at them (LatencyModel.observe).
TIMING_ORDER = (0, 15, 63, 3, 31, 7, 1)
BUDGET_FORWARDS = 6.0  # the verification timing's budget, in forwards of one row (warm-ups included) ...
BUDGET_SECONDS = 0.5  # ... or this many seconds, whichever is more (a GPU times every size in well under it)
DRAFTER_REPEATS = 3  # timed rounds of the drafter's protocol


def measure(target, new_drafter: Callable[[], object] | None, prefix: int = CALIBRATION_PREFIX,
            forward=None, hidden: bool = False, kernels=(), slots: int | None = None) -> LatencyModel:
    """A fresh LatencyModel: T(n) on the target, through ``forward`` (the verification forward decoding
    runs; ``hidden``: it returns the hidden states), the sizes not timed fitted; the drafter through a
    scratch one from ``new_drafter()`` (without one, or if timing it fails, the draft cost is learnt
    from the steps). ``kernels``: the modules whose few-row linears run through opttree's CPU kernels
    while it times (:func:`opttree.kernels.linears.fast_linears`), as in the decoding loops. ``slots``: the
    static cache a compiled ``forward`` decodes on (:class:`VerifyRig`)."""
    with linears.fast_linears(*kernels, on=bool(kernels)):
        timed = measure_verify_budgeted(target, prefix=prefix, forward=forward, hidden=hidden, slots=slots)
        drafted = None if new_drafter is None else time_drafter(new_drafter, target, prefix)
    latency = LatencyModel(verify=complete_table(timed, VERIFY_NODES), verify_measured=frozenset(timed.sizes))
    if drafted is not None:
        latency.root_seconds, latency.layer = drafted
    logger.info("calibration at %d tokens (%s): %s (the other sizes fitted); draft layer %s", prefix,
                forward_kind(forward),
                ", ".join(f"T({n})={t * 1e3:.1f}ms" for n, t in zip(timed.sizes, timed.seconds)),
                "unmeasured" if latency.layer is None else
                ", ".join(f"c({w})={t * 1e3:.1f}ms" for w, t in zip(latency.layer.sizes, latency.layer.seconds)))
    return latency


def time_drafter(new_drafter: Callable[[], object], target, prefix: int) -> tuple[float, LatencyTable] | None:
    """(the catch-up's seconds, c(w) per layer width) of a scratch drafter from ``new_drafter()``, fed as
    it would be beside ``target``; None, with a warning, where it cannot run on synthetic text."""
    try:
        root, layers = measure_drafter(new_drafter(), vocab_size(target), target.device, prefix=prefix,
                                       hidden_size=carried_width(target.config))
    except Exception as error:  # a drafter that cannot run on synthetic text: learn online instead
        logger.warning("could not time the drafter (%s: %s); learning its cost from the steps",
                       type(error).__name__, error)
        return None
    return root, LatencyTable(DRAFT_WIDTHS, lower_envelope(layers))


def forward_kind(forward) -> str:
    """How the verification forward runs: "compiled" (generate()'s compiled callable) or "eager"."""
    return "compiled" if forward is not None and forward.compiles else "eager"


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _median(xs) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2]


class VerifyRig:
    """A target prefilled with ``prefix`` made-up tokens, ready to time verification forwards as
    decoding runs them (:class:`~opttree.hf.compiled.ScratchTarget`): ``run(n)`` is one forward over the
    root and ``n`` tree nodes (children of the root, padded to their verification size; a sliding-window
    or chunked layer holding its window, masked per layer type), the cache cropped back after it; its seconds."""

    def __init__(self, target, prefix: int, forward=None, hidden: bool = False, slots: int | None = None):
        self.prefix, self.dtype, self.device = prefix, target.dtype, target.device
        self.vocab = int(target.get_input_embeddings().weight.shape[0])
        self.layout = MaskLayout.of(target.config)
        self.inputs: dict[int, ForwardInputs] = {}
        self.scratch = ScratchTarget.of(target, prefix, forward, hidden, slots)

    @property
    def cache(self):
        """The scratch cache the forwards run on."""
        return self.scratch.cache

    def _inputs(self, n: int) -> ForwardInputs:
        if n not in self.inputs:
            device = self.device
            tree = DraftTree((torch.arange(n, dtype=torch.long) % self.vocab).to(device),
                             torch.full((n,), -1, dtype=torch.long, device=device), torch.ones(n, device=device))
            self.inputs[n] = verification_inputs(1, tree, self.prefix, self.dtype, size=padded_size(n + 1),
                                                 kv_len=self.scratch.kv_len, layout=self.layout,
                                                 dropped=self.scratch.dropped)
        return self.inputs[n]

    def run(self, n: int) -> float:
        """One verification forward of ``n`` nodes, decoding's own (:meth:`~opttree.hf.compiled.ScratchTarget.run`):
        its seconds. A compiled forward's graph of that size and cache length is then this process's
        (:func:`warm_compiled` does not run it again)."""
        with torch.inference_mode():  # its inputs too: a compiled graph guards on inference tensors, and
            inputs = self._inputs(n)  # decoding's are (built outside, each size compiled again in decoding)
            seconds = self.scratch.run(inputs)
        if self.scratch.forward is not None:
            _WARMED.setdefault(self.scratch.target, set()).add((self.scratch.kv_len, self.scratch.hidden, n))
        return seconds


# target -> {(slots, hidden, nodes)}: the compiled verification graphs this process has run (warm_compiled)
_WARMED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def warm_compiled(target, forward, sizes, slots: int, hidden: bool, prefix: int = CALIBRATION_PREFIX) -> list[int]:
    """Run a compiled verification ``forward`` once at each of ``sizes`` (nodes) on a static cache of ``slots``
    slots (``hidden``: returning the hidden states, as decoding asks), where this process has not yet: the graphs
    decoding will replay are compiled before its first step, not mid-answer (a calibration read from its file, or
    measured on another cache length, compiled none of them here). -> the sizes run."""
    done = _WARMED.get(target, set())
    todo = [n for n in sizes if (slots, hidden, n) not in done]
    if todo:
        rig = VerifyRig(target, prefix, forward, hidden, slots)
        for n in todo:
            rig.run(n)  # recorded in _WARMED by the rig
    return todo


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
    their weights, or compile its graph), at most ``most``, and until one ran with no CPU kernel still
    choosing or packing (:func:`opttree.kernels.linears.preparing` unchanged), at most SETTLE_FORWARDS.
    The fastest after the first is the timed one: SmolLM2 at 16 rows in float32 on a Zen 4 took
    0.3-0.7 s a forward while its kernels chose and packed, 0.1 s after."""
    runs = []
    while True:
        before = linears.preparing()
        runs.append(rig.run(n))
        clean = linears.preparing() == before
        if len(runs) < 2:
            continue
        faster = len(runs) < most and runs[-1] < 0.8 * runs[-2]
        choosing = len(runs) < SETTLE_FORWARDS and not clean
        if not (faster or choosing):
            return min(runs[1:]), len(runs)


def measure_verify_budgeted(target, prefix: int = CALIBRATION_PREFIX, order=TIMING_ORDER,
                            forwards: float = BUDGET_FORWARDS, seconds: float = BUDGET_SECONDS, forward=None,
                            hidden: bool = False, slots: int | None = None) -> LatencyTable:
    """T(n) at as many sizes of ``order`` as a budget allows: each size warmed (:func:`warm_then_time`)
    then timed, in ``order``, the first two always, a next one only where the time spent so far plus
    its predicted cost stays within max(``forwards`` × T(the first), ``seconds``); then more timed rounds
    of the timed sizes while the budget lasts, and one whatever the budget where a size needed more than
    one warm-up (the first of a process: a size timed early may have paid for a later one's packing); at
    most REPEATS rounds in all, the fastest of each size kept. Time is counted in
    steady forwards (a warm-up at its size's timed cost): what a size's first forwards pay once (a
    kernel's trials and packed weights, a compile) decoding would pay at its first step there too.
    ``forward``, ``hidden``, ``slots``: as :class:`VerifyRig`. -> the table of the sizes timed."""
    rig = VerifyRig(target, prefix, forward, hidden, slots)
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


__all__ = ["BUDGET_FORWARDS", "BUDGET_SECONDS", "CALIBRATION_PREFIX", "DRAFTER_REPEATS", "DRAFT_WIDTHS", "REPEATS",
           "TIMING_ORDER", "VERIFY_NODES", "VerifyRig", "forward_kind", "lower_envelope", "measure", "measure_drafter",
           "measure_verify", "time_drafter",
           "measure_verify_budgeted", "warm_compiled", "warm_then_time"]
