"""The decoder layers of the EAGLE layouts, as :class:`~opttree.drafters.head.layer.HeadLayer`s whose
attention input differs (the rest, RoPE, the KV cache, attention and MLP, is the Llama layer's).

Rules and sources (DESIGN.md, "EAGLE heads"):

- EAGLE-3's one layer reads ``x = cat(embedding, hidden)`` [.., 2h], embedding first; q/k/v read
  ``cat(input_layernorm(embedding), hidden_norm(hidden))`` (width 2h); the residual added to the
  attention's output is ``hidden`` itself, or ``hidden_norm(hidden)`` where ``norm_before_residual``
  (SafeAILab/EAGLE cb7e084 eagle/model/cnets.py ``LlamaDecoderLayeremb.forward``; vLLM 00bd149
  vllm/model_executor/models/llama_eagle3.py ``_norm_before_residual``; speculators c05b95b
  src/speculators/models/eagle3/model_definitions.py ``Eagle3FirstLayerMixin``).
- EAGLE-1/2's first layer has no input norm: q/k/v read the fused input as it is (SafeAILab/EAGLE
  cb7e084 eagle/model/cnets1.py ``LlamaDecoderLayer``: ``input_layernorm`` only where index != 0).
"""

from __future__ import annotations

import torch

from .layer import HeadLayer, RMSNorm


def rope_of(c) -> dict:
    """An eagle.EagleConfig's scaled RoPE as :class:`HeadLayer`'s keywords (empty frequencies: the default)."""
    return {"rope_frequencies": c.rope_frequencies, "rope_attention_scaling": c.rope_attention_scaling}


class Eagle3Layer(HeadLayer):
    """EAGLE-3's ``midlayer``: q/k/v over 2h, a ``hidden_norm``, the residual by ``norm_before_residual``."""

    def __init__(self, c):  # c: an eagle.EagleConfig
        super().__init__(c, attn_width=2 * c.hidden_size, qkv_bias=c.qkv_bias, **rope_of(c))
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_eps)

    def attention_input(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [b, q, 2h] = cat(embedding, hidden) -> (residual [b, q, h], q/k/v's input [b, q, 2h])."""
        h = self.c.hidden_size
        embedded, hidden = x[..., :h], x[..., h:]
        normed = self.hidden_norm(hidden)
        residual = normed if self.c.norm_before_residual else hidden
        return residual, torch.cat([self.input_layernorm(embedded), normed], dim=-1)


class BareInputLayer(HeadLayer):
    """EAGLE-1/2's first layer: a Llama layer without ``input_layernorm``."""

    def __init__(self, c):  # c: an eagle.EagleConfig
        super().__init__(c, qkv_bias=c.qkv_bias, **rope_of(c))
        del self.input_layernorm

    def attention_input(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, x


__all__ = ["BareInputLayer", "Eagle3Layer", "rope_of"]
