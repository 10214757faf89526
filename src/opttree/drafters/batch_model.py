"""A draft model over the rows of a batch: ONE draft forward per step's catch-up and per tree
layer serves every row (the rows' tree builders run in lockstep, loop/lockstep.py).

The rows share the cache's slots. ``valid`` [B, L] marks the slots holding each row's committed
tokens; anything else (a row's unused slots, dummy inputs) is a hole its mask hides. A row's
rotary positions count only its own tokens, so holes never shift them. Batch size 1 uses
:class:`~opttree.drafters.model.ModelDrafter` itself (PerRow in drafters/base.py), which needs no holes.
"""

from __future__ import annotations

import torch

from ..hf import kv_cache
from ..hf.compat import with_cache
from ..tree.draft_probs import DraftProbs
from ..tree.layout import MaskLayout
from ..tree.masks import batch_forward_inputs, row_indices, row_visibility
from .base import DrafterRows, ToProbs


def input_device(model) -> torch.device:
    """Where a model's inputs go: its input embedding's device, or accelerate's execution device
    for it when the model is offloaded (its parameters then sit on the meta device)."""
    embedding = model.get_input_embeddings()
    device = getattr(getattr(embedding, "_hf_hook", None), "execution_device", None)
    return embedding.weight.device if device is None else torch.device(device)


class BatchModelDrafter(DrafterRows):
    """A draft model's :class:`DrafterRows` for two or more rows (see the module docstring)."""

    def __init__(self, model, to_probs: ToProbs, rows: int):
        self.model = model
        self.to_probs = to_probs
        self._device = input_device(model)  # a drafter lives for one generate() call: the model stays put
        self.dtype = model.dtype  # its masks' dtype, read once (HF's ``model.dtype`` walks the parameters)
        self.layout = MaskLayout.of(model.config)  # its layers' windows (the masks honour them)
        self.cache = kv_cache.new_cache(model, rows)  # its sliding layers keep every slot: the rows sit apart
        self.valid = torch.zeros(rows, 0, dtype=torch.bool, device=self.device)  # [B, L] committed slots
        # [B, L] long, each slot's position (what a window counts), kept where the layout has windows
        self.index = torch.zeros(rows, 0, dtype=torch.long, device=self.device) if self.layout.windowed else None
        self.seen = [0] * rows  # committed tokens of each row in the cache (the root included)
        self.step_start = 0  # first slot of this step's tree nodes
        self.slots: list[dict[int, int]] = [{} for _ in range(rows)]  # per row: pool id -> slot
        self._forwards = 0

    @property
    def forwards(self) -> int:
        return self._forwards

    @property
    def device(self) -> torch.device:
        return self._device

    def caches(self) -> list:
        return [self.cache]

    def _forward(self, tokens: torch.Tensor, positions: torch.Tensor, tail_visible: torch.Tensor) -> torch.Tensor:
        """tokens, positions: [B, q]; tail_visible: [B, q, c] over this step's last c slots -> [B, q, vocab]
        (the slots before them are ``valid``'s, the committed ones)."""
        past_len = kv_cache.cache_length(self.cache)
        visible = row_visibility(self.valid, tail_visible, past_len)
        keys = None
        if self.index is not None:  # the step's slots so far, then the new tokens
            self.index = torch.cat([self.index, positions], dim=1)
            keys = row_indices(self.index[:, :self.valid.shape[1]], self.index[:, self.valid.shape[1]:],
                               past_len + tokens.shape[1])
        inputs = batch_forward_inputs(tokens, positions, visible, past_len, self.dtype, self.layout, keys)
        out = self.model(**inputs.as_kwargs(), **with_cache(self.model, self.cache), use_cache=True, logits_to_keep=0)
        self._forwards += 1
        return out.logits.float()

    def root_probs(self, sequences: list[torch.Tensor]) -> torch.Tensor:
        """sequences: each row's committed tokens ([T_b] long, no padding, ending with its root)
        -> [B, vocab], the draft's q at each root. Feeds every row's unseen tokens in one forward."""
        new = [seq[seen:].to(self.device) for seq, seen in zip(sequences, self.seen)]
        counts = torch.tensor([len(t) for t in new], device=self.device)  # [B]
        if int(counts.min()) == 0:
            raise AssertionError("the drafter has already seen a row's whole sequence; this is a bug")
        u = int(counts.max())
        tokens = torch.stack([torch.cat([t, t[-1:].expand(u - len(t))]) for t in new])  # [B, u], padded with holes
        real = torch.arange(u, device=self.device)[None, :] < counts[:, None]  # [B, u]
        seen = torch.tensor(self.seen, device=self.device)[:, None]  # [B, 1]
        positions = torch.where(real, seen + torch.arange(u, device=self.device), seen)  # holes: any position in range
        causal = torch.ones(u, u, dtype=torch.bool, device=self.device).tril()
        tail = (causal & real[:, None, :]) | torch.eye(u, dtype=torch.bool, device=self.device)  # [B, u, u]
        logits = self._forward(tokens, positions, tail)
        self.valid = torch.cat([self.valid, real], dim=1)
        self.seen = [len(seq) for seq in sequences]
        self.step_start = self.valid.shape[1]
        self.slots = [{} for _ in sequences]
        return self.to_probs(logits[torch.arange(len(new), device=self.device), counts - 1])

    def expand(self, requests: list) -> list[DraftProbs | None]:
        """requests: per row ``(pool, frontier)`` or None (a row not expanding) -> per row its
        children's q (dense, k_b rows) or None. One forward; a row's frontier node sees its row's
        committed tokens, this step's slots of its ancestors, and itself."""
        rows = len(requests)
        past_len = kv_cache.cache_length(self.cache)
        fed = past_len - self.step_start  # this step's slots so far
        k = max(len(r[1]) for r in requests if r is not None)
        tokens = torch.zeros(rows, k, dtype=torch.long, device=self.device)
        positions = torch.zeros(rows, k, dtype=torch.long, device=self.device)
        tail = torch.zeros(rows, k, fed + k, dtype=torch.bool, device=self.device)  # [B, k, fed + k]
        tail[:, :, fed:] = torch.eye(k, dtype=torch.bool, device=self.device)  # holes see themselves
        for b, request in enumerate(requests):
            if request is None:
                continue
            pool, frontier = request
            own = list(self.slots[b])  # pool ids fed this step
            columns = torch.tensor([self.slots[b][pid] - self.step_start for pid in own] + list(range(fed, fed + len(frontier))),
                                   dtype=torch.long, device=self.device)
            ancestors = pool.ancestor_mask()  # [m, m]
            index = torch.tensor(own + frontier.tolist(), dtype=torch.long, device=ancestors.device)
            sees = ancestors[frontier.to(ancestors.device)][:, index].to(self.device)  # [k_b, c_b]
            tail[b, :len(frontier)] = False
            tail[b, :len(frontier), columns] = sees
            depths = pool.depths()[frontier]
            tokens[b, :len(frontier)] = pool.tokens[frontier].to(self.device)
            positions[b] = self.seen[b] - 1 + int(depths.min())  # holes: any position in range
            positions[b, :len(frontier)] = (self.seen[b] - 1 + depths).to(self.device)
        logits = self._forward(tokens, positions, tail)
        out: list[DraftProbs | None] = []
        for b, request in enumerate(requests):
            if request is None:
                out.append(None)
                continue
            frontier = request[1]
            for j, pid in enumerate(frontier.tolist()):
                self.slots[b][pid] = past_len + j
            out.append(DraftProbs.dense(self.to_probs(logits[b, :len(frontier)])))
        return out

    def commit(self, accepted: list[list[int]]) -> None:
        """accepted: per row the accepted pool ids, root to leaf. Each row keeps the slots of those
        it has computed (a prefix of the path), moved to the front of this step's slots."""
        kept = []
        for b, pids in enumerate(accepted):
            row = []
            for pid in pids:
                if pid not in self.slots[b]:
                    break
                row.append(self.slots[b][pid])
            kept.append(row)
        width = max(map(len, kept))
        slots = torch.tensor([row + [self.step_start] * (width - len(row)) for row in kept],  # padding: holes
                             dtype=torch.long, device=self.device).reshape(len(kept), width)  # [B, width]
        kv_cache.keep_row_slots(self.cache, self.step_start, slots)
        counts = torch.tensor([len(row) for row in kept], device=self.device)
        real = torch.arange(width, device=self.device)[None, :] < counts[:, None]  # [B, width]
        self.valid = torch.cat([self.valid[:, :self.step_start], real], dim=1)
        if self.index is not None:
            self.index = torch.cat([self.index[:, :self.step_start], self.index.gather(1, slots)], dim=1)
        self.seen = [seen + len(row) for seen, row in zip(self.seen, kept)]
        self.slots = [{} for _ in kept]
        if kv_cache.worth_compacting(self.valid):  # squeeze the holes out of the cache
            order = kv_cache.compact_rows(self.cache, self.valid)
            self.valid = self.valid.gather(1, order)
            self.index = None if self.index is None else self.index.gather(1, order)
            self.step_start = self.valid.shape[1]

    def select(self, keep: list[int]) -> None:
        """Keep only the batch rows ``keep``, and only slots some of them still use."""
        rows = torch.tensor(keep, dtype=torch.long, device=self.device)
        self.valid = self.valid[rows]
        self.index = None if self.index is None else self.index[rows]
        columns = torch.nonzero(self.valid.any(dim=0)).flatten()
        kv_cache.select(self.cache, rows, columns if len(columns) < self.valid.shape[1] else None)
        if len(columns) < self.valid.shape[1]:
            self.valid = self.valid[:, columns]
            self.index = None if self.index is None else self.index[:, columns]
        self.seen = [self.seen[b] for b in keep]
        self.slots = [{} for _ in keep]
        self.step_start = self.valid.shape[1]
