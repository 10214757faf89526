"""The linears of opttree's own forwards on the CPU, each shape through the kernel measured fastest here.

A verification forward runs the target over a few rows (the root, a tree, dummy rows up to one of
:data:`opttree.tree.sizes.VERIFY_SIZES`), and a draft model's layers over a few more, so every
linear gets an input ``x`` [rows, in] of 1 to 64 rows. Float32 and bfloat16 forwards of that shape
stream the weights from memory once, and should cost about what one row costs; torch's stock GEMM
often does not (benchmarks/RESULTS.md, "Flat verification"). The kernels:

- ``"stock"``: ``F.linear``, whatever GEMM the torch build picks;
- ``"weight_major"`` (float32): ``(W @ x.T).T``, the weight as the GEMM's large operand, read once
  (one row padded to two), copied to ``F.linear``'s row-major layout;
- ``"onednn"``: oneDNN's matmul on a copy of the weight reordered once into its blocked layout
  (``torch.ops.mkldnn._reorder_linear_weight`` / ``_linear_pointwise``, what Inductor emits for a
  frozen linear); it serves any row count. The copy costs one more weight's memory, made at the
  first product that tries it and kept while the weight lives, and made again if the weight changes
  in place;
- ``"onednn_pad"`` (fewer than PAD_ROWS rows): the same, the rows padded with zeros to PAD_ROWS
  (oneDNN's few-row matmul can cost more than PAD_ROWS rows').

Only the kernels this CPU and torch build can run are offered (:func:`candidates`, from
:func:`opttree.kernels.cpu.cpu_support`: oneDNN's bfloat16 kernels need AVX-512 or AVX-NE-CONVERT).
A kernel that fails anyway in a trial is dropped from that shape's candidates and the others still
compete. MKL's packed GEMM (``torch.ops.mkl._mkl_linear``) is no candidate: it needs a copy per row
count and lost to oneDNN at every shape measured (``benchmarks/kernel.py --products``).

Which kernel: ``OPTTREE_LINEAR=auto`` (the default) chooses per (dtype, threads, rows, out, in), so
per row count, stock always among the candidates (:mod:`opttree.kernels.choice`): the candidates are
timed TRIALS times each inside the real forwards, taking turns, and the fastest median serves the
key provisionally; after warm-up (once that kernel has met every weight of the key: packed, and
read from memory) they are timed again and the fastest median of that round is kept for the process
(:func:`decisions`, :func:`settled`); in both rounds stock stays unless the fastest is clearly faster
(:func:`opttree.kernels.choice.clearly_faster`). Inside a forward the weights come from memory, as in decoding; a
micro-benchmark with a hot weight favours other kernels. ``OPTTREE_LINEAR=stock``, ``weight_major``,
``onednn`` or ``onednn_pad`` fixes the kernel where it applies (else stock). Results agree with
``F.linear`` to the dtype's rounding, as any two GEMM kernels do; a product whose kernel is stock
is ``F.linear``'s own call on the input as given.

Scope: nothing of torch is replaced. Inside ``with fast_linears(*models):`` the ``forward`` of each
plain ``nn.Linear`` of ``models`` with a float32 or bfloat16 CPU weight is swapped for one that
takes the chosen kernel in a thread with a block open and the stock path in any other thread; the
class's forward comes back when the last block using the layer closes (blocks are refcounted under a
lock). A layer whose ``forward`` someone already wrapped (accelerate's hooks) is left alone.
Without models (``with fast_linears(): model.generate(...)``, the bench's ``plain-fl`` method) a
per-thread ``TorchFunctionMode`` catches this thread's ``F.linear`` calls, at the price of a Python
handler on every torch call of the thread. Products of more than MAX_ROWS rows (a prompt's prefill)
always take the stock path.
"""

from __future__ import annotations

import contextlib
import os
import threading
import types
import weakref
from typing import Callable

import torch
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakTensorKeyDictionary

from .choice import TRIALS, Chooser, Key, pick
from .cpu import cpu_support, last_level_cache_bytes

MAX_ROWS = 64  # products of more rows (prefills) take the stock path
# A weight this big comes from memory even when multiplied several times in a row (bigger than any
# CPU's last-level cache): each round of its key's trials runs at one product, instead of one product
# per forward (an LM head, met once a forward, would otherwise take len(candidates) * TRIALS forwards).
# Where Linux lists the last-level cache, twice that is enough (in_place_bytes).
IN_PLACE_BYTES = 128 << 20
KERNELS = ("stock", "weight_major", "onednn", "onednn_pad")
DTYPES = (torch.float32, torch.bfloat16)

F_LINEAR = torch._C._nn.linear  # the builtin behind torch.nn.functional.linear: what the mode looks for
_stock = F_LINEAR  # the stock path (tests swap it to count its calls)


# ---------------------------------------------------------------------------------------------
# the kernels: (x [rows, in], weight [out, in], bias [out] | None) -> [rows, out]


def _weight_major(flat: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    rows = flat.shape[0]
    if rows == 1:
        flat = torch.cat([flat, flat])  # [2, in]: a GEMM, not the single-threaded matrix-vector path
    out = torch.mm(weight, flat.T).T[:rows].contiguous()  # F.linear's layout: a model may view its rows (Llama 4's rotary)
    return out if bias is None else out + bias


_packed = WeakTensorKeyDictionary()  # weight -> (its _version when packed, the packed copy)
_packed_lock = threading.Lock()
_packs = [0]  # copies made (preparing())


def packed_weight(weight: torch.Tensor) -> torch.Tensor:
    """``weight``'s oneDNN-reordered copy, made once and kept while ``weight`` lives (again when it
    changed in place)."""
    entry = _packed.get(weight)
    if entry is None or entry[0] != weight._version:
        with _packed_lock:
            entry = _packed.get(weight)
            if entry is None or entry[0] != weight._version:
                entry = (weight._version, torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 16))
                _packed[weight] = entry
                _packs[0] += 1
    return entry[1]


def is_packed(weight: torch.Tensor) -> bool:
    """Whether ``weight`` has a packed copy of its current values already (none is made)."""
    entry = _packed.get(weight)
    return entry is not None and entry[0] == weight._version


def _onednn(flat: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(flat, packed_weight(weight), bias, "none", [], "")


PACKED = ("onednn", "onednn_pad")  # the kernels that read a packed copy of the weight
PAD_ROWS = 4  # "onednn_pad" runs fewer rows as this many (oneDNN's few-row matmul can cost more than 4 rows')


def _onednn_pad(flat: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    rows = flat.shape[0]
    if rows >= PAD_ROWS:
        return _onednn(flat, weight, bias)
    padded = torch.nn.functional.pad(flat, (0, 0, 0, PAD_ROWS - rows))  # [PAD_ROWS, in], zero rows after
    return _onednn(padded, weight, bias)[:rows]


def _stock_kernel(flat: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return _stock(flat, weight, bias)


_KERNEL: dict[str, Callable] = {"stock": _stock_kernel, "weight_major": _weight_major, "onednn": _onednn,
                                "onednn_pad": _onednn_pad}


def candidates(dtype: torch.dtype, rows: int = PAD_ROWS) -> tuple[str, ...]:
    """The kernels that apply to a ``dtype`` CPU product of ``rows`` rows and that this CPU and torch
    build can run (:func:`~opttree.kernels.cpu.cpu_support`)."""
    support = cpu_support()
    runs = support.onednn_bf16 if dtype == torch.bfloat16 else support.onednn
    onednn = (("onednn",) + (("onednn_pad",) if rows < PAD_ROWS else ())) if runs else ()
    if dtype == torch.float32:
        return ("stock", "weight_major") + onednn
    if dtype == torch.bfloat16:
        return ("stock",) + onednn
    return ("stock",)


# ---------------------------------------------------------------------------------------------
# the choice


def mode() -> str:
    """``OPTTREE_LINEAR``: "auto" (the default: time the candidates per shape) or a kernel's name."""
    value = os.environ.get("OPTTREE_LINEAR", "auto").strip().lower()
    if value not in ("auto", *KERNELS):
        raise ValueError(f"OPTTREE_LINEAR={value!r}: set it to auto or one of {', '.join(KERNELS)}")
    return value


_choice = Chooser()  # this process's choices (kernels/choice.py); the tests give each test a fresh one


def decisions() -> dict[Key, str]:
    """The kernels ``auto`` takes now, provisional or final: ``{(dtype, threads, rows, out, in): kernel}``."""
    return _choice.decisions()


def settled() -> bool:
    """Whether every key met so far has its final kernel (its re-check done, none still trying)."""
    return _choice.settled()


def preparing() -> int:
    """A count that grows with every product not yet on its final kernel (a trial, a provisional one) and
    every weight packed: a forward that leaves it unchanged ran as a settled choice runs it."""
    return _choice.undecided + _packs[0]


def dropped() -> dict[Key, set[str]]:
    """The candidates that failed in a trial, per key: ``{(dtype, threads, rows, out, in): {kernel}}``."""
    with _choice.lock:
        return {key: set(names) for key, names in _choice.dropped.items()}


def forget_decisions() -> None:
    """Start the choice afresh (a benchmark that changes threads or kernels between runs)."""
    _choice.forget()
    with _swap_lock:
        for shapes in _stock_shapes.values():
            shapes.clear()


def _ready(weight: torch.Tensor) -> Callable[[str, bool], bool]:
    """Whether a candidate can be timed on a product of ``weight``: a oneDNN one packs the weight before
    the clock starts in the first trials (a one-time copy, no part of a product's cost) and in the
    re-check takes only a weight packed before (a copy packed just now is hot in the cache)."""
    def ready(name: str, second: bool) -> bool:
        if name not in PACKED or not cpu_support().onednn:
            return True
        if second:
            return is_packed(weight)
        try:
            packed_weight(weight)
        except (RuntimeError, NotImplementedError):
            pass  # the product fails the same way and drops the candidate
        return True
    return ready


def in_place_bytes(cache: int | None = None) -> int:
    """Bytes from which a weight's trials run at one product: IN_PLACE_BYTES, or twice the last-level cache
    (``cache``, default this CPU's) where less: such a weight streams from memory even back to back."""
    cache = last_level_cache_bytes() if cache is None else cache
    return min(IN_PLACE_BYTES, 2 * cache) if cache else IN_PLACE_BYTES


def _undecided(key: Key, dtype: torch.dtype, rows: int, flat, weight, bias) -> torch.Tensor:
    """A product of a key without a final kernel: its provisional kernel's, or a trial (kernels/choice.py)."""
    in_place = weight.numel() * weight.element_size() >= in_place_bytes()
    return _choice.product(key, candidates(dtype, rows), lambda name: _KERNEL[name](flat, weight, bias),
                           _ready(weight), id(weight), in_place)


def eligible_rows(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> int:
    """The rows of a CPU product of 1..MAX_ROWS rows in float32 or bfloat16 that a kernel here can take;
    0 for any other product (it takes the stock path)."""
    shape = input.shape
    rows = input.numel() // shape[-1] if len(shape) and shape[-1] else 0
    dtype = input.dtype
    if (not 1 <= rows <= MAX_ROWS or not input.is_cpu or dtype not in DTYPES or weight.dtype != dtype
            or weight.dim() != 2 or (bias is not None and bias.dtype != dtype)):
        return 0
    return rows


def fast_linear(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                auto: bool = True, kernel: str = "stock") -> torch.Tensor:
    """``F.linear(input, weight, bias)`` [..., out]: a CPU product of 1..MAX_ROWS rows in float32 or
    bfloat16 through the kernel chosen for its shape (``auto``) or through ``kernel``. A product whose
    kernel is stock calls the stock path on ``input`` as given (no reshapes: the hot path of plain decoding)."""
    rows = eligible_rows(input, weight, bias)
    if not rows:
        return _stock(input, weight, bias)
    shape, dtype = input.shape, input.dtype
    if auto:
        _choice.products += 1  # the re-check's clock (approximate under threads: it only says "later")
        key = (dtype, torch.get_num_threads(), rows, *weight.shape)
        name = _choice.chosen.get(key)  # one dict read, atomic: no lock on the hot path
        if name == "stock":
            return _stock(input, weight, bias)
    else:
        names = candidates(dtype, rows)
        name = "onednn" if kernel == "onednn_pad" and kernel not in names else kernel  # enough rows: no padding
        name = name if name in names else "stock"
    flat = input if len(shape) == 2 else input.reshape(rows, -1)  # [rows, in] (a view op only where it is needed)
    out = _KERNEL[name](flat, weight, bias) if name is not None else _undecided(key, dtype, rows, flat, weight, bias)
    return out if len(shape) == 2 else out.reshape(*shape[:-1], weight.shape[0])


def takes_stock(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, threads: int) -> bool:
    """Whether ``auto`` sends this product to the stock path for good at ``threads`` threads: no kernel
    here takes it, or its key's final kernel is stock."""
    rows = eligible_rows(input, weight, bias)
    return not rows or _choice.chosen.get((input.dtype, threads, rows, *weight.shape)) == "stock"


# ---------------------------------------------------------------------------------------------
# the scope: this thread's block, the call's models


class _ThreadState(threading.local):
    open = False  # this thread has a block open (a mode pushed, or models' linears swapped)
    auto = True  # that block's kernel is chosen by timing
    kernel = "stock"  # else the kernel it fixes


_this_thread = _ThreadState()


def active() -> bool:
    """Whether this thread's linears currently go through :func:`fast_linear`."""
    return _this_thread.open


def _in_block(input, weight, bias=None):
    return fast_linear(input, weight, bias, auto=_this_thread.auto, kernel=_this_thread.kernel)


def linear(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` for opttree's own functional products, which no block can swap because they are
    no ``nn.Linear`` (a feature head's output over its kept tokens, [k, H] x [K, H]^T): in a thread
    with a block open, the block's kernels; elsewhere the stock path."""
    if _this_thread.open:
        return _in_block(input, weight, bias)
    return _stock(input, weight, bias)


def helps(*models) -> bool:
    """Whether any of ``models`` (``torch.nn.Module``; anything else is skipped) has a float32 or
    bfloat16 weight matrix on the CPU, i.e. linears a kernel here can take."""
    return any(p.dim() == 2 and p.dtype in DTYPES and p.device.type == "cpu"
               for m in models if isinstance(m, torch.nn.Module) for p in m.parameters())


class FastLinearMode(TorchFunctionMode):
    """This thread's ``F.linear`` calls on plain tensors through :func:`fast_linear`; every other torch
    call, and a linear involving a tensor subclass with its own ``__torch_function__`` (``types`` not
    empty), unchanged. Torch pops the mode while its handler runs, so the products inside do not recurse."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F_LINEAR and not types:
            return _in_block(*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))


_swap_lock = threading.Lock()  # guards _swaps: concurrent blocks may share models
_swaps: dict[int, list] = {}  # id(module) -> [module, open blocks using it]


def swappable(*models) -> list[torch.nn.Linear]:
    """The plain ``nn.Linear`` layers of ``models`` with a float32 or bfloat16 CPU weight whose
    ``forward`` is the class's own (a layer someone already wrapped is left alone)."""
    return [m for model in models if isinstance(model, torch.nn.Module) for m in model.modules()
            if type(m) is torch.nn.Linear and "forward" not in m.__dict__
            and m.weight.dtype in DTYPES and m.weight.device.type == "cpu"]


STOCK_SHAPES = "_opttree_stock_shapes"  # a swapped layer's {input shape: threads} that take stock for good
_stock_shapes = weakref.WeakKeyDictionary()  # layer -> that dict, kept from one block to the next


def _fast_forward(self: torch.nn.Linear, input: torch.Tensor) -> torch.Tensor:
    """A swapped-in ``nn.Linear.forward``: the block's kernels in a thread with a block open, stock
    elsewhere. Under ``auto`` an input shape whose product takes stock for good (:func:`takes_stock`)
    is remembered for the layer (from one block to the next, until :func:`forget_decisions`), and
    goes straight to ``F.linear`` from then on (plain decoding's hot path: nothing looked up but the
    shape and the thread count)."""
    state = _this_thread
    if not state.open:
        return torch.nn.Linear.forward(self, input)
    if not state.auto:
        return fast_linear(input, self.weight, self.bias, auto=False, kernel=state.kernel)
    weight, bias, stock_at = self.weight, self.bias, self.__dict__[STOCK_SHAPES]
    threads = torch.get_num_threads()
    if stock_at.get(input.shape) == threads:
        _choice.products += 1
        return _stock(input, weight, bias)
    out = fast_linear(input, weight, bias)
    if takes_stock(input, weight, bias, threads):
        stock_at[input.shape] = threads
    return out


def _swap_in(layers: list[torch.nn.Linear]) -> None:
    with _swap_lock:
        for m in layers:
            entry = _swaps.setdefault(id(m), [m, 0])
            if entry[1] == 0:
                m.__dict__[STOCK_SHAPES] = _stock_shapes.setdefault(m, {})
                m.forward = types.MethodType(_fast_forward, m)
            entry[1] += 1


def _swap_out(layers: list[torch.nn.Linear]) -> None:
    with _swap_lock:
        for m in layers:
            entry = _swaps[id(m)]
            entry[1] -= 1
            if entry[1] == 0:
                del m.forward  # the class's forward again
                del m.__dict__[STOCK_SHAPES]
                del _swaps[id(m)]


@contextlib.contextmanager
def fast_linears(*models, on: bool = True):
    """Within the block, this thread's few-row float32/bfloat16 CPU linears take the kernel chosen
    for their shape (:func:`fast_linear`), unless ``on`` is False, ``OPTTREE_LINEAR=stock``, or
    ``models`` are given and none has such a weight (:func:`helps`). With ``models`` their plain
    ``nn.Linear`` layers are swapped for the block; without, a per-thread mode catches every
    ``F.linear`` of the thread. A block opened inside another of this thread adds nothing."""
    chosen = mode()
    if not on or chosen == "stock" or active() or (models and not helps(*models)):
        yield
        return
    _this_thread.open, _this_thread.auto, _this_thread.kernel = True, chosen == "auto", chosen
    try:
        if models:
            layers = swappable(*models)
            _swap_in(layers)
            try:
                yield
            finally:
                _swap_out(layers)
        else:
            with FastLinearMode():
                yield
    finally:
        _this_thread.open = False


__all__ = ["DTYPES", "IN_PLACE_BYTES", "KERNELS", "MAX_ROWS", "TRIALS", "FastLinearMode", "active", "candidates",
           "decisions", "dropped", "eligible_rows", "fast_linear", "fast_linears", "forget_decisions", "helps",
           "in_place_bytes", "is_packed", "linear", "mode", "packed_weight", "pick", "preparing", "settled",
           "swappable", "takes_stock"]
