"""The one step of a head's drafting (:func:`head_step`), run on the head's KV cache of fixed size
(:class:`HeadBuffers`), eagerly or compiled (:class:`HeadSteps`): compiling is a switch, as in vLLM's
proposer (one path on persistent buffers, graphs on or off).

:class:`~opttree.drafters.head.drafter.FeatureHeadDrafter` feeds every forward through it:

- the KV cache is one buffer per call, written in place at each entry's slot; a call outgrows it
  only by doubling (:meth:`HeadBuffers.holding`);
- eagerly (the default), a forward has its own width and attends over the slots in use;
- compiled (``Drafter.compiled``, called by :mod:`opttree.integration.prepare` where opttree verifies
  through the compiled forward: a GPU by default, any device with
  ``CompileConfig._compile_all_devices``, which the tests use on a CPU), the buffer has
  :func:`opttree.hf.compiled.cache_slots` of the call's room (calls of other prompt lengths share
  its size), the mask spans the whole buffer, and every forward's rows are padded to a verification
  size (:data:`opttree.tree.sizes.VERIFY_SIZES`). A pad row repeats a real row (a layer's first
  frontier node; a catch-up's last committed token), its entries go to the slots right after the
  real ones, which the next forward overwrites, and no row sees them; its outputs are never read.

So the compiled step compiles once per width and buffer size, and every later step of every call of
that size replays those graphs (under ``mode="reduce-overhead"``, generate()'s default on CUDA, as
CUDA graphs: the buffers are marked static, as transformers marks a StaticCache's). The prefill (the
prompt's catch-up) runs the same function eagerly at its own length, as generate() keeps its prefill
eager. A width whose compile or compiled run fails runs eagerly from then on, with one warning; the
in-place writes are the same either way, so nothing needs rewinding. Eager and compiled, a forward
of the same width computes the same q to the bit (``tests/test_head_step.py``); a padded one runs
its products on more rows, where a CPU may pick another kernel, so the q agree to rounding.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

import torch

from ...kernels import linears
from ...tree.masks import additive_mask
from .layer import KV

logger = logging.getLogger(__name__)


def head_step(head: torch.nn.Module, keys: torch.Tensor, values: torch.Tensor, rows: torch.Tensor, bias: torch.Tensor,
              features: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
              visible: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward of ``w`` rows of ``head`` (a :class:`~opttree.drafters.head.base.DraftHead`) on
    the fixed buffers, pure but for the buffers' writes.

    keys, values: [1, layers * kv_heads, S, d], the new entries written at ``slots``;
    rows [K, h], bias [K]: the output rows over the head's columns;
    features [w, h] (each row's fed feature), tokens [w] long, positions [w] long,
    slots [w] long, visible [w, n] bool over the buffer's first n slots (n <= S)
    -> (the next fed features [w, h], logits over the columns [w, K])."""
    mask = additive_mask(visible, torch.float32)  # [1, 1, w, n]
    fed, _ = head(features[None], tokens[None], positions[None], KV(keys, values), mask, slots)  # [1, w, h]
    fed = fed[0]  # [w, h]
    x = head.logit_input(fed)
    # eagerly the CPU kernels of an open block (kernels.linears, as the head's own linears); compiled, the compiler's
    product = torch.nn.functional.linear if torch.compiler.is_compiling() else linears.linear
    rows = rows if rows.dtype == x.dtype else rows.to(x.dtype)  # (an op even when a no-op: pinned counts)
    return fed, product(x, rows, bias.to(x.dtype))


@dataclass
class HeadSteps:
    """:func:`head_step`, eager (``compiled`` None) or compiled as the target's decoding forward is
    (:meth:`of`), with an eager fallback per width. Shared by the drafters of one call (its rows,
    calibration's scratch)."""

    compiled: Callable | None = None
    failed: set[int] = field(default_factory=set)  # widths that fell back to eager

    @classmethod
    def of(cls, compile_config) -> "HeadSteps":
        return cls(torch.compile(head_step, **compile_config.to_dict()))

    @property
    def compiles(self) -> bool:
        """Whether forwards after the prefill run compiled, on padded widths over the whole buffer."""
        return self.compiled is not None

    def __call__(self, eager: bool, *args) -> tuple[torch.Tensor, torch.Tensor]:
        width = args[5].shape[0]  # features [w, H]
        if eager or self.compiled is None or width in self.failed:
            return head_step(*args)
        try:
            return self.compiled(*args)
        except Exception as error:  # noqa: BLE001 - any failure of the compiler or the compiled code
            self.failed.add(width)
            logger.warning("the compiled draft step of %d rows failed (%s: %s); running it eagerly from now on",
                           width, type(error).__name__, str(error).splitlines()[0] if str(error) else "")
            return head_step(*args)


@dataclass
class HeadBuffers:
    """The head's KV cache of fixed size: every layer's entries stacked on the head axis."""

    keys: torch.Tensor  # [1, layers * kv_heads, S, d]
    values: torch.Tensor  # [1, layers * kv_heads, S, d]
    slot_ids: torch.Tensor  # [S] long 0, 1, ...: every forward's slots are a slice of it

    @classmethod
    def allocate(cls, head: torch.nn.Module, slots: int) -> "HeadBuffers":
        c = head.c
        return cls.zeros((1, c.num_layers * c.num_kv_heads, slots, c.head_dim), head.dtype, head.device)

    @classmethod
    def zeros(cls, shape: tuple[int, int, int, int], dtype: torch.dtype, device) -> "HeadBuffers":
        keys = torch.zeros(shape, dtype=dtype, device=device)
        values = torch.zeros_like(keys)
        for t in (keys, values):  # a fixed address: CUDA graphs read them in place (as a StaticCache's)
            torch._dynamo.mark_static_address(t)
        return cls(keys, values, torch.arange(shape[2], device=device))

    @property
    def slots(self) -> int:
        return self.keys.shape[2]

    def holding(self, needed: int, filled: int) -> "HeadBuffers":
        """Buffers with room for ``needed`` slots: these, or twice as many (a new size compiles anew)
        with the first ``filled`` entries copied. A call outgrows its buffers only if its trees feed
        more entries than its room foresaw."""
        if needed <= self.slots:
            return self
        slots = self.slots
        while slots < needed:
            slots *= 2
        logger.debug("the draft's fixed cache grows from %d to %d slots", self.slots, slots)
        b, heads, _, dim = self.keys.shape
        bigger = HeadBuffers.zeros((b, heads, slots, dim), self.keys.dtype, self.keys.device)
        bigger.keys[:, :, :filled] = self.keys[:, :, :filled]
        bigger.values[:, :, :filled] = self.values[:, :, :filled]
        return bigger

__all__ = ["HeadBuffers", "HeadSteps", "head_step"]
