"""The target's inputs beyond token ids and masks, as generate() feeds them.

generate() hands a model more than ``input_ids``: ``inputs_embeds`` (the prompt read from embeddings;
every new token then goes in by id) and ``token_type_ids`` (the prompt's, then each row's last value
repeated for every new token: ``_update_model_kwargs_for_generation``). The loop's forwards cover
other stretches than plain's one token (the prefill stops one token short, a verification forward
holds a root and a tree), so this module gives each forward the matching stretch:

- the prefill: prompt columns ``[:-1]`` (embeddings instead of ids where given);
- the first verification forward: the root is the prompt's last column, so with embeddings its input
  is the prompt's last embedding and the tree nodes' are the model's own embedding of their tokens
  (what the forward computes from ids); later forwards take ids;
- every verification forward: each row's last token type for the root and every node.

Any other model input is refused before decoding (integration/arguments.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ModelInputs:
    embeds: torch.Tensor | None = None  # [B, T, H] the prompt's inputs_embeds (row b: caller's batch row b)
    token_types: torch.Tensor | None = None  # [B, T] long, the prompt's token_type_ids

    @classmethod
    def of(cls, model_kwargs: dict) -> "ModelInputs | None":
        """From generate()'s model kwargs; None when there is nothing beyond ids and masks."""
        embeds, types = model_kwargs.get("inputs_embeds"), model_kwargs.get("token_type_ids")
        return None if embeds is None and types is None else cls(embeds, types)

    def prefill(self, input_ids: torch.Tensor) -> dict:
        """The prefill's inputs for prompt columns [:-1] (input_ids: [B, T] long)."""
        inputs = {"input_ids": input_ids[:, :-1]}
        if self.embeds is not None:
            inputs = {"input_ids": None, "inputs_embeds": self.embeds[:, :-1]}
        if self.token_types is not None:
            inputs["token_type_ids"] = self.token_types[:, :-1]
        return inputs

    def verify(self, target, input_ids: torch.Tensor, batch_rows: list[int], first: bool) -> dict:
        """What a verification forward over ``input_ids`` ([R, q] long: each row's root, then its tree)
        takes beyond its ids; ``batch_rows``: each of the R rows' index in the caller's batch;
        ``first``: the step whose roots are the prompts' last tokens."""
        inputs = {}
        index = torch.tensor(batch_rows, dtype=torch.long, device=input_ids.device)  # [R]
        if self.token_types is not None:
            last = self.token_types[:, -1].to(input_ids.device)[index]  # [R]
            inputs["token_type_ids"] = last[:, None].expand(input_ids.shape)  # [R, q]
        if first and self.embeds is not None:
            embeds = target.get_input_embeddings()(input_ids)  # [R, q, H], as the forward embeds ids
            root = self.embeds[:, -1].to(device=embeds.device, dtype=embeds.dtype)[index.to(embeds.device)]  # [R, H]
            inputs.update(input_ids=None, inputs_embeds=torch.cat([root[:, None], embeds[:, 1:]], dim=1))
        return inputs
