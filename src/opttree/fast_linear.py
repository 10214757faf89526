"""Few-row float32 linears on the CPU, taken weight-major: every forward of a speculative step.

A verify runs the target over the root and a handful of tree nodes, and a draft model drafts a
few nodes per layer, so every linear layer gets an input ``x`` [n, in] of a few rows. With the MKL
build of torch measured here (2-core AVX-512 x86-64, torch 2.13), ``F.linear`` is slow for exactly
these shapes: one row goes to a single-threaded matrix-vector product, and 2–8 rows cost up to
twice one row. The same product taken weight-major, ``(W @ x.T).T``, runs as a multi-threaded GEMM
that reads ``W`` once. One row is padded to two.

SmolLM2-135M (fp32, 2 threads, 256-token cache), one forward of n new tokens, median ms:

| n | 1 | 2 | 3 | 4 | 6 | 8 | 12 | 16 |
|---|---|---|---|---|---|---|---|---|
| ``F.linear`` | 44.3 | 66.9 | 81.7 | 59.5 | 59.1 | 66.2 | 59.9 | 74.1 |
| weight-major | 25.6 | 27.6 | 32.3 | 29.2 | 44.4 | 51.0 | 73.7 | 66.9 |

so it is used up to :data:`MAX_ROWS` rows. ``weight_major()`` routes ``torch.nn.functional.linear``
(which every ``nn.Linear`` calls) through :func:`weight_major_linear` while its ``with`` block runs
(opttree's decoding loops and its latency calibration run inside one). Float32 CPU inputs of
1..MAX_ROWS rows may take the weight-major path (below); every other call passes through
unchanged. Results agree with ``F.linear`` to float32 rounding, as any two GEMM kernels do; the
greedy-equality tests and benchmarks run with it on.

The one-row case makes plain decoding faster too: ``with weight_major(): model.generate(...)``.
The benchmark's ``plain-wm`` method measures exactly that, so opttree's speed-up can be read
without this kernel's share.

Other CPUs and BLAS builds may not gain, so by default (``OPTTREE_WEIGHT_MAJOR=auto``) the
first ``2 * TRIALS`` products of each (rows, out, in) in the process alternate between the two
paths, timed where they run, and the faster median is taken from then on (:func:`decisions` shows
the choices). They are timed inside the model's forward on purpose: there the weights come from
memory, as in decoding. Timed alone, with its weight hot in cache, a one-row product favours
``F.linear`` (19 µs vs 27 µs for a 576×576 weight here), the opposite of what a decoding step sees.
``OPTTREE_WEIGHT_MAJOR=on`` skips the trials and always takes the weight-major path; ``off``
leaves ``F.linear`` alone.

The patch is process-wide while any block is open (a linear in another thread then takes the same
path, with the same results); nested and concurrent blocks are counted, so the original function
is back once the last one closes.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
import time

import torch

MAX_ROWS = 8  # beyond this F.linear was as fast or faster (table above)

_linear = torch.nn.functional.linear
_lock = threading.Lock()
_open_blocks = 0
_timing = True  # "auto": pick the path per shape by timing both (set when a block opens)
TRIALS = 3  # timed runs of each path per (rows, out, in) before "auto" picks one
_faster: dict[tuple[int, int, int], bool] = {}  # (rows, out, in) -> weight-major was faster
_trials: dict[tuple[int, int, int], tuple[list[float], list[float]]] = {}

_ALIASES = {"0": "off", "false": "off", "no": "off", "1": "on", "true": "on", "yes": "on"}


def mode() -> str:
    """``OPTTREE_WEIGHT_MAJOR``: "auto" (the default: time both paths per shape), "on" or "off"."""
    value = os.environ.get("OPTTREE_WEIGHT_MAJOR", "auto").strip().lower()
    value = _ALIASES.get(value, value)
    if value not in ("auto", "on", "off"):
        raise ValueError(f"OPTTREE_WEIGHT_MAJOR={value!r}: set it to auto, on or off")
    return value


def decisions() -> dict[tuple[int, int, int], bool]:
    """The choices made so far in ``auto`` mode: ``{(rows, out, in): weight-major was faster}``."""
    return dict(_faster)


def _weight_major_mm(flat: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``flat`` [rows, in] @ ``weight``.T [in, out] -> [rows, out], as ``(weight @ flat.T).T``."""
    rows = flat.shape[0]
    if rows == 1:
        flat = torch.cat([flat, flat])  # [2, in]: a GEMM, not the single-threaded matrix-vector path
    return torch.mm(weight, flat.T).T[:rows]


def _trial(key: tuple[int, int, int], flat: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """One product ``flat @ weight.T`` [rows, out] taken by the path with fewer timed runs so far for
    ``key``; after TRIALS runs of each, the faster median is recorded in ``_faster``."""
    times = _trials.setdefault(key, ([], []))  # seconds of (F.linear, weight-major) runs
    ours = len(times[1]) < len(times[0])
    t = time.perf_counter()
    out = _weight_major_mm(flat, weight) if ours else _linear(flat, weight)
    times[ours].append(time.perf_counter() - t)
    if min(len(times[0]), len(times[1])) >= TRIALS:
        _faster[key] = statistics.median(times[1]) < statistics.median(times[0])
        _trials.pop(key, None)
    return out


def weight_major_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` [..., out]; for float32 CPU inputs of 1..MAX_ROWS rows it is
    computed as ``(weight @ x.T).T`` (in ``auto`` mode: where that was timed faster)."""
    rows = x.numel() // x.shape[-1] if x.dim() and x.shape[-1] else 0
    if (not 1 <= rows <= MAX_ROWS or x.device.type != "cpu" or x.dtype != torch.float32
            or weight.dtype != torch.float32 or weight.dim() != 2):
        return _linear(x, weight, bias)
    flat = x.reshape(rows, -1)  # [rows, in]
    if _timing:
        key = (rows, *weight.shape)
        won = _faster.get(key)
        if won is False:
            return _linear(x, weight, bias)
        out = _trial(key, flat, weight) if won is None else _weight_major_mm(flat, weight)
    else:
        out = _weight_major_mm(flat, weight)  # [rows, out]
    if bias is not None:
        out = out + bias
    return out.contiguous().reshape(*x.shape[:-1], weight.shape[0])


@contextlib.contextmanager
def weight_major(on: bool = True):
    """Within the block, ``torch.nn.functional.linear`` is :func:`weight_major_linear` (unless
    ``on`` is False or ``OPTTREE_WEIGHT_MAJOR=off``)."""
    global _open_blocks, _timing
    chosen = mode()
    if not on or chosen == "off":
        yield
        return
    with _lock:
        _open_blocks += 1
        _timing = chosen == "auto"
        torch.nn.functional.linear = weight_major_linear
    try:
        yield
    finally:
        with _lock:
            _open_blocks -= 1
            if _open_blocks == 0:
                torch.nn.functional.linear = _linear
