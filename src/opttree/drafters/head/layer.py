"""The parts of a feature head's decoder layer (:mod:`opttree.drafters.head.feature_head`): RMSNorm,
rotary positions, a KV cache of explicit tensors, one Llama-style layer and its attention."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(variance + self.eps)).to(x.dtype) * self.weight


@functools.lru_cache(maxsize=None)
def inverse_frequencies(frequencies: tuple[float, ...], device: torch.device) -> torch.Tensor:
    """A scaled RoPE's inverse frequencies as a float32 tensor on ``device``, made once per device."""
    return torch.tensor(frequencies, dtype=torch.float32, device=device)


def rotary(positions: torch.Tensor, head_dim: int, theta: float, frequencies: tuple[float, ...] = (),
           attention_scaling: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [b, q] long -> (cos, sin) [b, 1, q, head_dim] float32 (half-rotation layout).
    frequencies: a scaled RoPE's inverse frequencies [head_dim/2] (transformers' for the head's own
    config, :func:`opttree.hf.compat.scaled_rope`); () the default's, from ``theta``. cos and sin are
    multiplied by ``attention_scaling`` (yarn's), as transformers' rotary embedding multiplies them."""
    if frequencies and torch.compiler.is_compiling():  # a constant of the graph (dynamo skips lru_cache)
        inv = torch.tensor(frequencies, dtype=torch.float32, device=positions.device)
    elif frequencies:
        inv = inverse_frequencies(frequencies, positions.device)
    else:
        inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim)
    angles = positions[..., None].float() * inv  # [b, q, d/2]
    angles = torch.cat([angles, angles], dim=-1)[:, None]  # [b, 1, q, d]
    if attention_scaling != 1.0:
        return angles.cos() * attention_scaling, angles.sin() * attention_scaling
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [b, heads, q, d] rotated by position."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


@dataclass
class KV:
    keys: torch.Tensor  # [b, kv_heads, s, d]
    values: torch.Tensor  # [b, kv_heads, s, d]

    def __len__(self) -> int:
        return self.keys.shape[2]

    def first(self, n: int) -> "KV":
        """The first ``n`` entries (views)."""
        return KV(self.keys[:, :, :n], self.values[:, :, :n])

    def cat(self, other: "KV") -> "KV":
        return KV(torch.cat([self.keys, other.keys], 2), torch.cat([self.values, other.values], 2))

    def layer(self, i: int, kv_heads: int) -> "KV":
        """Layer ``i``'s entries of a multi-layer head, whose layers are stacked on the head axis
        ([b, layers * kv_heads, s, d]): the cache stays ONE KV whatever the depth of the head."""
        return KV(self.keys[:, i * kv_heads:(i + 1) * kv_heads], self.values[:, i * kv_heads:(i + 1) * kv_heads])

    @staticmethod
    def stack(layers: list["KV"]) -> "KV":
        """One KV [b, len(layers) * kv_heads, s, d] of per-layer entries."""
        if len(layers) == 1:
            return layers[0]
        return KV(torch.cat([k.keys for k in layers], 1), torch.cat([k.values for k in layers], 1))


class HeadLayer(nn.Module):
    """One pre-norm Llama-style decoder layer (parameter names as in HF Llama, so a Llama
    target's layer can initialise it) with an explicit KV cache and additive mask."""

    def __init__(self, c, attn_width: int | None = None, qkv_bias: bool = False,
                 rope_frequencies: tuple[float, ...] = (), rope_attention_scaling: float = 1.0):
        """c: a feature_head.HeadConfig or an EagleConfig (hidden_size, num_heads, num_kv_heads, head_dim,
        intermediate_size, rms_eps, rope_theta); attn_width: what q/k/v read (default hidden_size;
        EAGLE-3's layer reads 2h); qkv_bias: q/k/v with biases (Qwen2-shaped EAGLE heads);
        rope_frequencies, rope_attention_scaling: a scaled RoPE's (:func:`rotary`; an EagleConfig's)."""
        super().__init__()
        self.c = c
        self.rope_frequencies, self.rope_attention_scaling = tuple(rope_frequencies), float(rope_attention_scaling)
        width = attn_width or c.hidden_size
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_eps)
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(width, c.num_heads * c.head_dim, bias=qkv_bias)
        self.self_attn.k_proj = nn.Linear(width, c.num_kv_heads * c.head_dim, bias=qkv_bias)
        self.self_attn.v_proj = nn.Linear(width, c.num_kv_heads * c.head_dim, bias=qkv_bias)
        self.self_attn.o_proj = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=False)
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.mlp.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.mlp.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def attention_input(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's input x -> (the residual stream [b, q, H], what q/k/v read [b, q, attn_width]).
        Here: (x, input_layernorm(x)), a pre-norm Llama layer; EAGLE's layers override it."""
        return x, self.input_layernorm(x)

    def project_kv(self, h: torch.Tensor, cos, sin) -> KV:
        """Normed input h [b, q, attn_width] -> this layer's keys/values for it."""
        b, q, _ = h.shape
        c, a = self.c, self.self_attn
        k = a.k_proj(h).view(b, q, c.num_kv_heads, c.head_dim).transpose(1, 2)
        v = a.v_proj(h).view(b, q, c.num_kv_heads, c.head_dim).transpose(1, 2)
        return KV(apply_rotary(k, cos, sin), v)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, past: KV | None, mask: torch.Tensor,
                slots: torch.Tensor | None = None) -> tuple[torch.Tensor, KV]:
        """x [b, q, H]; positions [b, q]; mask [b, 1, q, n] additive over the n entries attended.
        Two caches: ``slots`` None: ``past`` holds the s entries before these (or None), the new ones
        follow them (n = s + q; training's); ``slots`` [q] long: ``past`` is a buffer of fixed size
        [b, kv_heads, S, d], the new entries written in place at ``slots`` before attending over its
        first n (the drafters' step, :mod:`opttree.drafters.head.graph`).
        Returns (output [b, q, H], the new entries' KV)."""
        residual, query, new = self._project(x, positions)
        if slots is None:
            kv = new if past is None else past.cat(new)
        else:
            past.keys.index_copy_(2, slots, new.keys)
            past.values.index_copy_(2, slots, new.values)
            kv = past.first(mask.shape[-1])
        return self._finish(residual, query, kv, mask), new

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [b, q] long -> this layer's (cos, sin) [b, 1, q, head_dim] (:func:`rotary`)."""
        return rotary(positions, self.c.head_dim, self.c.rope_theta, self.rope_frequencies, self.rope_attention_scaling)

    def _project(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, KV]:
        """x (the layer's input) -> (the residual stream [b, q, H], rotated queries [b, heads, q, d],
        the new entries' KV)."""
        c, a = self.c, self.self_attn
        residual, h = self.attention_input(x)
        b, q, _ = h.shape
        cos, sin = self.cos_sin(positions)
        query = apply_rotary(a.q_proj(h).view(b, q, c.num_heads, c.head_dim).transpose(1, 2), cos, sin)
        return residual, query, self.project_kv(h, cos, sin)

    def _finish(self, x: torch.Tensor, query: torch.Tensor, kv: KV, mask: torch.Tensor) -> torch.Tensor:
        """Attention over ``kv`` and the MLP: x [b, q, H], query [b, heads, q, d] -> [b, q, H]."""
        b, q, _ = x.shape
        c, a = self.c, self.self_attn
        attended = attend(query, kv, mask)  # [b, heads, q, d]
        x = x + a.o_proj(attended.transpose(1, 2).reshape(b, q, c.num_heads * c.head_dim))
        h = self.post_attention_layernorm(x)
        return x + self.mlp.down_proj(nn.functional.silu(self.mlp.gate_proj(h)) * self.mlp.up_proj(h))


def attend(query: torch.Tensor, kv: KV, mask: torch.Tensor) -> torch.Tensor:
    """query [b, heads, q, d], kv with kv_heads dividing heads, mask [b, 1, q, s] additive."""
    groups = query.shape[1] // kv.keys.shape[1]
    keys = kv.keys.repeat_interleave(groups, dim=1)
    values = kv.values.repeat_interleave(groups, dim=1)
    return nn.functional.scaled_dot_product_attention(query, keys, values, attn_mask=mask.to(query.dtype))
