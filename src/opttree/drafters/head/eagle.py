"""The published EAGLE heads as :class:`~.base.DraftHead`s: EAGLE-3 (its ``speculators`` form too) and
EAGLE-1/2. Their folders are read by :mod:`opttree.loading.eagle_folder`.

Notation: h the head's hidden size, H the target's, V the target's vocabulary, Vd the draft's.
Entry e pairs the embedding of token e + 1 with the feature of position e and sits at rotary
position e (``first_entry = 1``: no entry for the first token). Rules and sources, DESIGN.md
"EAGLE heads":

- EAGLE-3: the target's feature of a position is ``fc(cat(hs[a], hs[b], hs[c]))`` [h] from its
  ``output_hidden_states`` ``taps`` (the states entering layers a, b, c, before the final norm);
  the layer (:class:`~.eagle_layers.Eagle3Layer`) returns the pre-norm ``h2``, which is what a tree
  node passes to its children (no fc there); logits = ``lm_head(norm(h2))`` over Vd columns, column
  j being target token ``j + d2t[j]``. The embedding is the target's, or the folder's own.
- EAGLE-1/2: the feature is the target's last hidden state after its final norm; the entry is
  ``fc(cat(embedding, feature))`` (with a bias unless the config says ``"bias": false``), then the
  layers (the first without an input norm), no final norm; logits = the target's ``lm_head`` of
  the output over the whole vocabulary, and the output is fed back.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from ...hf.width import text_config
from .layer import KV, HeadLayer, RMSNorm
from .base import DraftHead
from .eagle_layers import BareInputLayer, Eagle3Layer, rope_of

EAGLE3 = "eagle3"
EAGLE1 = "eagle1"


def default_taps(layers: int) -> tuple[int, int, int]:
    """EAGLE-3's default taps for a target of ``layers`` layers, as ``output_hidden_states`` indices
    (the states entering layers 2, L//2 and L-3): SafeAILab/EAGLE cb7e084
    eagle/model/modeling_llama_kv.py (``idx==2 or idx==L//2 or idx==L-3``, before the layer runs),
    vLLM's ``get_eagle3_default_aux_hidden_state_layers`` (2, L//2, L-3)."""
    return 2, layers // 2, layers - 3


@dataclass(frozen=True)
class EagleConfig:
    layout: str  # EAGLE3 or EAGLE1
    hidden_size: int  # h
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int  # V, the target's
    draft_vocab_size: int  # Vd (EAGLE-1: V)
    target_hidden_size: int  # H
    target_layers: int  # L: the target's decoder layers the taps were resolved for
    taps: tuple[int, ...]  # output_hidden_states indices, low to high; EAGLE-1: (-1,), the last (normed)
    rms_eps: float = 1e-6
    rope_theta: float = 10000.0
    norm_before_residual: bool = False
    fc_bias: bool = False
    qkv_bias: bool = False
    num_layers: int = 1
    own_embedding: bool = False  # the folder holds embed_tokens (speculators), else the target's is read
    # scaled RoPE (linear, llama3, yarn): transformers' inverse frequencies [head_dim/2] and cos/sin scaling
    # for the head's own config (hf.compat.scaled_rope); () the default RoPE's, from rope_theta
    rope_frequencies: tuple[float, ...] = ()
    rope_attention_scaling: float = 1.0
    rope_settings: str = ""  # the head's config.json RoPE fields as read (a JSON object), written back by export
    stored_dtype: str = ""  # the folder's floating dtype ("float16"...), what export writes; "" mixed, or no folder

    def __post_init__(self):
        object.__setattr__(self, "taps", tuple(int(i) for i in self.taps))
        object.__setattr__(self, "rope_frequencies", tuple(float(f) for f in self.rope_frequencies))
        if self.layout not in (EAGLE3, EAGLE1):
            raise ValueError(f"layout must be {EAGLE3!r} or {EAGLE1!r}: {self.layout!r}")

    @property
    def feature_width(self) -> int:
        """Width of the target's states the head reads before fc: len(taps) * H."""
        return len(self.taps) * self.target_hidden_size

    def to_dict(self) -> dict:
        return asdict(self)


class EagleHead(DraftHead):
    """An EAGLE-3 or EAGLE-1/2 head (``c.layout``), parameter names as the published folders'
    (``midlayer.*`` for EAGLE-3, ``layers.N.*`` for EAGLE-1/2). ``embed``: the target's input
    embedding (unless ``c.own_embedding``); ``out_weight`` [V, h]: EAGLE-1's output rows, the
    target's ``lm_head`` (None for EAGLE-3); ``d2t`` [Vd] long: target id = draft id + d2t."""

    first_entry = 1

    def __init__(self, c: EagleConfig, embed: nn.Module | None, out_weight: torch.Tensor | None,
                 d2t: torch.Tensor | None = None):
        super().__init__()
        self.c = c
        h = c.hidden_size
        self.embed = [] if c.own_embedding else [embed]  # a list: the target's, never saved nor moved
        if c.own_embedding:
            self.embed_tokens = nn.Embedding(c.vocab_size, h)
        if c.layout == EAGLE3:
            self.fc = nn.Linear(c.feature_width, h, bias=False)
            self.midlayer = Eagle3Layer(c)
            self.norm = RMSNorm(h, c.rms_eps)
            self.lm_head = nn.Linear(h, c.draft_vocab_size, bias=False)
            self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long) if d2t is None else d2t.long())
            token_ids = torch.arange(c.draft_vocab_size) + self.d2t  # [Vd] target ids
        else:
            self.fc = nn.Linear(2 * h, h, bias=c.fc_bias)
            self.layers = nn.ModuleList([BareInputLayer(c)] + [HeadLayer(c, qkv_bias=c.qkv_bias, **rope_of(c))
                                                                for _ in range(c.num_layers - 1)])
            self.register_buffer("out_weight", out_weight.detach().float(), persistent=False)  # [V, h]
            token_ids = torch.arange(c.vocab_size)
        self.register_buffer("token_ids", token_ids, persistent=False)  # [K]
        self.register_buffer("out_bias", torch.zeros(len(token_ids)), persistent=False)  # [K]

    def embedding(self) -> nn.Module:
        return self.embed_tokens if self.c.own_embedding else self.embed[0]

    def decoder_layers(self) -> list[HeadLayer]:
        return [self.midlayer] if self.c.layout == EAGLE3 else list(self.layers)

    def entry(self, features: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """features [..., h] (fed), tokens [...] -> the first layer's input: EAGLE-3 cat(embedding,
        feature) [..., 2h]; EAGLE-1 fc of it [..., h]."""
        embed, dtype = self.embedding(), self.dtype
        embedded = embed(tokens.to(embed.weight.device)).to(self.device, dtype)
        x = torch.cat([embedded, features.to(self.device, dtype)], dim=-1)
        return x if self.c.layout == EAGLE3 else self.fc(x)

    def forward(self, features, tokens, positions, past, mask, slots=None):
        x, news, kv_heads = self.entry(features, tokens), [], self.c.num_kv_heads
        for i, layer in enumerate(self.decoder_layers()):
            x, new = layer(x, positions, None if past is None else past.layer(i, kv_heads), mask, slots)
            news.append(new)
        return x, KV.stack(news)

    def target_features(self, hidden_states) -> torch.Tensor:
        """EAGLE-3: fc of the taps concatenated low to high [b, T, h]; EAGLE-1: the last (normed) state."""
        if self.c.layout == EAGLE1:
            return hidden_states[-1]
        states = torch.cat([hidden_states[i] for i in self.c.taps], dim=-1)  # [b, T, 3H]
        return self.fc(states.to(self.device, self.dtype))

    def logit_input(self, fed: torch.Tensor) -> torch.Tensor:
        return self.norm(fed) if self.c.layout == EAGLE3 else fed

    def output_rows(self) -> torch.Tensor:
        return self.lm_head.weight if self.c.layout == EAGLE3 else self.out_weight

    def shared_with_target(self) -> list:
        return list(self.embed)

    @property
    def device(self) -> torch.device:
        return self.fc.weight.device

    def check_fits(self, target) -> None:
        """The target's hidden size, vocabulary and layer count must be the ones the head was loaded for."""
        config = text_config(target.config)
        c = self.c
        found = (config.hidden_size, config.vocab_size, config.num_hidden_layers)
        if found != (c.target_hidden_size, c.vocab_size, c.target_layers):
            raise ValueError(
                f"this EAGLE head was loaded for a target with hidden size {c.target_hidden_size}, vocabulary "
                f"{c.vocab_size} and {c.target_layers} layers, but the target has {found[0]}, {found[1]} and "
                f"{found[2]}; load it with opttree.load_draft(path, target) for the target it drafts for")


__all__ = ["EAGLE1", "EAGLE3", "EagleConfig", "EagleHead", "default_taps"]
