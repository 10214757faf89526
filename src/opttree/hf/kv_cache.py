"""The only module that touches transformers Cache internals.

After a tree forward the cache holds the committed prefix and then one slot per tree token.
:func:`keep_slots` moves the slots of the accepted path right behind the prefix and drops the
rest, in place (no copy of the prefix). ``Cache.crop`` takes a NEGATIVE count in
transformers 5.x.

Two kinds of cache are rewritten: a ``DynamicCache`` (it grows; the rest is cropped) and a
``StaticCache`` (``cache_implementation="static"``, or one passed in: its layers hold
``max_cache_len`` slots from the start, a forward's mask spans them all, and a static layer writes
its new keys at its own count, ``cumulative_length``; keeping the accepted path moves it in place
and sets that count, and the stale slots after it are hidden by the mask until they are written again).
A sliding-window layer is stood in for by one a tree can be rewound in (:func:`full_layer`;
:mod:`.tree_cache` opens a given cache so and closes it back): for one row a :class:`WindowLayer`,
which keeps the window and the slots of the step in flight, for a batch or a static cache a layer
that keeps every slot.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, StaticCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer, StaticLayer, StaticSlidingWindowLayer


class WindowLayer(DynamicLayer):
    """A sliding-window (or chunked) layer that keeps what a rewind needs: every slot written since the
    last step ended, and at a step's end (:func:`keep_slots`) its last ``keep`` committed slots, the
    window's (``window - 1``: what the next root and any node under it can see) and a slack; the slots
    before them are dropped and counted in ``offset``. Its slot i holds the sequence's slot
    ``offset + i``; transformers' own masks read that from :meth:`get_mask_sizes`, opttree's tree masks
    from :func:`window_offsets`."""

    is_sliding = True

    def __init__(self, window: int, keep: int):
        super().__init__()
        self.window = window
        self.keep = keep
        self.offset = 0

    def held(self) -> int:
        """The slots it holds (the sequence's from ``offset`` on)."""
        return super().get_seq_length()

    def get_seq_length(self) -> int:
        return self.offset + self.held()

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.held() + query_length, self.offset

    def trim(self) -> None:
        """Drop the slots before the last ``keep``."""
        extra = self.held() - self.keep
        if extra > 0:
            self.keys, self.values = self.keys[..., extra:, :], self.values[..., extra:, :]
            self.offset += extra

    def reset(self) -> None:
        super().reset()
        self.offset = 0


def full_layer(layer, slots: int | None = None, slack: int | None = None):
    """The layer a tree cache keeps in place of a sliding-window (or chunked) one, so that a step's
    rejected nodes can be dropped again: a DynamicSlidingWindowLayer keeps only its last window - 1
    slots, and a StaticSlidingWindowLayer rolls its slots out the same way, so a tree's nodes would
    push committed tokens out. ``slack``: a :class:`WindowLayer` keeping window - 1 + slack committed
    slots (one row); None: a DynamicLayer keeping every slot (a batch, whose rows sit at other
    positions). A StaticSlidingWindowLayer gets a StaticLayer of ``slots`` slots. Any other layer is
    returned as it is."""
    if type(layer) is DynamicSlidingWindowLayer:
        return DynamicLayer() if slack is None else WindowLayer(layer.sliding_window, layer.sliding_window - 1 + slack)
    if type(layer) is StaticSlidingWindowLayer:
        return StaticLayer(max_cache_len=slots)
    return layer


def new_cache(model, rows: int = 1) -> DynamicCache:
    """An empty DynamicCache for ``model`` that a tree can be rewound in (see :func:`full_layer`): its
    sliding-window layers keep their window for one row, every slot for a batch of ``rows``."""
    cache = DynamicCache(config=model.config)
    cache.layers = [full_layer(layer, slack=0 if rows == 1 else None) for layer in cache.layers]
    return cache


def window_offsets(cache) -> dict[int, int]:
    """{window: slots dropped before the ones held} of the cache's :class:`WindowLayer` layers (layers of one
    window are trimmed alike); {} where there is none."""
    return {layer.window: layer.offset for layer in cache.layers if type(layer) is WindowLayer}


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
    k = len(slots)
    if k and slots != list(range(start, start + k)):
        index: dict[tuple[torch.device, int], torch.Tensor] = {}
        for layer in cache.layers:
            if not getattr(layer, "is_initialized", True):
                continue
            shift = layer.offset if type(layer) is WindowLayer else 0  # its slot i is the sequence's offset + i
            where = (layer.keys.device, shift)
            if where not in index:
                on = (torch.tensor(slots, dtype=torch.long, device=where[0]) if on_device is None
                      else on_device.to(where[0]))
                index[where] = on - shift if shift else on
            layer.keys[..., start - shift:start - shift + k, :] = layer.keys[..., index[where], :]
            layer.values[..., start - shift:start - shift + k, :] = layer.values[..., index[where], :]
    if is_static(cache):  # (its count is not read: on a GPU, a wait for the device)
        _set_static_length(cache, start + k)
    elif (total := cache_length(cache)) > start + k:  # a dynamic cache's length is a shape: no read
        cache.crop(-(total - start - k))
    for layer in cache.layers:
        if type(layer) is WindowLayer:
            layer.trim()


# ---------------------------------------------------------------------------------------------
# batches (loop/slots.py): rows share the slots; a row's unused slots are holes its mask hides


def keep_row_slots(cache: DynamicCache | StaticCache, start: int, slots: torch.Tensor) -> None:
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
    if is_static(cache):  # one prompt whose mask hides tokens (its rows are one)
        _set_static_length(cache, start + k)
    elif total > start + k:
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
