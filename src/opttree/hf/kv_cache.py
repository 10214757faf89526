"""The only module that touches transformers Cache internals.

After a tree forward the cache holds the committed prefix and then one slot per tree token.
:func:`keep_slots` moves the slots of the accepted path right behind the prefix and drops the
rest, in place (no copy of the prefix, ~1 ms). ``Cache.crop`` takes a NEGATIVE count in
transformers 5.x.

Two kinds of cache are rewritten: a ``DynamicCache`` (it grows; the rest is cropped) and a
``StaticCache`` (``cache_implementation="static"``, or one passed in: its layers hold
``max_cache_len`` slots from the start, a forward's mask spans them all, and a static layer writes
its new keys at its own count, ``cumulative_length``; keeping the accepted path moves it in place
and sets that count, and the stale slots after it are hidden by the mask until they are written again).
Every layer of a cache rewritten here keeps every slot: a sliding-window layer is stood in for by a
full one (:func:`full_layer`; :mod:`.tree_cache` opens a given cache so and closes it back).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, StaticCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer, StaticLayer, StaticSlidingWindowLayer


def full_layer(layer, slots: int | None = None):
    """The layer a tree cache keeps in place of a sliding-window (or chunked) one: every slot kept (the
    tree masks hide what the window hides), so that a step's rejected nodes can be dropped again. A
    DynamicSlidingWindowLayer keeps only its last window - 1 slots, so the nodes of a tree would push
    committed tokens out; a StaticSlidingWindowLayer (replaced by a StaticLayer of ``slots`` slots)
    rolls them out the same way. Any other layer is returned as it is."""
    if type(layer) is DynamicSlidingWindowLayer:
        return DynamicLayer()
    if type(layer) is StaticSlidingWindowLayer:
        return StaticLayer(max_cache_len=slots)
    return layer


def new_cache(model) -> DynamicCache:
    """An empty DynamicCache for ``model`` with full layers only (see :func:`full_layer`)."""
    cache = DynamicCache(config=model.config)
    cache.layers = [full_layer(layer) for layer in cache.layers]
    return cache


def is_static(cache) -> bool:
    """A StaticCache: fixed slots, a mask over all of them (what a compiled forward and CUDA graphs need)."""
    return type(cache) is StaticCache


def capacity(cache) -> int | None:
    """A static cache's slots (a forward's mask spans them all); None: a cache that grows."""
    return cache.layers[0].max_cache_len if is_static(cache) else None


def cache_length(cache) -> int:
    """Slots holding committed tokens (a static cache's count; a dynamic cache's length)."""
    return int(cache.get_seq_length())


def _set_static_length(cache: StaticCache, length: int) -> None:
    """A static cache's next forward writes from slot ``length`` on (what keep_slots keeps is before it)."""
    for layer in cache.layers:
        if layer.is_initialized:
            layer.cumulative_length.fill_(length)


def rewind(cache: DynamicCache | StaticCache, length: int) -> None:
    """Back to ``length`` committed slots (a forward that failed half-way: what it wrote is dropped)."""
    if is_static(cache):
        _set_static_length(cache, length)
    elif cache_length(cache) > length:
        cache.crop(-(cache_length(cache) - length))


def keep_slots(cache: DynamicCache | StaticCache, start: int, slots: list[int],
               on_device: torch.Tensor | None = None) -> None:
    """Keep cache slots ``[0, start)`` followed by ``slots``; drop everything else (a static
    cache: set its count; the stale slots after it are hidden by the mask and written over).

    slots: ascending host ints, each >= start (the accepted path: already on the host, so
    deciding what to move reads nothing back). on_device: the same slots as a [len(slots)] long
    tensor where the walk left them (else they are copied from the host: on a GPU, a copy that
    waits for the stream). ONE index tensor serves every layer on a device.
    """
    total = cache_length(cache)
    k = len(slots)
    if k and slots != list(range(start, start + k)):
        index: dict[torch.device, torch.Tensor] = {}
        for layer in cache.layers:
            if not getattr(layer, "is_initialized", True):
                continue
            device = layer.keys.device
            if device not in index:
                index[device] = (torch.tensor(slots, dtype=torch.long, device=device) if on_device is None
                                 else on_device.to(device))
            layer.keys[..., start:start + k, :] = layer.keys[..., index[device], :]
            layer.values[..., start:start + k, :] = layer.values[..., index[device], :]
    if is_static(cache):
        _set_static_length(cache, start + k)
    elif total > start + k:
        cache.crop(-(total - start - k))


# ---------------------------------------------------------------------------------------------
# batches (loop/rows.py): rows share the slots; a row's unused slots are holes its mask hides


def keep_row_slots(cache: DynamicCache, start: int, slots: torch.Tensor) -> None:
    """Row b keeps slots ``[0, start)`` followed by ``slots[b]``; everything after is dropped.

    slots: [B, k] long, each >= start. A row that keeps fewer than k slots repeats one of them:
    the copies are holes that its attention mask must hide.
    """
    total = cache.get_seq_length()
    rows, k = slots.shape
    if k and not bool((slots == torch.arange(start, start + k, device=slots.device)).all()):
        for layer in cache.layers:
            if not getattr(layer, "is_initialized", True):
                continue
            _, heads, _, dim = layer.keys.shape
            idx = slots.to(layer.keys.device)[:, None, :, None].expand(rows, heads, k, dim)  # [B, H, k, D]
            layer.keys[..., start:start + k, :] = torch.gather(layer.keys, 2, idx)
            idx = slots.to(layer.values.device)[:, None, :, None].expand(rows, heads, k, layer.values.shape[-1])
            layer.values[..., start:start + k, :] = torch.gather(layer.values, 2, idx)
    if total > start + k:
        cache.crop(-(total - start - k))


def select(cache: DynamicCache, rows: torch.Tensor, columns: torch.Tensor | None = None) -> None:
    """Keep only batch rows ``rows`` ([R] long) and, if given, slots ``columns`` ([C] long, ascending)."""
    for layer in cache.layers:
        if not getattr(layer, "is_initialized", True) or layer.keys.numel() == 0:
            continue
        keys = layer.keys.index_select(0, rows.to(layer.keys.device))
        values = layer.values.index_select(0, rows.to(layer.values.device))
        if columns is not None:
            keys, values = keys.index_select(2, columns.to(keys.device)), values.index_select(2, columns.to(values.device))
        layer.keys, layer.values = keys, values


# Squeeze the holes out of a cache (the target's, a batched draft's) once they make up this share of
# its slots beyond the longest row's: holes cost attention over slots no row reads, compacting costs one copy.
COMPACT_SHARE = 0.25
COMPACT_MIN_HOLES = 16


def worth_compacting(valid: torch.Tensor) -> bool:
    """valid: [R, L] bool, each row's used slots."""
    holes = valid.shape[1] - int(valid.sum(dim=1).max())
    return holes >= max(COMPACT_MIN_HOLES, COMPACT_SHARE * valid.shape[1])


def compact_rows(cache: DynamicCache, valid: torch.Tensor) -> torch.Tensor:
    """Squeeze out the holes: each row's used slots (``valid`` [B, L] bool) move to the right end,
    in order, and the cache shrinks to the most slots any row uses. Returns the order [B, L'] long:
    slot j of row b now holds what slot order[b, j] held (``valid.gather(1, order)`` is the new valid:
    a row's unused slots now lie on its left, like left padding). One gather over the whole cache: for
    now and then, not every step."""
    rows, length = valid.shape
    kept = int(valid.sum(dim=1).max())
    order = torch.sort(valid.to(torch.int8), dim=1, stable=True).indices[:, length - kept:]  # [B, L'] unused first
    for layer in cache.layers:
        if not getattr(layer, "is_initialized", True) or layer.keys.numel() == 0:
            continue
        _, heads, _, dim = layer.keys.shape
        idx = order.to(layer.keys.device)[:, None, :, None]
        layer.keys = torch.gather(layer.keys, 2, idx.expand(rows, heads, kept, dim))
        layer.values = torch.gather(layer.values, 2, idx.expand(rows, heads, kept, layer.values.shape[-1]))
    return order
