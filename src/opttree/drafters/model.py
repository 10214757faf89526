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
from ..masks import tree_forward_inputs
from ..tree import DraftTree


class ModelDrafter:
    def __init__(self, model, to_probs: Callable[[torch.Tensor], torch.Tensor] | None = None):
        """model: an HF causal LM sharing the target's vocabulary.
        to_probs: draft logits [k, vocab] float32 -> probabilities [k, vocab]; softmax by default.
        """
        self.model = model
        self.to_probs = to_probs or (lambda logits: torch.softmax(logits, dim=-1))
        self.cache = kv_cache.new_cache(model)
        self.prefix_len = 0  # committed tokens in the cache (the root included)
        self.slots: dict[int, int] = {}  # pool id -> cache slot of the nodes fed this step
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
        return out.logits[0].float()  # [q, vocab]

    def root_probs(self, sequence: torch.Tensor) -> torch.Tensor:
        new = sequence[self.prefix_len:].to(self.device)[None, :]  # [1, q]
        if new.shape[1] == 0:
            raise AssertionError("the drafter has already seen the whole sequence; this is a bug")
        positions = torch.arange(self.prefix_len, len(sequence), device=self.device)[None, :]
        logits = self._forward(input_ids=new, position_ids=positions,
                               cache_position=positions[0], logits_to_keep=1)
        self.prefix_len = len(sequence)
        self.slots = {}
        return self.to_probs(logits[-1:])[0]

    def expand(self, pool: DraftTree, frontier: torch.Tensor) -> torch.Tensor:
        fed = sorted(self.slots, key=self.slots.get)  # pool ids already in the cache, slot order
        columns = fed + frontier.tolist()  # the cache's tree part after this forward
        col_of = {pid: c for c, pid in enumerate(columns)}
        ancestors = pool.ancestor_mask()  # [m, m]
        # node i (a frontier node) sees column c when that column holds i or one of its ancestors
        tail_visible = ancestors[frontier.to(ancestors.device)][:, torch.tensor(columns, device=ancestors.device)]  # [k, c]
        past_len = self.prefix_len + len(fed)
        depths = pool.depths()[frontier]
        inputs = tree_forward_inputs(
            pool.tokens[frontier].to(self.device),
            (self.prefix_len - 1 + depths).to(self.device),
            tail_visible.to(self.device),
            past_len,
            self.model.dtype,
        )
        logits = self._forward(**inputs.as_kwargs())
        for pid in frontier.tolist():
            self.slots[pid] = self.prefix_len + col_of[pid]
        return self.to_probs(logits)

    def commit(self, accepted_pool_ids: list[int]) -> None:
        seen = []
        for pid in accepted_pool_ids:  # the fed nodes of a path are a prefix of it
            if pid not in self.slots:
                break
            seen.append(self.slots[pid])
        slots = torch.tensor(seen, dtype=torch.long, device=self.device)
        kv_cache.keep_slots(self.cache, self.prefix_len, slots)
        self.prefix_len += len(seen)
        self.slots = {}
