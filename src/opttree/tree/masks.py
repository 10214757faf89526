"""Tree inputs for a stock HF causal LM: 4D additive masks, rotary positions and cache slots.

A forward over q new tokens on top of ``past_len`` cached ones takes
  attention_mask  [1, 1, q, kv]  additive, 0 where visible, finfo(dtype).min elsewhere
                  (an additive mask in the model dtype: a bool mask gave wrong logits in bf16 eager);
                  kv = past_len + q for a growing cache, a static cache's whole length otherwise
                  (the slots past the new tokens hidden);
  position_ids    [1, q]  rotary / learned positions = past_len + depth of each token;
  cache_position  [q]     cache slots = past_len … past_len + q - 1.
Positions and cache slots differ for tree tokens: siblings share a position, never a slot. A
verification forward has q = one of :data:`~opttree.tree.sizes.VERIFY_SIZES` rows: the root, the
tree, then dummy rows (the root's token and position; no real row sees them, their outputs are
unused and their slots dropped).

A batch (rows of different lengths and trees, opttree.loop.slots) shares the cache slots: the mask is
[B, 1, q, past_len + q], each row seeing only the slots that hold ITS committed tokens (left
padding and holes are hidden), and its rotary positions count only its own tokens.

A model with sliding-window or chunked layers (:class:`~opttree.tree.layout.MaskLayout`, given as
``layout``) gets each layer type its own mask: what the tree allows AND what the window allows,
from the sequence index of every query and key slot (a dict ``{layer type: mask}`` where the types
differ), starting after the slots a window's layers no longer hold (``dropped``: one row's cache
keeps only the window, kv_cache.WindowLayer). Without windows (``layout`` None or windowless) the
masks are built as above, with no extra op.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .draft_tree import DraftTree
from .layout import MaskLayout


@dataclass
class ForwardInputs:
    input_ids: torch.Tensor  # [1, q] long
    attention_mask: torch.Tensor | dict[str, torch.Tensor]  # [1, 1, q, past_len + q]; per layer type where they differ
    position_ids: torch.Tensor  # [1, q] long
    cache_position: torch.Tensor  # [q] long
    past_len: int  # the cached slots before the new tokens (known on the host: no read of the cache's count)

    def as_kwargs(self) -> dict:
        return dict(input_ids=self.input_ids, attention_mask=self.attention_mask,
                    position_ids=self.position_ids, cache_position=self.cache_position)


def _additive(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """visible: [..., kv] bool -> the same shape in ``dtype``: 0 where visible, finfo(dtype).min
    elsewhere (one ``where``, in the default float dtype, cast only when ``dtype`` differs)."""
    mask = torch.where(visible, 0.0, torch.finfo(dtype).min)
    return mask if mask.dtype == dtype else mask.to(dtype)


def additive_mask(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """visible: [q, kv] bool -> [1, 1, q, kv] (or [B, q, kv] -> [B, 1, q, kv]) additive mask in ``dtype``."""
    mask = _additive(visible, dtype)
    return mask[None, None] if visible.dim() == 2 else mask[:, None]


def tree_forward_inputs(
    tokens: torch.Tensor,  # [q] long, the new tokens
    positions: torch.Tensor,  # [q] long, their rotary positions
    tail_visible: torch.Tensor,  # [q, c] bool, which of the LAST c columns each new token sees
    past_len: int,
    dtype: torch.dtype,
    slot_ids: torch.Tensor | None = None,  # [≥ past_len + q] long 0, 1, ...: the cache slots are a slice of it
    kv_len: int | None = None,  # the mask's key length: a static cache's length (≥ past_len + q); None: past_len + q
    layout: MaskLayout | None = None,  # the model's layer types and windows; None: every layer sees everything
    tail_positions: torch.Tensor | None = None,  # [c] long, the last c columns' positions; None: ``positions`` (c = q)
    dropped: dict[int, int] | None = None,  # {window size: leading slots its layers no longer hold} (kv_cache.WindowLayer)
) -> ForwardInputs:
    """Inputs for q new tokens that see all cached tokens but the last ``c - q`` of them (earlier
    tree nodes), and of the last c columns (those nodes and the new tokens) what ``tail_visible``
    allows; slots after the new tokens (a static cache's) are hidden. The cached tokens before the
    last c columns are the row's sequence in order (slot i holds index i); a windowed ``layout`` reads
    the tail's indices from ``tail_positions``."""
    q, c = tail_visible.shape
    kv = past_len + q
    if layout is not None and layout.windowed:
        mask = _windowed_row_mask(positions, tail_visible, kv, kv_len or kv, layout, dtype,
                                  positions if tail_positions is None else tail_positions, dropped)
    else:
        mask = torch.nn.functional.pad(_additive(tail_visible, dtype), (kv - c, 0))  # [q, kv] additive, the prefix visible
        if kv_len is not None and kv_len > kv:
            mask = torch.nn.functional.pad(mask, (0, kv_len - kv), value=torch.finfo(dtype).min)  # [q, kv_len]
        mask = mask.view(1, 1, q, mask.shape[-1])
    return ForwardInputs(
        input_ids=tokens.unsqueeze(0),
        attention_mask=mask,
        position_ids=positions.unsqueeze(0),
        cache_position=torch.arange(past_len, kv, device=tokens.device) if slot_ids is None else slot_ids[past_len:kv],
        past_len=past_len,
    )


def _windowed_row_mask(positions: torch.Tensor, tail_visible: torch.Tensor, kv: int, kv_len: int,
                       layout: MaskLayout, dtype: torch.dtype, tail_positions: torch.Tensor,
                       dropped: dict[int, int] | None):
    """One row's masks per layer type. positions: [q] the queries' indices; tail_visible: [q, c];
    tail_positions: [c]; the first kv - c slots hold indices 0 … kv - c - 1, slots from kv on are hidden."""
    q, c = tail_visible.shape
    visible = torch.nn.functional.pad(tail_visible, (kv - c, 0), value=True)  # [q, kv]: the prefix seen
    visible = torch.nn.functional.pad(visible, (0, kv_len - kv), value=False)  # [q, kv_len]: a static cache's rest hidden
    keys = torch.cat([torch.arange(kv - c, device=positions.device), tail_positions,
                      positions.new_zeros(kv_len - kv)])  # [kv_len]
    return layout.masks(visible[None], positions[None], keys[None], dtype, dropped)


def verification_inputs(root_token, tree: DraftTree, past_len: int, dtype: torch.dtype, size: int | None = None,
                        kv_len: int | None = None, layout: MaskLayout | None = None,
                        dropped: dict[int, int] | None = None) -> ForwardInputs:
    """The target's input: the root (position past_len), every tree node (past_len + depth), then
    dummy rows up to ``size`` rows (None: none; see the module docstring). ``kv_len``, ``layout``,
    ``dropped``: as :func:`tree_forward_inputs`.

    root_token: an int or a [1] long tensor. Row 0 of the output predicts the root's children;
    row 1 + i those of node i; rows from len(tree) + 1 on are the dummies'.
    """
    device = tree.tokens.device
    rows = len(tree) + 1
    extra = (size or rows) - rows
    if extra < 0:
        raise ValueError(f"a tree of {len(tree)} nodes needs {rows} rows, more than size={size}")
    root = torch.as_tensor(root_token, device=device).reshape(1)  # [1]
    tokens = torch.cat([root, tree.tokens, root.expand(extra)])  # [size]
    positions = torch.nn.functional.pad(tree.depths(), (1, extra)) + past_len  # [size], dummies at the root's
    return tree_forward_inputs(tokens, positions, tree_visibility(tree, extra), past_len, dtype, kv_len=kv_len,
                               layout=layout, dropped=dropped)


def tree_visibility(tree: DraftTree, extra: int = 0) -> torch.Tensor:
    """[n + 1 + extra, n + 1 + extra] bool over the root (0), the nodes (1 + i) and ``extra`` dummy
    rows: each node sees the root and its ancestors; a dummy sees the rows before it and itself,
    and no row before it sees it."""
    return torch.nn.functional.pad(tree.ancestor_mask(), (1, extra, 1, extra), value=True).tril_()


# ---------------------------------------------------------------------------------------------
# batches: rows share the cache slots, not the positions


def row_visibility(prefix_visible: torch.Tensor, tail_visible: torch.Tensor, past_len: int) -> torch.Tensor:
    """What each row's q new tokens see.

    prefix_visible: [B, P] bool, which of the first P cached slots hold the row's committed tokens
    tail_visible:   [B, q, c] bool, which of the LAST c columns (slots of this step, new tokens
                    included) each new token sees; slots in between (P ≤ slot < past_len + q - c)
                    are hidden
    returns:        [B, q, past_len + q] bool
    """
    rows, q, c = tail_visible.shape
    kv = past_len + q
    visible = torch.zeros(rows, q, kv, dtype=torch.bool, device=tail_visible.device)
    visible[:, :, :prefix_visible.shape[1]] = prefix_visible[:, None, :]
    visible[:, :, kv - c:] = tail_visible
    return visible


def row_indices(prefix_indices: torch.Tensor, tail_indices: torch.Tensor, kv: int) -> torch.Tensor:
    """The sequence index of every key slot, laid out as :func:`row_visibility` lays out what is seen.

    prefix_indices: [B, P] long, the first P slots'; tail_indices: [B, c], the last c columns'
    returns:        [B, kv] long (slots in between: 0; they are hidden)
    """
    rows, c = tail_indices.shape
    keys = tail_indices.new_zeros(rows, kv)
    keys[:, :prefix_indices.shape[1]] = prefix_indices
    keys[:, kv - c:] = tail_indices
    return keys


def batch_forward_inputs(tokens: torch.Tensor, positions: torch.Tensor, visible: torch.Tensor, past_len: int,
                         dtype: torch.dtype, layout: MaskLayout | None = None, key_indices: torch.Tensor | None = None,
                         query_indices: torch.Tensor | None = None) -> ForwardInputs:
    """tokens, positions: [B, q] long; visible: [B, q, past_len + q] bool (see :func:`row_visibility`).
    A windowed ``layout`` needs ``key_indices`` [B, past_len + q] (:func:`row_indices`) and the queries'
    indices [B, q] (None: ``positions``, the same numbers where no prompt token is hidden)."""
    windowed = layout is not None and layout.windowed
    return ForwardInputs(
        input_ids=tokens,
        attention_mask=(layout.masks(visible, positions if query_indices is None else query_indices, key_indices, dtype)
                        if windowed else additive_mask(visible, dtype)),
        position_ids=positions,
        cache_position=torch.arange(past_len, past_len + tokens.shape[1], device=tokens.device),
        past_len=past_len,
    )


def batch_verification_inputs(roots: torch.Tensor, trees: list[DraftTree], root_positions: torch.Tensor,
                              prefix_visible: torch.Tensor, dtype: torch.dtype, size: int | None = None,
                              layout: MaskLayout | None = None, prefix_indices: torch.Tensor | None = None,
                              root_indices: torch.Tensor | None = None, kv_len: int | None = None) -> ForwardInputs:
    """The target's input for a batch: row b = its root, its tree, then dummy nodes up to the
    largest tree, or to ``size`` rows (the root's token, seeing the prefix and themselves; their
    outputs are unused).

    roots: [B] long; root_positions: [B] long, each root's rotary position (= the row's count of
    committed tokens before it); prefix_visible: [B, past_len] bool, the slots of each row's
    committed tokens. Row b's logits are output rows 0 … len(trees[b]) (0 = the root).
    A windowed ``layout`` also needs the sequence index of every prefix slot (``prefix_indices``
    [B, past_len] long) and of each root (``root_indices`` [B]; None: ``root_positions``). ``kv_len``: a
    static cache's length (the masks span it, the slots after the new tokens hidden).
    """
    rows, past_len = prefix_visible.shape
    q = max(1 + max(len(tree) for tree in trees), size or 0)
    device = prefix_visible.device
    tokens = roots[:, None].repeat(1, q)  # [B, q]
    positions = root_positions[:, None].repeat(1, q)  # [B, q]
    tail = torch.eye(q, dtype=torch.bool, device=device).repeat(rows, 1, 1)  # [B, q, q]
    for b, tree in enumerate(trees):
        n = len(tree)
        tokens[b, 1:n + 1] = tree.tokens
        positions[b, 1:n + 1] += tree.depths()
        tail[b, :n + 1, :n + 1] = tree_visibility(tree)
    visible = row_visibility(prefix_visible, tail, past_len)
    extra = 0 if kv_len is None else kv_len - past_len - q  # a static cache's slots after the new tokens: hidden
    if extra:
        visible = torch.nn.functional.pad(visible, (0, extra), value=False)  # [B, q, kv_len]
    if layout is None or not layout.windowed:
        return batch_forward_inputs(tokens, positions, visible, past_len, dtype)
    queries = positions if root_indices is None else positions + (root_indices - root_positions)[:, None]  # [B, q]
    keys = torch.nn.functional.pad(row_indices(prefix_indices, queries, past_len + q), (0, extra))
    return batch_forward_inputs(tokens, positions, visible, past_len, dtype, layout, keys, queries)
