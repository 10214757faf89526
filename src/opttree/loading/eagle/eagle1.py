"""EAGLE-1/2 (:class:`Eagle1Head`): a plain ``*ForCausalLM`` config whose weights are a head's
(``fc.weight`` [h, 2h] and no ``lm_head.weight``), keys ``fc.*`` and ``layers.N.*``.

Forward (SafeAILab/EAGLE cb7e084 ``cnets1.py``; DESIGN.md, "EAGLE heads"): the feature is the
target's last hidden state after its final norm; the entry is ``fc(cat(embedding, feature))`` (with
a bias unless the config says ``"bias": false``), then the layers (the first without an input norm,
:class:`~opttree.drafters.head.eagle_layers.BareInputLayer`), no final norm; logits = the target's
``lm_head`` of the output over the whole vocabulary, and the output is fed back.

Export: EAGLE's own folder (``LlamaForCausalLM``, ``fc``, ``layers.N.*``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path

import torch
from torch import nn

from ...drafters.head.eagle import EagleConfig
from ...drafters.head.eagle_layers import BareInputLayer, rope_of
from ...drafters.head.layer import HeadLayer
from .base import PublishedHead, read_shapes
from .fields import field, rope_settings


class Eagle1Head(PublishedHead):
    """An EAGLE-1/2 head: ``fc`` [h, 2h], ``layers.N``; ``out_weight`` [V, h]: the target's ``lm_head``."""

    kind = "eagle1"
    note = " (EAGLE-1/2)"

    def __init__(self, c: EagleConfig, embed: nn.Module | None, out_weight: torch.Tensor):
        super().__init__(c, embed)
        h = c.hidden_size
        self.fc = nn.Linear(2 * h, h, bias=c.fc_bias)
        self.layers = nn.ModuleList([BareInputLayer(c)] + [HeadLayer(c, qkv_bias=c.qkv_bias, **rope_of(c))
                                                            for _ in range(c.num_layers - 1)])
        self.register_buffer("out_weight", out_weight.detach().float(), persistent=False)  # [V, h]
        self.set_columns(torch.arange(c.vocab_size))

    def decoder_layers(self) -> list[HeadLayer]:
        return list(self.layers)

    def entry(self, features: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """fc(cat(embedding, feature)) [..., h]."""
        return self.fc(self.embedded(features, tokens))

    def target_features(self, hidden_states) -> torch.Tensor:
        """The target's last (normed) state."""
        return hidden_states[-1]

    def logit_input(self, fed: torch.Tensor) -> torch.Tensor:
        return fed

    def output_rows(self) -> torch.Tensor:
        return self.out_weight

    # -- the folder ---------------------------------------------------------------------------------

    @classmethod
    def weights_fit(cls, names: Callable[[], Collection[str]]) -> bool:
        """A plain architecture is a head's where its weights have ``fc.weight`` and no ``lm_head``."""
        found = names()
        return "fc.weight" in found and "lm_head.weight" not in found

    @classmethod
    def read_config(cls, raw: dict, names: Collection[str], target, path: Path) -> EagleConfig:
        shapes = read_shapes(raw, raw, names, target, path)
        return EagleConfig(
            **shapes, draft_vocab_size=shapes["vocab_size"], target_hidden_size=shapes["hidden_size"], taps=(-1,),
            norm_before_residual=field(raw, "norm_before_residual", path, default=False, kind=bool),
            fc_bias=raw.get("bias", True) is not False)

    @classmethod
    def from_target(cls, c: EagleConfig, target, d2t: torch.Tensor | None) -> Eagle1Head:
        """Reads the target's embedding and its ``lm_head`` rows (refused where it has none)."""
        lm_head = target.get_output_embeddings()
        if lm_head is None:
            raise ValueError("an EAGLE-1/2 head reads the target's lm_head, and this target has none")
        return cls(c, target.get_input_embeddings(), lm_head.weight.detach())

    def exported(self, dtype: torch.dtype) -> tuple[dict, dict[str, torch.Tensor]]:
        c = self.c
        config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": c.hidden_size,
                  "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim,
                  "intermediate_size": c.intermediate_size, "num_hidden_layers": c.num_layers,
                  "vocab_size": c.vocab_size, "rms_norm_eps": c.rms_eps, "rope_theta": c.rope_theta,
                  "hidden_act": "silu", "bias": c.fc_bias, "qkv_bias": c.qkv_bias,
                  "torch_dtype": str(dtype).removeprefix("torch."), **rope_settings(c)}
        return config, dict(self.state_dict())


__all__ = ["Eagle1Head"]
