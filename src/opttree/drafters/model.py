"""A small HF causal LM as the drafter, with its own KV cache.

Each step: :meth:`root_probs` feeds the committed tokens the draft has not seen yet (the first
call is the prompt's prefill); :meth:`expand` feeds one layer of tree nodes in ONE forward with a
tree mask in which each node sees the prefix and its own ancestors only; :meth:`commit` keeps in
the cache the accepted nodes it has already computed and drops the rest, so the next step only
feeds what it has not seen.
"""

from __future__ import annotations

import torch

from ..hf import kv_cache
from ..hf.compat import with_cache
from ..tree.draft_tree import DraftTree
from ..tree.layout import MaskLayout
from ..tree.masks import tree_forward_inputs
from .base import Drafter, DrafterRows, ToProbs
from .batch_model import BatchModelDrafter, input_device


def on(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` on ``device``, without even a no-op ``to`` when it is there already."""
    return tensor if tensor.device == device else tensor.to(device)


def softmax(logits: torch.Tensor) -> torch.Tensor:
    """[k, vocab] -> [k, vocab]: the draft's q for greedy decoding."""
    return torch.softmax(logits, dim=-1)


class ModelDrafter(Drafter):
    def __init__(self, model, to_probs: ToProbs | None = None, context_length: int | None = None):
        """model: an HF causal LM sharing the target's vocabulary.
        to_probs: draft logits [k, vocab] float32 -> probabilities [k, vocab]; softmax by default.
        context_length: the draft's own limit (its max_position_embeddings), None: none.
        """
        self.model = model
        self.to_probs = to_probs or softmax
        self.context_length = context_length
        self._device = input_device(model)  # a drafter lives for one generate() call: the model stays put
        self.dtype = model.dtype  # the tree masks' dtype, read once (HF's ``model.dtype`` walks the parameters)
        self.layout = MaskLayout.of(model.config)  # its layers' windows (the tree masks honour them)
        self.cache = kv_cache.new_cache(model)
        self.prefix_len = 0  # committed tokens in the cache (the root included)
        self.fed = torch.empty(0, dtype=torch.long, device=self.device)  # [f] pool ids of this step's cache slots, in slot order
        self.slot_ids = torch.empty(0, dtype=torch.long, device=self.device)  # [L] 0, 1, ...: cache slots are slices
        self.forwards = 0

    def bind(self, target, to_probs: ToProbs | None) -> "ModelDrafter":
        """A fresh drafter (empty cache) on the same model; sampling: ``to_probs`` makes its q."""
        return ModelDrafter(self.model, to_probs or self.to_probs, self.context_length)

    def fresh(self) -> "ModelDrafter":
        return ModelDrafter(self.model, self.to_probs, self.context_length)

    def caches(self) -> list:
        return [self.cache]

    def modules(self) -> list[torch.nn.Module]:
        return [self.model]

    def rows(self, count: int) -> DrafterRows:
        """One row: this drafter. Several: one draft forward per layer shared by every row."""
        if count == 1:
            return super().rows(1)
        return BatchModelDrafter(self.model, self.to_probs, count)

    @property
    def device(self) -> torch.device:
        return self._device

    def _forward(self, **inputs) -> torch.Tensor:
        out = self.model(**inputs, **with_cache(self.model, self.cache), use_cache=True)
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
        tail_positions = dropped = None
        if self.layout.windowed:  # a window counts the fed nodes' positions too; the cache holds only the window
            tail_positions = on(pool.ancestor_mask().index_select(0, columns).sum(dim=1) + (self.prefix_len - 1), device)
            dropped = kv_cache.window_offsets(self.cache)
        inputs = tree_forward_inputs(
            on(pool.tokens.index_select(0, frontier), device),
            on(ancestors.sum(dim=1) + (self.prefix_len - 1), device),  # depth = ancestors, self included
            on(ancestors.index_select(1, columns), device),  # [k, f + k]
            self.prefix_len + self.fed.shape[0],
            self.dtype,
            self._slots_through(self.prefix_len + self.fed.shape[0] + frontier.shape[0]),
            layout=self.layout,
            tail_positions=tail_positions,
            dropped=dropped,
        )
        logits = self._forward(**inputs.as_kwargs())
        self.fed = columns
        return self.to_probs(logits)

    def _slots_through(self, length: int) -> torch.Tensor:
        """[≥ length] long 0, 1, ...; remade twice as long when short (one kernel now and then
        instead of an arange per drafted layer)."""
        if self.slot_ids.shape[0] < length:
            self.slot_ids = torch.arange(max(length, 2 * self.slot_ids.shape[0], 256), device=self.device)
        return self.slot_ids

    def commit(self, accepted_pool_ids: list[int]) -> None:
        """Keep the cache slots of the accepted nodes fed this step (a prefix of the path): one
        host read finds them."""
        if accepted_pool_ids and self.fed.shape[0]:
            path = torch.tensor(accepted_pool_ids, dtype=torch.long, device=self.fed.device)  # [a]
            hits = path[:, None] == self.fed[None, :]  # [a, f]
            fed_prefix = hits.any(dim=1).cumprod(dim=0).sum()  # how many of the path were fed
            where = hits.to(torch.int8).argmax(dim=1)  # [a] each path node's slot among the fed
            found = torch.cat([fed_prefix[None], where]).tolist()
            slots = [self.prefix_len + c for c in found[1:1 + found[0]]]
            on_device = where[:found[0]] + self.prefix_len  # the same slots, where the cache is
        else:
            slots, on_device = [], None
        kv_cache.keep_slots(self.cache, self.prefix_len, slots, on_device)
        self.prefix_len += len(slots)
        self.fed = self.fed[:0]

