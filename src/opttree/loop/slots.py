"""The target cache's slots for the rows of one decode, and step 4's keep of them.

The rows share the cache's slots but not their positions. A row's unused slots are *holes*: its left
padding, and in each step the slots another row filled when it accepted more (dummy nodes, which pad
every tree to the batch's largest, are dropped with the step's rejected nodes). :class:`Slots` keeps
``valid`` [R, L], the slots holding each row's committed tokens (all but its root); each row's 4D mask
hides the rest (:mod:`.verify_inputs`), and its rotary positions count only its own tokens, as
generate() computes them from the attention mask, so a row's logits are those of the row decoded
alone (up to rounding). Holes go when rows leave (:meth:`Slots.select`) and are squeezed out
(``kv_cache.compact_rows``) once they pass a share of the cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..hf import kv_cache
from ..tree.layout import MaskLayout
from ..verify.acceptance import Acceptance
from .rows import Padding, Row


@dataclass
class Slots:
    """Where the rows' committed tokens (all but each row's root) sit in the target's cache.

    One layout for every batch size, with one declared switch, ``holes``: whether a row may own less
    than every slot. False only for one unpadded prompt (:meth:`of`): then slot i holds its token i,
    so ``valid`` and ``index`` are not kept (None), its mask is its tree under a visible prefix, and
    step 4 keeps its path with one in-place move (``kv_cache.keep_slots``). It is not a batch of one
    for measured reasons, pinned by tests/test_overhead.py (one row's step: at most one host-to-device
    copy, and a host read per drafted layer plus two): the holes' bookkeeping copies three host lists
    to the device each step (the roots' positions, the kept slots and their counts) and reads the
    device twice (``keep_row_slots``' test of an unmoved path, ``worth_compacting``); and a windowed
    model's one-row cache keeps only the window (``kv_cache.WindowLayer``) where rows with holes keep
    every slot. tests/test_batch.py decodes one prompt both ways and holds them to the same tokens.
    """

    length: int  # cache slots before this step's roots
    valid: torch.Tensor | None  # [R, length] bool, each row's own slots; None without holes (all the one row's)
    holes: bool = True  # a row may own less than every slot (see the class docstring); False: one unpadded row
    kv_len: int | None = None  # a static cache's slots (the mask spans them); None: a cache that grows
    layout: MaskLayout | None = None  # the target's layer types and windows
    # [R, length] long, the index in its row's tokens of each slot's token (what a window counts), kept
    # beside ``valid`` when the layout has windows; None otherwise (no holes: slot i holds index i)
    index: torch.Tensor | None = None

    @classmethod
    def of(cls, mask: torch.Tensor, padding: Padding, layout: MaskLayout, kv_len: int | None,
           holes: bool) -> "Slots":
        """The prompts' slots before their prefill: mask [B, T] bool (all True without padding); holes:
        whether a row may own less than every slot (False: one unpadded prompt, every slot its own)."""
        length = mask.shape[1] - 1
        if not holes:
            return cls(length, None, holes=False, kv_len=kv_len, layout=layout)
        index = None
        if layout.windowed:
            left = torch.tensor(padding.left, device=mask.device)
            index = torch.arange(length, device=mask.device)[None, :] - left[:, None]  # [B, T - 1]
        return cls(length, mask[:, :-1].clone(), kv_len=kv_len, layout=layout, index=index)

    def keep(self, cache, acceptances: list[Acceptance], rows: list[Row]) -> None:
        """Step 4 in the target's cache: each row keeps its root and accepted path (the verify forward
        put row b's root at ``length`` and its node i at ``length + 1 + i``); everything else of the
        step (rejected nodes, dummy rows) is dropped. rows: the step's rows, their roots not yet
        committed past."""
        if not self.holes:  # slot i is the row's token i: one in-place move of the path
            nodes, on_device = acceptances[0].nodes, acceptances[0].device_rows
            kv_cache.keep_slots(cache, self.length + 1, [self.length + 1 + i for i in nodes],
                                None if on_device is None else on_device[1:] + self.length)
            self.length += 1 + len(nodes)
            return
        self._keep_with_holes(cache, acceptances, rows)
        if self.kv_len is None and kv_cache.worth_compacting(self.valid):  # a static cache keeps its slots
            order = kv_cache.compact_rows(cache, self.valid)
            self.valid = self.valid.gather(1, order)
            self.index = None if self.index is None else self.index.gather(1, order)
        self.length = self.valid.shape[1]

    def _keep_with_holes(self, cache, acceptances: list[Acceptance], rows: list[Row]) -> None:
        """Each row's root and path moved to the front of the step's slots; the cache keeps 1 + the most
        any row accepted, and a row's leftover slots there become holes."""
        past, device = self.length, self.valid.device
        width = 1 + max(a.accepted for a in acceptances)  # shorter rows are padded with holes
        slots = torch.tensor([[past] + [past + 1 + n for n in a.nodes] + [past] * (width - 1 - a.accepted)
                              for a in acceptances], dtype=torch.long, device=device)  # [R, width]
        kv_cache.keep_row_slots(cache, past, slots)
        kept = torch.tensor([1 + a.accepted for a in acceptances], device=device)  # [R]
        steps = torch.arange(width, device=device)[None, :]  # [1, width]
        self.valid = torch.cat([self.valid, steps < kept[:, None]], dim=1)
        if self.index is not None:  # the root's index, then one more per accepted node (holes: never read)
            roots = torch.tensor([row.root_index for row in rows], device=self.index.device)
            self.index = torch.cat([self.index, roots[:, None] + steps], dim=1)

    def select(self, cache, keep: list[int]) -> None:
        """Step 6 in the target's cache: only rows ``keep`` go on; slots no remaining row uses leave it
        (rows leave only a decode of several, which has holes)."""
        index = torch.tensor(keep, dtype=torch.long, device=self.valid.device)
        valid = self.valid[index]
        columns = torch.nonzero(valid.any(dim=0)).flatten()
        compact = len(columns) < valid.shape[1]
        kv_cache.select(cache, index, columns if compact else None)
        self.valid = valid[:, columns] if compact else valid
        if self.index is not None:
            self.index = self.index[index][:, columns] if compact else self.index[index]
        self.length = self.valid.shape[1]


__all__ = ["Slots"]
