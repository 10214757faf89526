"""Which keys each kind of attention layer of a model sees, read from its config the way transformers
reads it (``masking_utils.create_masks_for_generate``, the masks generate() makes for a compiled
forward):

- a config with ``layer_types``: one mask per layer type, passed as ``{layer type: mask}`` (every
  transformers model with ``layer_types`` takes that mapping as its ``attention_mask``);
- else ``sliding_window`` set: every layer slides (Mistral, Starcoder2);
- else ``attention_chunk_size`` set: every layer is chunked;
- else one causal mask.

A query at sequence index p sees, on a ``sliding_attention`` layer, the keys at indices
(p - window, p]; on a ``chunked_attention`` layer those in its own chunk, [p // size * size, p]; on a
``full_attention`` layer all of them. The index is the token's place in the row's sequence without
its left padding (transformers counts the window in cache slots, and the chunks from the row's first
token: the same numbers). The tree masks add the tree on top: a node also needs to be the query's
ancestor (or the query itself), and the window then applies to ancestors as to the prefix.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FULL, SLIDING, CHUNKED = "full_attention", "sliding_attention", "chunked_attention"


@dataclass(frozen=True)
class Window:
    """What a sliding or chunked layer sees of the keys its tree mask lets through."""

    kind: str  # SLIDING or CHUNKED
    size: int

    def allows(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """queries: [B, q] long, keys: [B, kv] long sequence indices -> [B, q, kv] bool."""
        q, k = queries[:, :, None], keys[:, None, :]
        if self.kind == SLIDING:
            return k > q - self.size
        return torch.div(k, self.size, rounding_mode="floor") == torch.div(q, self.size, rounding_mode="floor")


@dataclass(frozen=True)
class MaskLayout:
    """The masks a model's forward takes: per layer type its window (None: the whole sequence)."""

    windows: tuple[tuple[str, Window | None], ...]  # (layer type, its window), one entry per type the model has

    @classmethod
    def of(cls, config) -> "MaskLayout":
        """The layout of a model's (text) config. Layer types other than full, sliding and chunked
        attention (linear attention, layers that share another layer's cache, ...) are refused: their
        state cannot be rewound to a tree's accepted path."""
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        types = getattr(text, "layer_types", None)
        if types is None:
            if getattr(text, "sliding_window", None) is not None:
                return cls(((SLIDING, Window(SLIDING, int(text.sliding_window))),))
            if getattr(text, "attention_chunk_size", None) is not None:
                return cls(((CHUNKED, Window(CHUNKED, int(text.attention_chunk_size))),))
            return cls(((FULL, None),))
        unknown = sorted(set(types) - {FULL, SLIDING, CHUNKED})
        if unknown:
            raise NotImplementedError(
                f"this model has layers of type {', '.join(map(repr, unknown))}: opttree verifies a tree with masks over "
                f"full, sliding-window and chunked attention layers only (a recurrent or shared layer's state cannot be "
                f"rewound to the accepted path); call generate() without draft_model= for this model")
        sizes = {SLIDING: getattr(text, "sliding_window", None), CHUNKED: getattr(text, "attention_chunk_size", None)}
        windows = []
        for kind in dict.fromkeys(types):  # each type once, in the model's order
            size = sizes.get(kind)
            windows.append((kind, None if kind == FULL or size is None else Window(kind, int(size))))
        return cls(tuple(windows))

    @property
    def windowed(self) -> bool:
        """Whether any layer sees less than the whole sequence."""
        return any(window is not None for _, window in self.windows)

    def masks(self, visible: torch.Tensor, queries: torch.Tensor, keys: torch.Tensor, dtype: torch.dtype,
              dropped: dict[int, int] | None = None):
        """The forward's ``attention_mask``: one [B, 1, q, kv] additive mask in ``dtype`` where every layer
        sees the same (a single window, or none), else ``{layer type: mask}`` (only a config with
        ``layer_types`` has several, and its model takes the mapping).

        visible: [B, q, kv] bool, what the tree and the rows allow; queries: [B, q] long and keys: [B, kv]
        long, the sequence indices of the new tokens and of every key slot (a hidden slot's index is
        never read). dropped: {window size: leading slots a layer of that window no longer holds} (a
        cache that keeps only the window: its mask starts after them); None: every layer holds every slot."""
        made = {}
        for window in dict.fromkeys(window for _, window in self.windows):
            if window is None:
                made[window] = _additive(visible, dtype)
                continue
            skip = dropped.get(window.size, 0) if dropped else 0
            made[window] = _additive((visible & window.allows(queries, keys))[..., skip:], dtype)
        if len(made) == 1:
            return next(iter(made.values()))
        return {kind: made[window] for kind, window in self.windows}


def _additive(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[B, q, kv] bool -> [B, 1, q, kv]: 0 where visible, finfo(dtype).min elsewhere."""
    mask = torch.where(visible, 0.0, torch.finfo(dtype).min)
    return (mask if mask.dtype == dtype else mask.to(dtype))[:, None]


__all__ = ["CHUNKED", "FULL", "MaskLayout", "SLIDING", "Window"]
