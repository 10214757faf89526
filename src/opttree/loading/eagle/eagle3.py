"""EAGLE-3 (:class:`Eagle3Head`): ``architectures`` ``LlamaForCausalLMEagle3`` or
``Eagle3LlamaForCausalLM``; keys ``midlayer.*`` (EAGLE's own and SGLang's) or ``layers.0.*``
(ModelOpt, speculators, vLLM); ``norm_before_residual`` false unless the config says true.

Forward (DESIGN.md, "EAGLE heads"): the target's feature of a position is ``fc(cat(hs[a], hs[b],
hs[c]))`` [h] from its ``output_hidden_states`` ``taps`` (the states entering layers a, b, c, before
the final norm; :func:`~opttree.loading.layer_ids.tap_ids`); the entry is ``cat(embedding, feature)``
[2h]; the layer (:class:`~opttree.drafters.head.eagle_layers.Eagle3Layer`) returns the pre-norm
``h2``, which is what a tree node passes to its children (no fc there); logits = ``lm_head(norm(h2))``
over Vd columns, column j being target token ``j + d2t[j]``. The embedding is the target's, or the
folder's own.

Export: ``config.json`` (``LlamaForCausalLMEagle3``, the head's own shapes, ``draft_vocab_size``,
``norm_before_residual`` always written, ``target_hidden_size`` where H != h, layer ids only where
the taps differ from the default (:func:`~opttree.loading.layer_ids.written_ids`), the target's layer
count under ``opttree``; a scaled RoPE's fields as they were read) and weights under ``midlayer.*``
(SGLang's loader knows only those; vLLM renames them), ``fc``, ``norm``, ``lm_head``, ``d2t`` and
``t2d`` (and ``embed_tokens`` where the head has its own).
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

import torch
from torch import nn

from ...drafters.head.eagle import EagleConfig
from ...drafters.head.eagle_layers import Eagle3Layer
from ...drafters.head.layer import HeadLayer, RMSNorm
from ..layer_ids import RECORD, RECORD_LAYERS, tap_ids, written_ids
from .base import PublishedHead, read_shapes
from .fields import CONFIG_FILE, field, rope_settings

LAYER_PREFIX = "layers.0."  # ModelOpt's, speculators' and vLLM's name of the one layer


class Eagle3Head(PublishedHead):
    """An EAGLE-3 head: ``fc`` [h, len(taps) H], ``midlayer``, ``norm``, ``lm_head`` [Vd, h], ``d2t``
    [Vd] long (target id = draft id + d2t)."""

    kind = "eagle3"
    norm_before_residual = False  # config.json's default for it

    def __init__(self, c: EagleConfig, embed: nn.Module | None, d2t: torch.Tensor | None = None):
        super().__init__(c, embed)
        h = c.hidden_size
        self.fc = nn.Linear(c.feature_width, h, bias=False)
        self.midlayer = Eagle3Layer(c)
        self.norm = RMSNorm(h, c.rms_eps)
        self.lm_head = nn.Linear(h, c.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long) if d2t is None else d2t.long())
        self.set_columns(torch.arange(c.draft_vocab_size) + self.d2t)  # [Vd] target ids

    def decoder_layers(self) -> list[HeadLayer]:
        return [self.midlayer]

    def entry(self, features: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """cat(embedding, feature) [..., 2h]: the layer norms the two apart."""
        return self.embedded(features, tokens)

    def target_features(self, hidden_states) -> torch.Tensor:
        """fc of the taps concatenated low to high [b, T, h]."""
        states = torch.cat([hidden_states[i] for i in self.c.taps], dim=-1)  # [b, T, 3H]
        return self.fc(states.to(self.device, self.dtype))

    def logit_input(self, fed: torch.Tensor) -> torch.Tensor:
        return self.norm(fed)

    def output_rows(self) -> torch.Tensor:
        return self.lm_head.weight

    # -- the folder ---------------------------------------------------------------------------------

    @classmethod
    def layer_config(cls, raw: dict, path: Path) -> dict:
        """The part of config.json holding the layer's shapes: all of it."""
        return raw

    @classmethod
    def ids_view(cls, raw: dict, layer: dict) -> dict:
        """The config as vLLM reads its layer ids (:func:`~opttree.loading.layer_ids.tap_ids`): config.json."""
        return raw

    @classmethod
    def read_config(cls, raw: dict, names: Collection[str], target, path: Path) -> EagleConfig:
        layer = cls.layer_config(raw, path)
        shapes = read_shapes(raw, layer, names, target, path)
        if shapes["num_layers"] != 1:
            raise ValueError(f"{path / CONFIG_FILE}: an EAGLE-3 head of {shapes['num_layers']} layers is not "
                             "supported (one layer)")
        return EagleConfig(
            **shapes,
            draft_vocab_size=field(raw, "draft_vocab_size", path, default=shapes["vocab_size"]),
            target_hidden_size=field(raw, "target_hidden_size", path, default=shapes["hidden_size"]),
            taps=tap_ids(cls.ids_view(raw, layer), shapes["target_layers"], path / CONFIG_FILE),
            norm_before_residual=field(raw, "norm_before_residual", path, default=cls.norm_before_residual, kind=bool))

    @classmethod
    def key_map(cls, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``layers.0.`` -> ``midlayer.``; ``t2d`` dropped."""
        return {"midlayer." + key[len(LAYER_PREFIX):] if key.startswith(LAYER_PREFIX) else key: value
                for key, value in super().key_map(state).items()}

    def exported(self, dtype: torch.dtype) -> tuple[dict, dict[str, torch.Tensor]]:
        """The config (module doc) and the weights plus ``t2d`` [V] bool (the kept target ids)."""
        c = self.c
        config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": c.hidden_size,
                  "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim,
                  "intermediate_size": c.intermediate_size, "num_hidden_layers": 1, "vocab_size": c.vocab_size,
                  "draft_vocab_size": c.draft_vocab_size, "rms_norm_eps": c.rms_eps, "rope_theta": c.rope_theta,
                  "hidden_act": "silu", "attention_bias": c.qkv_bias, "tie_word_embeddings": False,
                  "norm_before_residual": c.norm_before_residual,
                  "torch_dtype": str(dtype).removeprefix("torch.")}
        config.update(rope_settings(c))
        if c.target_hidden_size != c.hidden_size:
            config["target_hidden_size"] = c.target_hidden_size
        config.update(written_ids(c.taps, c.target_layers))
        config[RECORD] = {RECORD_LAYERS: c.target_layers}  # the engines ignore it; the loader checks it
        state = dict(self.state_dict())
        t2d = torch.zeros(c.vocab_size, dtype=torch.bool)
        t2d[self.token_ids.cpu()] = True
        state["t2d"] = t2d
        return config, state


__all__ = ["Eagle3Head"]
