"""The cache contract: which caches opttree decodes on (checked before anything runs, the same on
every way in), and the target's cache opened for trees and closed back as plain generate() leaves it.

Honoured: a ``DynamicCache`` (generate()'s default, ``cache_implementation="dynamic"``) and a
``StaticCache`` (``"static"``, and the older names transformers builds one for: ``"sliding_window"``,
``"hybrid"``, ``"hybrid_chunked"``), made by generate() or passed in empty. Refused by name, with
the fix: every other ``cache_implementation`` (offloaded caches move layers between devices while
opttree moves slots inside them; a quantized cache's slots cannot be moved; ``"paged"`` is
continuous batching) and any other cache object, an offloaded one, a filled one, a static cache
with a batch of prompts, and a static cache too small for the call.

Opening (:func:`open_cache`): a sliding-window (or chunked) layer keeps only the last window of
slots, so a tree's nodes would push committed tokens out of it; each one is stood in for while
opttree decodes (``kv_cache.full_layer``): for one prompt by a ``WindowLayer``, which keeps the
window, the deepest accepted path and the step in flight; for a batch, or in a static cache, by a
layer that keeps every slot. The tree masks hide what the window hides.
A static cache's full layers too small for the call get, while they hold no tensor yet, the room of
one padded tree beyond the call's tokens, rounded up to a size calls of other lengths share
(:func:`opttree.hf.compiled.cache_slots`: their compiled graphs too). Closing (:meth:`TreeCache.close`) puts the sliding layers back, holding what
plain decoding leaves in them (the last window of the committed tokens), and, for a cache the user
sees again, makes its tensors ordinary ones (opttree runs under ``torch.inference_mode``, whose
tensors ``reset()`` and a later in-place write refuse).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import DynamicCache, StaticCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer, StaticLayer, StaticSlidingWindowLayer

from . import kv_cache
from .compiled import cache_slots

#: cache_implementation values opttree decodes on (None: generate()'s default, a DynamicCache)
HONOURED_IMPLEMENTATIONS = (None, "dynamic", "static", "sliding_window", "hybrid", "hybrid_chunked")
#: the fix of every refused cache_implementation, and of an offloaded cache generate() made for one
IMPLEMENTATION_FIX = ("opttree rewrites a DynamicCache or a StaticCache on the model's device: drop "
                      "cache_implementation= (generate()'s dynamic cache) or pass cache_implementation='static'")
OBJECT_FIX = ("pass an empty DynamicCache(config=model.config) or StaticCache(config=model.config, max_cache_len=...), "
              "or no cache at all")

#: the layers of each cache class that opttree rewrites (a WindowLayer: one it made, kv_cache.new_cache)
LAYERS = {DynamicCache: (DynamicLayer, DynamicSlidingWindowLayer, kv_cache.WindowLayer),
          StaticCache: (StaticLayer, StaticSlidingWindowLayer)}


def implementation_refused(value) -> bool:
    """Whether ``cache_implementation=value`` is refused (see the module docstring)."""
    return value not in HONOURED_IMPLEMENTATIONS


@dataclass(frozen=True)
class CacheNeed:
    """What one call asks of the target's cache."""

    room: int  # the most slots it may fill: the prompt, the new tokens and one padded tree
    plain: int  # the slots plain generate() fills (max_length - 1): a static cache that holds fewer fails plain too
    rows: int  # prompts in the batch
    implementation: str | None = None  # generation_config.cache_implementation (None: the cache was passed in or is the default)
    depth: int = 0  # the longest path a step may accept: what a sliding layer keeps beyond its window (the end's rewind)


def check_cache(cache, need: CacheNeed) -> None:
    """Refuse, by name and with a fix that works, a cache opttree cannot decode on."""
    kind = type(cache)
    made = need.implementation is not None  # generate() made it from cache_implementation=
    if kind not in LAYERS:
        raise NotImplementedError(f"opttree keeps a step's accepted tree path in a DynamicCache or a StaticCache, "
                                  f"not a {kind.__name__}: {IMPLEMENTATION_FIX if made else OBJECT_FIX}")
    if cache.offloading:
        raise NotImplementedError(
            f"an offloaded {kind.__name__} moves its layers between devices while opttree moves each step's accepted "
            "slots inside them: " + (IMPLEMENTATION_FIX if made else f"pass {kind.__name__}(...) without offloading=True"))
    odd = sorted({type(layer).__name__ for layer in cache.layers if type(layer) not in LAYERS[kind]})
    if odd:
        raise NotImplementedError(f"opttree cannot rewrite cache layers of type {', '.join(odd)}: {OBJECT_FIX}")
    if kv_cache.cache_length(cache) > 0:
        raise NotImplementedError("opttree starts from an empty cache, and this one already holds "
                                  f"{kv_cache.cache_length(cache)} tokens: pass an empty one (cache.reset()) or none")
    if kind is StaticCache:
        _check_static(cache, need, made)


def _full_static_layers(cache: StaticCache) -> list[StaticLayer]:
    return [layer for layer in cache.layers if type(layer) is StaticLayer]


def _check_static(cache: StaticCache, need: CacheNeed, made: bool) -> None:
    if need.rows > 1:
        raise NotImplementedError(
            "a StaticCache with a batch of prompts: opttree keeps a batch's rows in a cache that grows; pass one prompt "
            "per call, or " + ("drop cache_implementation= for the batch" if made else "pass no cache for the batch"))
    full = _full_static_layers(cache)
    if not full:  # sliding layers only: each is stood in for by a full one, as long as the call needs
        return
    have = full[0].max_cache_len
    fix = f"make it StaticCache(config=model.config, max_cache_len={need.room})"
    if have < need.plain:
        raise ValueError(f"this StaticCache holds {have} slots, and the call writes {need.plain} (plain generate() "
                         f"fails on it too) and opttree up to {need.room} (one padded tree beyond): {fix}")
    if have < need.room and any(layer.is_initialized for layer in full):
        raise ValueError(f"this StaticCache holds {have} slots, and this call may need {need.room} (the prompt, "
                         f"the new tokens and one padded tree); it is allocated, so it cannot grow: {fix}")


@dataclass
class TreeCache:
    """The target's cache while opttree decodes on it (see the module docstring)."""

    cache: DynamicCache | StaticCache
    stand_ins: list[tuple[int, object]] = field(default_factory=list)  # (layer index, the sliding layer stood in for)

    def close(self, length: int, writable: bool) -> None:
        """Back to the cache a plain decode leaves: ``length`` committed slots (the sequence but its last
        token), the sliding layers back in their places, and (``writable``: a cache the user sees again)
        every tensor an ordinary one. Runs outside inference mode."""
        if kv_cache.cache_length(self.cache) > length:
            kv_cache.rewind(self.cache, length)
        for index, layer in self.stand_ins:
            _refill(layer, self.cache.layers[index], length)
            self.cache.layers[index] = layer
        self.stand_ins = []
        if writable:
            for layer in self.cache.layers:
                _ordinary(layer)


def decoding_slots(cache, need: CacheNeed) -> int | None:
    """The slots a static ``cache``'s full layers hold while decoding (what :func:`open_cache` sizes them to,
    and a compiled forward's graphs are made for): as many as they hold where that is room enough, else
    :func:`~opttree.hf.compiled.cache_slots` (one size for every prompt length); None: a cache that grows."""
    if not kv_cache.is_static(cache):
        return None
    held = max([layer.max_cache_len for layer in _full_static_layers(cache)], default=0)
    return held if held >= need.room else cache_slots(need.room)


def open_cache(cache, need: CacheNeed) -> TreeCache:
    """``cache`` (checked by :func:`check_cache`) ready for trees: every layer keeps every slot."""
    opened = TreeCache(cache)
    slots = decoding_slots(cache, need)
    if slots is not None:
        for layer in _full_static_layers(cache):
            if not layer.is_initialized:  # nothing allocated yet: the tensors are made at the first forward, this long
                layer.max_cache_len = slots
    slack = need.depth + 1 if need.rows == 1 else None  # one row: the window, and the last step's path
    for index, layer in enumerate(cache.layers):
        stand_in = kv_cache.full_layer(layer, slots, slack)
        if stand_in is not layer:
            opened.stand_ins.append((index, layer))
            cache.layers[index] = stand_in
    return opened


def _refill(layer, full, length: int) -> None:
    """A sliding layer given what plain decoding leaves in it after ``length`` tokens, from ``full``, the
    layer that stood in for it (holding the sequence's slots from its offset on, up to ``length``)."""
    if not full.is_initialized:
        return
    held = length - (full.offset if type(full) is kv_cache.WindowLayer else 0)
    keys, values = full.keys[..., :held, :], full.values[..., :held, :]
    if type(layer) is DynamicSlidingWindowLayer:
        layer.lazy_initialization(keys, values)
        layer.keys = keys[..., -layer.sliding_window + 1:, :].clone()  # what its update() keeps
        layer.values = values[..., -layer.sliding_window + 1:, :].clone()
        layer.cumulative_length = length
        return
    if not layer.is_initialized:  # a StaticSlidingWindowLayer: its own slots, allocated here (outside inference mode)
        layer.lazy_initialization(keys, values)
    kept = min(length, layer.max_cache_len)
    layer.keys.zero_()
    layer.values.zero_()
    layer.keys[..., :kept, :] = keys[..., held - kept:, :]
    layer.values[..., :kept, :] = values[..., held - kept:, :]
    layer.cumulative_length.fill_(kept)
    layer.cumulative_length_int = length


def _ordinary(layer) -> None:
    """Replace a layer's inference-mode tensors by ordinary copies (a static layer's keep their static
    address mark, as transformers gives them)."""
    if not layer.is_initialized:
        return
    static = isinstance(layer, StaticLayer)
    for name in ("keys", "values", "cumulative_length") if static else ("keys", "values"):
        tensor = getattr(layer, name)
        if tensor.is_inference():
            tensor = tensor.clone()
            if static:
                torch._dynamo.mark_static_address(tensor)
            setattr(layer, name, tensor)


__all__ = ["CacheNeed", "HONOURED_IMPLEMENTATIONS", "IMPLEMENTATION_FIX", "OBJECT_FIX", "TreeCache", "check_cache",
           "decoding_slots", "implementation_refused", "open_cache"]
