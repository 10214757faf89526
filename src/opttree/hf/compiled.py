"""The verification forward: :func:`target_forward`, the one forward decoding runs and calibration
times, compiled where generate() would compile plain decoding.

generate() compiles the target's forward for decoding when the cache is a compilable one (a
``StaticCache``) on a device it compiles for (CUDA and a few others; any device with
``CompileConfig(_compile_all_devices=True)``), unless ``disable_compile=True``
(``GenerationMixin._valid_auto_compile_criteria``). opttree asks the same question with the same
objects and, where the answer is yes, runs its verification forwards through the same compiled
callable (``model.get_compiled_call(compile_config)``, shared with plain decoding): one graph per
verification size (:data:`opttree.tree.sizes.VERIFY_SIZES`: the shapes are fixed), captured as CUDA
graphs under ``mode="reduce-overhead"``, generate()'s default. The prefill and the draft's forwards
stay eager, as generate() keeps its prefill eager.

Where generate() would compile plain decoding if its cache were static (a GPU; any device with
``_compile_all_devices``) and the user named no cache, opttree decodes one prompt on a ``StaticCache``
of its own and compiles the same way (:func:`compiles_on_static`): the default path on a GPU is the
compiled one. ``disable_compile=True`` keeps it eager; a model that cannot take a static cache stays
eager with one warning. A static cache that opttree sizes gets :func:`cache_slots` slots, one size for
every call whose prompt and answer fit it, so a new prompt length compiles nothing new.

A size whose compile or compiled run fails falls back to the eager forward, with one warning per
size, never an abort of the call: the static cache's count is set back first, so the eager run
writes the same slots. What runs on a machine without CUDA is the same code path with the CPU as the
device (tests force it with ``_compile_all_devices``); the CUDA graphs themselves are checked only
where a GPU is lent (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

import torch
from transformers import StaticCache

from . import kv_cache
from .compat import GENERATE_CACHE_NAME, with_cache

logger = logging.getLogger(__name__)

MIN_SLOTS = 256  # the smallest static cache opttree sizes


def generate_would_compile(model, model_kwargs: dict, generation_config) -> bool:
    """Whether generate() would compile ``model``'s decoding forward for this call (its own test)."""
    return bool(model._valid_auto_compile_criteria(model_kwargs, generation_config))


def cache_slots(room: int) -> int:
    """The slots of a static cache opttree sizes for a call that needs ``room``: the next power of two
    (at least MIN_SLOTS), so calls of other prompt lengths share it, and its compiled graphs."""
    slots = MIN_SLOTS
    while slots < room:
        slots *= 2
    return slots


_warned: set[str] = set()  # model classes already warned about (one warning per class and process)


def compiles_on_static(model, generation_config) -> bool:
    """Whether generate() would compile ``model``'s decoding for this call if its cache were a
    ``StaticCache`` (a device it compiles for, ``disable_compile`` not set, no quantizer or offload);
    False, with one warning, where it would but the model cannot take a static cache."""
    probe = {GENERATE_CACHE_NAME: StaticCache(config=model.config, max_cache_len=1)}  # lazy: nothing allocated
    if generation_config.compile_config is None and model.device.type not in ("cuda", "xpu", "neuron", "tpu"):
        return False  # generate()'s own test would say no (asked quietly: it warns where compile_config is set)
    if not generate_would_compile(model, probe, generation_config):
        return False
    if not model._can_compile_fullgraph:
        name = type(model).__name__
        if name not in _warned:
            _warned.add(name)
            logger.warning("%s cannot be compiled with a static cache (transformers' _can_compile_fullgraph): "
                           "opttree verifies eagerly on a dynamic cache", name)
        return False
    return True


@dataclass
class VerifyForward:
    """The target's verification forward: compiled (with an eager fallback per size) or eager."""

    model: Callable  # the target (its eager __call__)
    compiled: Callable | None = None  # model.get_compiled_call(...); None: eager only
    failed: set[int] = field(default_factory=set)  # sizes (rows) that fell back to eager

    @classmethod
    def of(cls, model, model_kwargs: dict, generation_config) -> "VerifyForward":
        if not generate_would_compile(model, model_kwargs, generation_config):
            return cls(model)
        return cls(model, model.get_compiled_call(generation_config.compile_config))

    @property
    def compiles(self) -> bool:
        return self.compiled is not None

    def __call__(self, cache, rows: int, length: int, /, **kwargs):
        """One forward over ``rows`` new tokens (a verification size) on ``cache`` (also in ``kwargs``,
        under the model's own name for it), which holds ``length`` committed slots (the caller knows
        them: reading a static cache's count would wait for the device)."""
        if self.compiled is None or rows in self.failed:
            return self.model(**kwargs)
        try:
            return self.compiled(**kwargs)
        except Exception as error:  # noqa: BLE001 - any failure of the compiler or the compiled code
            self.failed.add(rows)
            logger.warning("the compiled verification forward of %d rows failed (%s: %s); running it eagerly from now on",
                           rows, type(error).__name__, str(error).splitlines()[0] if str(error) else "")
            kv_cache.rewind(cache, length)
            return self.model(**kwargs)


class VerifyInputs(Protocol):
    """What a verification forward is fed (``opttree.tree.masks.ForwardInputs`` is one)."""

    input_ids: torch.Tensor  # [R, q] long: every row's root and tree, padded to a verification size
    past_len: int  # the committed slots before them (known on the host)

    def as_kwargs(self) -> dict: ...  # the model inputs: ids, masks, positions, cache positions


def target_forward(target, inputs: VerifyInputs, cache, want_hidden: bool, extra: dict | None = None,
                   forward: VerifyForward | None = None) -> tuple[torch.Tensor, tuple | None]:
    """THE verification forward, as decoding runs it and calibration times it: one target forward over
    every row's root and tree -> (logits [R, q, vocab] float32, and the hidden states (each [R, q, H])
    when a drafter wants the target's features). extra: model inputs beyond ids and masks
    (``opttree.loop.model_inputs``); its entries replace those of ``inputs``. forward: the compiled
    verification forward (:class:`VerifyForward`); None: the target, eager."""
    kwargs = dict(**{**inputs.as_kwargs(), **(extra or {})}, **with_cache(target, cache), use_cache=True,
                  logits_to_keep=0, output_hidden_states=want_hidden)
    out = target(**kwargs) if forward is None else forward(cache, inputs.input_ids.shape[1], inputs.past_len, **kwargs)
    return out.logits.float(), out.hidden_states if want_hidden else None


@dataclass
class ScratchTarget:
    """The target prefilled with made-up tokens on a cache of its own, made as decoding's, on which
    verification forwards run as decoding runs them (:func:`target_forward`), each cropped back after it:
    the one thing calibration (:class:`opttree.budget.timing.VerifyRig`) asks of the cache, the target's
    argument names and the forward. Made by :meth:`of`."""

    target: object
    cache: object  # a DynamicCache that a tree can be rewound in, or (compiled) a StaticCache of MIN_SLOTS
    prefix: int  # the committed tokens under the forwards
    forward: VerifyForward | None  # the compiled verification forward; None: the target, eager
    hidden: bool  # the forwards return the hidden states (a drafter wants the target's features)
    kv_len: int | None  # the slots a forward's mask spans (a static cache's); None: the cache grows
    dropped: dict[int, int]  # {window: slots dropped before those held} (kv_cache.window_offsets)

    @classmethod
    def of(cls, target, prefix: int, forward: VerifyForward | None = None, hidden: bool = False,
           slots: int | None = None) -> "ScratchTarget":
        """``target`` prefilled with ``prefix`` made-up tokens; ``forward``: the verification forward decoding
        runs (compiled: on a static cache of ``slots`` slots, decoding's, default a short call's MIN_SLOTS, so
        the graphs it compiles are decoding's too: a graph is made for one cache length)."""
        forward = forward if forward is not None and forward.compiles else None
        # made as decoding's: a static cache outside inference mode (integration/prepare.py), its keys and
        # values allocated by the prefill inside it; a compiled graph guards on which tensors are inference ones
        if forward is None:
            cache = kv_cache.new_cache(target)
        else:  # decoding's size (or a short call's): the graphs it compiles are decoding's too
            slots = slots or MIN_SLOTS
            cache = StaticCache(config=target.config, max_cache_len=slots)
        vocab = int(target.get_input_embeddings().weight.shape[0])
        with torch.inference_mode():
            ids = (torch.arange(prefix, dtype=torch.long) * 7 % vocab)[None, :].to(target.device)
            target(input_ids=ids, **with_cache(target, cache), use_cache=True, logits_to_keep=1)
            kv_cache.keep_slots(cache, prefix, [])  # a sliding window's layers keep the window, as after a step
        return cls(target, cache, prefix, forward, hidden, None if forward is None else slots,
                   kv_cache.window_offsets(cache))

    def run(self, inputs: VerifyInputs) -> float:
        """One verification forward over ``inputs`` (on :attr:`prefix` committed slots), decoding's own: its
        seconds, from its start to the device's finish; the cache is cropped back after it."""
        start = time.perf_counter()
        target_forward(self.target, inputs, self.cache, self.hidden, forward=self.forward)
        if self.target.device.type == "cuda":
            torch.cuda.synchronize(self.target.device)
        seconds = time.perf_counter() - start
        kv_cache.keep_slots(self.cache, self.prefix, [])
        return seconds


__all__ = ["MIN_SLOTS", "ScratchTarget", "VerifyForward", "VerifyInputs", "cache_slots", "compiles_on_static",
           "generate_would_compile", "target_forward"]
