"""Tree inputs for a stock HF causal LM: 4D additive masks, rotary positions and cache slots.

A forward over q new tokens on top of ``past_len`` cached ones takes
  attention_mask  [1, 1, q, past_len + q]  additive, 0 where visible, finfo(dtype).min elsewhere
                  (an additive mask in the model dtype: a bool mask gave wrong logits in bf16 eager);
  position_ids    [1, q]  rotary / learned positions = past_len + depth of each token;
  cache_position  [q]     cache slots = past_len … past_len + q - 1.
Positions and cache slots differ for tree tokens: siblings share a position, never a slot.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .tree import DraftTree


@dataclass
class ForwardInputs:
    input_ids: torch.Tensor  # [1, q] long
    attention_mask: torch.Tensor  # [1, 1, q, past_len + q]
    position_ids: torch.Tensor  # [1, q] long
    cache_position: torch.Tensor  # [q] long

    def as_kwargs(self) -> dict:
        return dict(input_ids=self.input_ids, attention_mask=self.attention_mask,
                    position_ids=self.position_ids, cache_position=self.cache_position)


def additive_mask(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """visible: [q, kv] bool -> [1, 1, q, kv] additive mask in ``dtype``."""
    mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    mask.masked_fill_(~visible, torch.finfo(dtype).min)
    return mask[None, None]


def tree_forward_inputs(
    tokens: torch.Tensor,  # [q] long, the new tokens
    positions: torch.Tensor,  # [q] long, their rotary positions
    tail_visible: torch.Tensor,  # [q, c] bool, which of the LAST c columns each new token sees
    past_len: int,
    dtype: torch.dtype,
) -> ForwardInputs:
    """Inputs for q new tokens that see all cached tokens but the last ``c - q`` of them (earlier
    tree nodes), and of the last c columns (those nodes and the new tokens) what ``tail_visible``
    allows."""
    q, c = tail_visible.shape
    kv = past_len + q
    visible = torch.ones(q, kv, dtype=torch.bool, device=tokens.device)
    visible[:, kv - c:] = tail_visible
    return ForwardInputs(
        input_ids=tokens[None, :],
        attention_mask=additive_mask(visible, dtype),
        position_ids=positions[None, :],
        cache_position=torch.arange(past_len, kv, device=tokens.device),
    )


def verification_inputs(root_token: int, tree: DraftTree, past_len: int, dtype: torch.dtype) -> ForwardInputs:
    """The target's input: the root (position past_len) then every tree node (past_len + depth).

    Row 0 of the output predicts the root's children; row 1 + i those of node i.
    """
    n = len(tree)
    device = tree.tokens.device
    visible = torch.zeros(n + 1, n + 1, dtype=torch.bool, device=device)
    visible[:, 0] = True  # everyone sees the root
    visible[1:, 1:] = tree.ancestor_mask()
    tokens = torch.cat([torch.tensor([root_token], device=device), tree.tokens])
    depths = torch.cat([torch.zeros(1, dtype=torch.long, device=device), tree.depths()])
    return tree_forward_inputs(tokens, past_len + depths, visible, past_len, dtype)
