"""What the published EAGLE heads share as :class:`~.base.DraftHead`s: :class:`EagleConfig` (their
shapes) and :class:`EagleHead` (the forward every layout runs). Each published layout is one class
of its own, beside its folder format, in :mod:`opttree.loading.eagle` (``Eagle3Head``,
``SpeculatorsHead``, ``Eagle1Head``), looked up by config.json's ``architectures``.

Notation: h the head's hidden size, H the target's, V the target's vocabulary, Vd the draft's.
Entry e pairs the embedding of token e + 1 with the feature of position e and sits at rotary
position e (``first_entry = 1``: no entry for the first token). A layout says what the entry is
(:meth:`EagleHead.entry`), which layers run (:meth:`EagleHead.decoder_layers`), what the target's
feature is (:meth:`EagleHead.target_features`), what the logits read (:meth:`EagleHead.logit_input`)
and over which rows (:meth:`EagleHead.output_rows`). Rules and sources: DESIGN.md, "EAGLE heads".
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import asdict, dataclass

import torch
from torch import nn

from ...hf.width import text_config
from .layer import KV, HeadLayer
from .base import DraftHead


def default_taps(layers: int) -> tuple[int, int, int]:
    """EAGLE-3's default taps for a target of ``layers`` layers, as ``output_hidden_states`` indices
    (the states entering layers 2, L//2 and L-3): SafeAILab/EAGLE cb7e084
    eagle/model/modeling_llama_kv.py (``idx==2 or idx==L//2 or idx==L-3``, before the layer runs),
    vLLM's ``get_eagle3_default_aux_hidden_state_layers`` (2, L//2, L-3)."""
    return 2, layers // 2, layers - 3


@dataclass(frozen=True)
class EagleConfig:
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

    @property
    def feature_width(self) -> int:
        """Width of the target's states the head reads before fc: len(taps) * H."""
        return len(self.taps) * self.target_hidden_size

    def to_dict(self) -> dict:
        return asdict(self)


class EagleHead(DraftHead):
    """A published EAGLE head: the forward all layouts share, parameter names as the published
    folders'. ``embed``: the target's input embedding (unless ``c.own_embedding``: then the head's
    own ``embed_tokens``). A layout's subclass registers its modules after this ``__init__`` and
    then its output columns (:meth:`set_columns`)."""

    first_entry = 1

    def __init__(self, c: EagleConfig, embed: nn.Module | None):
        super().__init__()
        self.c = c
        self.embed = [] if c.own_embedding else [embed]  # a list: the target's, never saved nor moved
        if c.own_embedding:
            self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)

    def set_columns(self, token_ids: torch.Tensor) -> None:
        """The target id of each output column [K], and the columns' (zero) bias [K]."""
        self.register_buffer("token_ids", token_ids, persistent=False)  # [K]
        self.register_buffer("out_bias", torch.zeros(len(token_ids)), persistent=False)  # [K]

    def embedding(self) -> nn.Module:
        return self.embed_tokens if self.c.own_embedding else self.embed[0]

    def embedded(self, features: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """features [..., h] (fed), tokens [...] -> cat(embedding, feature) [..., 2h]."""
        embed, dtype = self.embedding(), self.dtype
        embedded = embed(tokens.to(embed.weight.device)).to(self.device, dtype)
        return torch.cat([embedded, features.to(self.device, dtype)], dim=-1)

    @abstractmethod
    def decoder_layers(self) -> list[HeadLayer]:
        """The layers an entry runs through, in order."""

    @abstractmethod
    def entry(self, features: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """features [..., h] (fed), tokens [...] -> the first layer's input."""

    def forward(self, features, tokens, positions, past, mask, slots=None):
        x, news, kv_heads = self.entry(features, tokens), [], self.c.num_kv_heads
        for i, layer in enumerate(self.decoder_layers()):
            x, new = layer(x, positions, None if past is None else past.layer(i, kv_heads), mask, slots)
            news.append(new)
        return x, KV.stack(news)

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


__all__ = ["EagleConfig", "EagleHead", "default_taps"]
