"""Count the host work of a decoding step outside the model forwards.

On a GPU every aten op is a kernel launch (microseconds of host time each) and every value read back
to Python (``.item()``, ``.tolist()``, ``bool(t)``, a data-dependent shape such as boolean-mask
indexing or ``nonzero``) stalls the pipeline until the device catches up. Both are counts, so
they can be measured on a CPU and pinned in a test, unlike timings.

:class:`OverheadCounter` counts, while it is open, aten ops (a ``TorchDispatchMode``), host reads
(a ``TorchFunctionMode``) and host time, all OUTSIDE the forwards of the modules it is given
(forward hooks switch counting off inside them). A *step* is the span from the start of one
target forward to the start of the next: the prefill → first verify span and everything after
the last verify are not steps. Both modes are thread-local and removed on exit.

    with OverheadCounter(target, draft) as counter:
        model.generate(...)
    print(counter.mean())  # StepCounts(ops=..., reads=..., host_ms=..., kernels=..., uploads=...)
"""

from __future__ import annotations

import time
from dataclasses import astuple, dataclass

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

# Tensor methods and functions that hand a tensor's VALUES (not just its shape) to Python, or
# whose output shape depends on them: each one waits for the device.
HOST_READS = frozenset({
    "item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__", "__array__",
    "nonzero", "argwhere", "masked_select", "unique", "unique_consecutive", "equal", "allclose",
    "is_nonzero",
})


# aten ops that never launch a kernel besides views (``OpOverload.is_view``)
NO_KERNEL = frozenset({"aten::resolve_conj", "aten::resolve_neg", "aten::lift_fresh", "aten::_local_scalar_dense"})


@dataclass
class StepCounts:
    ops: float  # aten ops outside the forwards, views included
    reads: float  # host reads outside the forwards
    host_ms: float  # wall time outside the forwards
    kernels: float = 0.0  # of ``ops``: those that launch a kernel on a GPU (not views, not metadata)
    uploads: float = 0.0  # tensors made from host data outside the forwards: on a GPU, each a copy that syncs


def _is_read(func, args) -> bool:
    name = getattr(func, "__name__", "")
    if name in HOST_READS:
        return True
    if name == "__getitem__" and len(args) > 1:  # boolean-mask indexing: a data-dependent shape
        index = args[1] if isinstance(args[1], tuple) else (args[1],)
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index)
    if name == "repeat_interleave" and len(args) > 1 and isinstance(args[1], torch.Tensor):
        return True
    return False


def _is_upload(func, args) -> bool:
    """A tensor made from Python data (torch.tensor / as_tensor / new_tensor of a list or a number,
    or indexing with a list): on a GPU, a host-to-device copy, which waits for the stream."""
    name = getattr(func, "__name__", "")
    if name in ("tensor", "as_tensor", "new_tensor"):
        data = args[1] if name == "new_tensor" and len(args) > 1 else (args[0] if args else None)
        return not isinstance(data, torch.Tensor)
    if name in ("__getitem__", "__setitem__") and len(args) > 1:
        index = args[1] if isinstance(args[1], tuple) else (args[1],)
        return any(isinstance(i, list) for i in index)
    return False


class _Reads(TorchFunctionMode):
    def __init__(self, counter: "OverheadCounter"):
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if self.counter.inside == 0:
            self.counter.reads += _is_read(func, args)
            self.counter.uploads += _is_upload(func, args)
        return func(*args, **(kwargs or {}))


class _Ops(TorchDispatchMode):
    def __init__(self, counter: "OverheadCounter"):
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.counter.inside == 0:
            self.counter.ops += 1
            if not func.is_view and func.name() not in NO_KERNEL:
                self.counter.kernels += 1
        return func(*args, **(kwargs or {}))


class OverheadCounter:
    """target: the module whose forward starts each step; others: more modules whose forwards
    are not counted (the draft model, a feature head). count=False: time only (the counting
    modes run Python for every op, which inflates the host time they would measure)."""

    def __init__(self, target: torch.nn.Module, *others: torch.nn.Module, count: bool = True):
        self.count = count
        self.target = target
        self.modules = [target, *[m for m in others if isinstance(m, torch.nn.Module)]]
        self.ops = 0
        self.kernels = 0
        self.reads = 0
        self.uploads = 0
        self.inside = 0  # > 0 while a watched forward runs
        self.forward_seconds = 0.0
        self._entered_at = 0.0
        self.marks: list[tuple[int, int, float, int, int]] = []  # StepCounts' fields, running, at each target forward
        self._hooks = []
        self._modes = []

    def _host_seconds(self) -> float:
        return time.perf_counter() - self.forward_seconds

    def _pre(self, module, args, kwargs=None):
        if module is self.target and self.inside == 0:
            self.marks.append((self.ops, self.reads, 1000 * self._host_seconds(), self.kernels, self.uploads))
        if self.inside == 0:
            self._entered_at = time.perf_counter()
        self.inside += 1

    def _post(self, module, args, output, kwargs=None):
        self.inside -= 1
        if self.inside == 0:
            self.forward_seconds += time.perf_counter() - self._entered_at

    def __enter__(self) -> "OverheadCounter":
        for m in self.modules:
            self._hooks.append(m.register_forward_pre_hook(self._pre))
            self._hooks.append(m.register_forward_hook(self._post))
        self._modes = [_Reads(self), _Ops(self)] if self.count else []
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)
        for hook in self._hooks:
            hook.remove()
        self._modes, self._hooks = [], []

    def steps(self) -> list[StepCounts]:
        """One entry per span between consecutive verify forwards (the prefill's span excluded)."""
        marks = self.marks[1:]
        return [StepCounts(*(y - x for x, y in zip(a, b))) for a, b in zip(marks, marks[1:])]

    def mean(self) -> StepCounts:
        steps = self.steps()
        if not steps:
            raise ValueError("fewer than two verify forwards were seen: generate more tokens")
        n = len(steps)
        return StepCounts(*(sum(column) / n for column in zip(*map(astuple, steps))))
