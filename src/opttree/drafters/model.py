"""A small HF causal LM as the drafter, with its own KV cache.

Each step: :meth:`root_probs` feeds the committed tokens the draft has not seen yet (the first
call is the prompt's prefill); :meth:`expand` feeds one layer of tree nodes in ONE forward with a
tree mask in which each node sees the prefix and its own ancestors only; :meth:`commit` keeps in
the cache the accepted nodes it has already computed and drops the rest, so the next step only
feeds what it has not seen.
"""

from __future__ import annotations

from typing import Callable

import torch

from .. import kv_cache
from ..masks import batch_forward_inputs, row_visibility, tree_forward_inputs
from ..tree import DraftTree


def on(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` on ``device``, without even a no-op ``to`` when it is there already."""
    return tensor if tensor.device == device else tensor.to(device)


class ModelDrafter:
    def __init__(self, model, to_probs: Callable[[torch.Tensor], torch.Tensor] | None = None):
        """model: an HF causal LM sharing the target's vocabulary.
        to_probs: draft logits [k, vocab] float32 -> probabilities [k, vocab]; softmax by default.
        """
        self.model = model
        self.to_probs = to_probs or (lambda logits: torch.softmax(logits, dim=-1))
        self.cache = kv_cache.new_cache(model)
        self.prefix_len = 0  # committed tokens in the cache (the root included)
        self.fed = torch.empty(0, dtype=torch.long, device=self.device)  # [f] pool ids of this step's cache slots, in slot order
        self.forwards = 0

    @property
    def device(self) -> torch.device:
        """Where the draft's inputs go: its input embedding's device, or accelerate's execution
        device for it when the draft is offloaded (its parameters then sit on the meta device)."""
        embedding = self.model.get_input_embeddings()
        device = getattr(getattr(embedding, "_hf_hook", None), "execution_device", None)
        return embedding.weight.device if device is None else torch.device(device)

    def _forward(self, **inputs) -> torch.Tensor:
        out = self.model(**inputs, past_key_values=self.cache, use_cache=True)
        self.forwards += 1
        logits = out.logits[0]  # [q, vocab]
        return logits if logits.dtype == torch.float32 else logits.float()

    def root_probs(self, sequence: torch.Tensor) -> torch.Tensor:
        """sequence: [T] long -> [vocab]: feeds the committed tokens not in the cache yet."""
        new = sequence[self.prefix_len:].to(self.device)[None, :]  # [1, q]
        if new.shape[1] == 0:
            raise AssertionError("the drafter has already seen the whole sequence; this is a bug")
        positions = torch.arange(self.prefix_len, len(sequence), device=self.device)[None, :]
        logits = self._forward(input_ids=new, position_ids=positions,
                               cache_position=positions[0], logits_to_keep=1)
        self.prefix_len = len(sequence)
        self.fed = self.fed[:0]
        return self.to_probs(logits[-1:])[0]

    def expand(self, pool: DraftTree, frontier: torch.Tensor) -> torch.Tensor:
        """frontier: [k] long pool ids -> [k, vocab]. One forward; each node sees the prefix and
        the cache slots of its own ancestors (the pool's ancestor rows, gathered on the device)."""
        device = self.device
        columns = torch.cat([self.fed, on(frontier, self.fed.device)])  # [f + k] the tree part of the cache after this forward
        ancestors = pool.ancestor_mask().index_select(0, frontier)  # [k, m]
        inputs = tree_forward_inputs(
            on(pool.tokens.index_select(0, frontier), device),
            on(ancestors.sum(dim=1) + (self.prefix_len - 1), device),  # depth = ancestors, self included
            on(ancestors.index_select(1, columns), device),  # [k, f + k]
            self.prefix_len + self.fed.shape[0],
            self.model.dtype,
        )
        logits = self._forward(**inputs.as_kwargs())
        self.fed = columns
        return self.to_probs(logits)

    def commit(self, accepted_pool_ids: list[int]) -> None:
        """Keep the cache slots of the accepted nodes fed this step (a prefix of the path): one
        host read finds them."""
        if accepted_pool_ids and self.fed.shape[0]:
            path = torch.tensor(accepted_pool_ids, dtype=torch.long, device=self.fed.device)  # [a]
            hits = path[:, None] == self.fed[None, :]  # [a, f]
            fed_prefix = hits.any(dim=1).cumprod(dim=0).sum()  # how many of the path were fed
            found = torch.cat([fed_prefix[None], hits.to(torch.int8).argmax(dim=1)]).tolist()
            slots = [self.prefix_len + c for c in found[1:1 + found[0]]]
        else:
            slots = []
        kv_cache.keep_slots(self.cache, self.prefix_len, slots)
        self.prefix_len += len(slots)
        self.fed = self.fed[:0]


class BatchModelDrafter:
    """A :class:`ModelDrafter` for a batch of rows (batch.py): ONE draft forward per step's catch-up
    and per tree layer serves every row (the rows' tree builders run in lockstep, lockstep.py).

    The rows share the cache's slots. ``valid`` [B, L] marks the slots holding each row's committed
    tokens; anything else (a row's unused slots, dummy inputs) is a hole its mask hides. A row's
    rotary positions count only its own tokens, so holes never shift them.
    """

    def __init__(self, model, to_probs: Callable[[torch.Tensor], torch.Tensor], rows: int):
        self.model = model
        self.to_probs = to_probs
        self.cache = kv_cache.new_cache(model)
        self.valid = torch.zeros(rows, 0, dtype=torch.bool, device=self.device)  # [B, L] committed slots
        self.seen = [0] * rows  # committed tokens of each row in the cache (the root included)
        self.step_start = 0  # first slot of this step's tree nodes
        self.slots: list[dict[int, int]] = [{} for _ in range(rows)]  # per row: pool id -> slot
        self.forwards = 0

    @classmethod
    def from_drafter(cls, drafter: ModelDrafter, rows: int) -> "BatchModelDrafter":
        return cls(drafter.model, drafter.to_probs, rows)

    device = ModelDrafter.device

    def _forward(self, tokens: torch.Tensor, positions: torch.Tensor, tail_visible: torch.Tensor) -> torch.Tensor:
        """tokens, positions: [B, q]; tail_visible: [B, q, c] over this step's last c slots -> [B, q, vocab]."""
        past_len = kv_cache.cache_length(self.cache)
        visible = row_visibility(self.valid, tail_visible, past_len)
        inputs = batch_forward_inputs(tokens, positions, visible, past_len, self.model.dtype)
        out = self.model(**inputs.as_kwargs(), past_key_values=self.cache, use_cache=True, logits_to_keep=0)
        self.forwards += 1
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

    def expand(self, requests: list) -> list[torch.Tensor | None]:
        """requests: per row ``(pool, frontier)`` or None (a row not expanding) -> per row its
        children's q ([k_b, vocab]) or None. One forward; a row's frontier node sees its row's
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
        out: list[torch.Tensor | None] = []
        for b, request in enumerate(requests):
            if request is None:
                out.append(None)
                continue
            frontier = request[1]
            for j, pid in enumerate(frontier.tolist()):
                self.slots[b][pid] = past_len + j
            out.append(self.to_probs(logits[b, :len(frontier)]))
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
        self.seen = [seen + len(row) for seen, row in zip(self.seen, kept)]
        self.slots = [{} for _ in kept]

    def compact(self) -> None:
        """Squeeze the holes out of the cache (between steps: after :meth:`commit`)."""
        self.valid = kv_cache.compact_rows(self.cache, self.valid)
        self.step_start = self.valid.shape[1]

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only the batch rows ``rows`` ([R] long), and only slots some of them still use."""
        self.valid = self.valid[rows]
        columns = torch.nonzero(self.valid.any(dim=0)).flatten()
        kv_cache.select(self.cache, rows, columns if len(columns) < self.valid.shape[1] else None)
        if len(columns) < self.valid.shape[1]:
            self.valid = self.valid[:, columns]
        self.seen = [self.seen[int(r)] for r in rows]
        self.slots = [{} for _ in rows]
        self.step_start = self.valid.shape[1]
