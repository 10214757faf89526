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

so it is used up to :data:`MAX_ROWS` rows. Inside a ``with weight_major(*models):`` block, the
calls to ``torch.nn.functional.linear`` (which every ``nn.Linear`` makes) that THIS thread makes go
through :func:`weight_major_linear`: the block pushes a ``torch.overrides.TorchFunctionMode``, and
torch keeps those modes per thread. Nothing of torch is replaced: other threads (a user's own code
beside a decode running in ``Thread(target=model.generate)``) keep the stock path, and a patch of
``torch.nn.functional.linear`` made by anyone, before or during the block, stays in place (a
patched function that calls the original is still seen by the mode). The block does nothing when
none of ``models`` holds a float32 weight matrix on the CPU (a GPU or bf16 model); with no models
at all it always applies (plain decoding: ``with weight_major(): model.generate(...)``).
Float32 CPU inputs of 1..MAX_ROWS rows may take the weight-major path (below); every other call
passes through unchanged. Results agree with ``F.linear`` to float32 rounding, as any two GEMM
kernels do; the greedy-equality tests and benchmarks run with it on.

What the mode catches: every ``nn.Linear`` (Llama, Qwen, Mistral, Gemma, Phi, OPT, every LM head).
GPT-2's ``Conv1D`` layers call ``torch.addmm`` with a [in, out] weight, which the mode passes through
unchanged (GPT-2 gains only in its LM head). The price: while a block is open, every torch call of
the thread goes through the mode's Python handler, 1–4 µs each (a micro-benchmark on the project's
loaded 2-core machine; a SmolLM2-135M decode makes about 99,000 torch calls for 40 tokens), which is
why the block stays off for models it cannot help. DESIGN.md has the one end-to-end measurement.

The one-row case makes plain decoding faster too: ``with weight_major(): model.generate(...)``.
The benchmark's ``plain-wm`` method measures exactly that, so opttree's speed-up can be read
without this kernel's share.

Other CPUs and BLAS builds may not gain, so by default (``OPTTREE_WEIGHT_MAJOR=auto``) the
first ``2 * TRIALS`` products of each (torch threads, rows, out, in) in the process alternate between
the two paths, timed where they run, and the faster median is taken from then on (:func:`decisions`
shows the choices). They are timed inside the model's forward on purpose: there the weights come from
memory, as in decoding. Timed alone, with its weight hot in cache, a one-row product favours
``F.linear`` (19 µs vs 27 µs for a 576×576 weight here), the opposite of what a decoding step sees.
``OPTTREE_WEIGHT_MAJOR=on`` skips the trials and always takes the weight-major path; ``off``
leaves ``F.linear`` alone (no mode is pushed).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
import time
import types

import torch
from torch.overrides import TorchFunctionMode

MAX_ROWS = 8  # beyond this F.linear was as fast or faster (table above)
TRIALS = 3  # timed runs of each path per (threads, rows, out, in) before "auto" picks one

Key = tuple[int, int, int, int]  # (torch threads, rows, out, in)

F_LINEAR = torch._C._nn.linear  # the builtin behind torch.nn.functional.linear: what the mode looks for
_linear = F_LINEAR  # the stock path (tests swap it to count its calls)
_lock = threading.Lock()  # guards _faster and _trials: decodes in several threads share them
_faster: dict[Key, bool] = {}  # key -> weight-major was faster
_trials: dict[Key, tuple[list[float], list[float]]] = {}  # key -> seconds of (F.linear, weight-major) runs


class _ThreadState(threading.local):
    open = False  # this thread has a block open (a mode pushed, or models' linears swapped)
    auto = True  # that block's OPTTREE_WEIGHT_MAJOR is "auto" (else "on")


_this_thread = _ThreadState()

_ALIASES = {"0": "off", "false": "off", "no": "off", "1": "on", "true": "on", "yes": "on"}


def mode() -> str:
    """``OPTTREE_WEIGHT_MAJOR``: "auto" (the default: time both paths per shape), "on" or "off"."""
    value = os.environ.get("OPTTREE_WEIGHT_MAJOR", "auto").strip().lower()
    value = _ALIASES.get(value, value)
    if value not in ("auto", "on", "off"):
        raise ValueError(f"OPTTREE_WEIGHT_MAJOR={value!r}: set it to auto, on or off")
    return value


def decisions() -> dict[Key, bool]:
    """The choices made so far in ``auto`` mode: ``{(threads, rows, out, in): weight-major was faster}``."""
    with _lock:
        return dict(_faster)


def active() -> bool:
    """Whether this thread's linears currently go through :func:`weight_major_linear`."""
    return _this_thread.open


def helps(*models) -> bool:
    """Whether any of ``models`` (``torch.nn.Module``; anything else holds no weights of its own
    here and is skipped) has a float32 weight matrix on the CPU, i.e. linears the kernel can take."""
    return any(p.dim() == 2 and p.dtype == torch.float32 and p.device.type == "cpu"
               for m in models if isinstance(m, torch.nn.Module) for p in m.parameters())


def _weight_major_mm(flat: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``flat`` [rows, in] @ ``weight``.T [in, out] -> [rows, out], as ``(weight @ flat.T).T``."""
    rows = flat.shape[0]
    if rows == 1:
        flat = torch.cat([flat, flat])  # [2, in]: a GEMM, not the single-threaded matrix-vector path
    return torch.mm(weight, flat.T).T[:rows]


def _record(key: Key, ours: bool, seconds: float) -> None:
    """Add one timed run of a path; after TRIALS runs of each, the faster median goes to ``_faster``.
    A run that finishes after another thread decided ``key`` is dropped."""
    with _lock:
        if key in _faster:
            return
        times = _trials.setdefault(key, ([], []))
        times[ours].append(seconds)
        if min(len(times[0]), len(times[1])) >= TRIALS:
            _faster[key] = statistics.median(times[1]) < statistics.median(times[0])
            del _trials[key]


def _next_is_ours(key: Key) -> bool:
    """The path with fewer timed runs so far for ``key`` (F.linear first)."""
    with _lock:
        times = _trials.get(key, ((), ()))
        return len(times[1]) < len(times[0])


def _trial(key: Key, flat: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """One product ``flat @ weight.T`` [rows, out], timed, by the path with fewer runs for ``key``."""
    ours = _next_is_ours(key)
    t = time.perf_counter()
    out = _weight_major_mm(flat, weight) if ours else _linear(flat, weight)
    _record(key, ours, time.perf_counter() - t)
    return out


def weight_major_linear(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                        auto: bool = True) -> torch.Tensor:
    """``F.linear(input, weight, bias)`` [..., out] (same argument names); for float32 CPU inputs of
    1..MAX_ROWS rows it is computed as ``(weight @ input.T).T`` (with ``auto``: where that was timed
    faster, at this thread count)."""
    x = input
    rows = x.numel() // x.shape[-1] if x.dim() and x.shape[-1] else 0
    if (not 1 <= rows <= MAX_ROWS or x.device.type != "cpu" or x.dtype != torch.float32
            or weight.dtype != torch.float32 or weight.dim() != 2):
        return _linear(x, weight, bias)
    flat = x.reshape(rows, -1)  # [rows, in]
    if auto:
        key = (torch.get_num_threads(), rows, *weight.shape)
        won = _faster.get(key)  # one dict read, atomic: no lock on the hot path
        if won is False:
            return _linear(x, weight, bias)
        out = _trial(key, flat, weight) if won is None else _weight_major_mm(flat, weight)
    else:
        out = _weight_major_mm(flat, weight)  # [rows, out]
    if bias is not None:
        out = out + bias
    return out.contiguous().reshape(*x.shape[:-1], weight.shape[0])


def linear(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` for opttree's own functional products, which no block can swap because they are
    no ``nn.Linear`` (a feature head's output over its kept tokens, [k, H] x [K, H]^T): in a thread
    with a block open, :func:`weight_major_linear` as a swapped layer would take it; elsewhere the
    stock path. A [16,384, 576] head output in float32 (38 MB, read whole by every call) took
    10.6 / 13.9 / 13.6 ms by ``F.linear`` and 5.3 / 6.4 / 7.0 ms weight-major for 2 / 4 / 8 rows
    (AMD EPYC AVX2, 1 thread; benchmarks/RESULTS.md)."""
    if _this_thread.open:
        return weight_major_linear(input, weight, bias, auto=_this_thread.auto)
    return _linear(input, weight, bias)


class WeightMajorMode(TorchFunctionMode):
    """This thread's ``F.linear`` calls on plain tensors through :func:`weight_major_linear`; every
    other torch call, and a linear involving a tensor subclass with its own ``__torch_function__``
    (``types`` not empty), unchanged. Torch pops the mode while its handler runs, so the products
    inside do not recurse."""

    def __init__(self, auto: bool):
        super().__init__()
        self.auto = auto

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F_LINEAR and not types:
            return weight_major_linear(*args, **(kwargs or {}), auto=self.auto)
        return func(*args, **(kwargs or {}))


_swap_lock = threading.Lock()  # guards _swaps: concurrent blocks may share models
_swaps: dict[int, list] = {}  # id(module) -> [module, open blocks using it]


def swappable(*models) -> list[torch.nn.Linear]:
    """The plain ``nn.Linear`` layers of ``models`` with a float32 CPU weight whose ``forward`` is
    the class's own (a layer someone already wrapped, e.g. by accelerate's hooks, is left alone)."""
    return [m for model in models if isinstance(model, torch.nn.Module) for m in model.modules()
            if type(m) is torch.nn.Linear and "forward" not in m.__dict__
            and m.weight.dtype == torch.float32 and m.weight.device.type == "cpu"]


def _fast_forward(self: torch.nn.Linear, input: torch.Tensor) -> torch.Tensor:
    """A swapped-in ``nn.Linear.forward``: weight-major in a thread with a block open, stock elsewhere."""
    if _this_thread.open:
        return weight_major_linear(input, self.weight, self.bias, auto=_this_thread.auto)
    return torch.nn.Linear.forward(self, input)


def _swap_in(layers: list[torch.nn.Linear]) -> None:
    with _swap_lock:
        for m in layers:
            entry = _swaps.setdefault(id(m), [m, 0])
            if entry[1] == 0:
                m.forward = types.MethodType(_fast_forward, m)
            entry[1] += 1


def _swap_out(layers: list[torch.nn.Linear]) -> None:
    with _swap_lock:
        for m in layers:
            entry = _swaps[id(m)]
            entry[1] -= 1
            if entry[1] == 0:
                del m.forward  # the class's forward again
                del _swaps[id(m)]


@contextlib.contextmanager
def weight_major(*models, on: bool = True):
    """Within the block, this thread's few-row float32 CPU linears go weight-major
    (:func:`weight_major_linear`), unless ``on`` is False, ``OPTTREE_WEIGHT_MAJOR=off``, or
    ``models`` are given and none of them has a float32 CPU weight (:func:`helps`).

    With ``models`` (opttree's own loops): for the block, the ``forward`` of each of their plain
    ``nn.Linear`` layers is swapped for one that takes the kernel in a thread with a block open and
    the stock path in any other thread; restored when the last block using the layer closes.
    Only those layers pay anything (one Python call each). Without models (``with weight_major():
    model.generate(...)``): a per-thread ``TorchFunctionMode`` catches every ``F.linear`` of the
    thread, at the price of a Python handler on EVERY torch call of the thread.
    A block opened inside another of this thread adds nothing."""
    chosen = mode()
    if not on or chosen == "off" or active() or (models and not helps(*models)):
        yield
        return
    _this_thread.open, _this_thread.auto = True, chosen == "auto"
    try:
        if models:
            layers = swappable(*models)
            _swap_in(layers)
            try:
                yield
            finally:
                _swap_out(layers)
        else:
            with WeightMajorMode(auto=chosen == "auto"):
                yield
    finally:
        _this_thread.open = False
