"""An EAGLE-style draft: a one-layer head that reads the TARGET's features.

The target's last hidden state ``f_j`` (the input of its output head, the *feature* at position
``j``) already encodes everything the target knows about the next token. The head learns the
feature dynamics instead of language from scratch: its entry at position ``j`` reads

    x_j = fc([embed(t_j), f_{j-1}])                       # [H], f_{-1} = 0
    g_j = norm(layer(x_j | entries 0..j-1))               # one causal decoder layer, RoPE
    logits_j = g_j @ (W[kept] + D).T + b                  # the target's output rows, K kept tokens

and is trained so that ``g_j ≈ f_j`` and ``logits_j`` ≈ the target's next-token logits at ``j``.
While drafting, a tree node at depth d ≥ 1 has no target feature yet for its parent, so it reads
the head's own prediction ``g`` of its parent instead (EAGLE's feature autoregression).

:class:`FeatureHead` holds the weights (the embedding and output rows are the target's own,
shared, never saved; ``D`` is zero, or with ``HeadConfig.out_rank`` a trained correction of the
rows, full or low-rank, which is saved); :class:`FeatureHeadDrafter` is the per-call drafter with its own KV cache
(see :mod:`opttree.drafters.base`). The generation loop feeds it the target's features of every
committed position through :meth:`FeatureHeadDrafter.add_features` (it sets
``wants_hidden_states``). Cached entries always hold TRUE target features: tree nodes, fed with
predicted ones, are dropped at commit and the accepted tokens are fed again next step with the
target's features.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from ...hf.width import carried_width, text_config
from .base import DraftHead
from .drafter import FeatureHeadDrafter  # noqa: F401 (re-exported)
from .layer import KV, HeadLayer, RMSNorm, apply_rotary, attend, rotary  # noqa: F401 (re-exported)


@dataclass(frozen=True)
class HeadConfig:
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_eps: float = 1e-5
    rope_theta: float = 10000.0
    num_layers: int = 1  # decoder layers of the head
    # Which entries of the target's ``output_hidden_states`` the head reads (index into that
    # tuple: 0 = the embeddings, -1 = the last, normed, hidden state), concatenated in this order.
    # The last must be -1: it is the feature the head predicts (see FeatureHead.fuse).
    feature_layers: tuple[int, ...] = (-1,)
    # The output rows: None = the target's own rows, frozen (and not saved); 0 = the target's rows
    # plus a trained correction D [K, H] (saved); r > 0 = plus a rank-r correction A [K, r] @ B [r, H].
    out_rank: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "feature_layers", tuple(int(i) for i in self.feature_layers))
        if not self.feature_layers or self.feature_layers[-1] != -1:
            raise ValueError(f"feature_layers must end with -1 (the last hidden state): {self.feature_layers}")
        if self.num_layers < 1:
            raise ValueError(f"num_layers must be >= 1: {self.num_layers}")
        if self.out_rank is not None and self.out_rank < 0:
            raise ValueError(f"out_rank must be None, 0 (full rows) or a rank >= 1: {self.out_rank}")

    @property
    def feature_width(self) -> int:
        """Width of the features the target gives the head before fusion: len(feature_layers) * H."""
        return len(self.feature_layers) * self.hidden_size

    @classmethod
    def for_target(cls, config) -> "HeadConfig":
        """Shapes that match ``config`` (a target's HF config) where it names them."""
        config = config.get_text_config() if hasattr(config, "get_text_config") else config
        hidden = config.hidden_size
        heads = getattr(config, "num_attention_heads", None) or max(1, hidden // 64)
        rope = getattr(config, "rope_parameters", None) or {}
        return cls(
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=getattr(config, "head_dim", None) or hidden // heads,
            intermediate_size=getattr(config, "intermediate_size", None) or 4 * hidden,
            vocab_size=config.vocab_size,
            rms_eps=float(getattr(config, "rms_norm_eps", None) or 1e-5),
            rope_theta=float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))),
        )

    def to_dict(self) -> dict:
        return asdict(self)


class FeatureHead(DraftHead):
    """The head's weights. ``embed`` is the target's input embedding and ``out_weight`` [K, H]
    rows of its output embedding (for the K tokens in ``token_ids``): both frozen, not saved.
    With ``c.out_rank`` set, a trained correction of those rows is added (:meth:`output_rows`):
    ``out_delta`` [K, H] (rank 0) or ``out_delta_a`` [K, r] @ ``out_delta_b`` [r, H]; both start at
    zero product, so a head given one computes exactly what it did."""

    def __init__(self, c: HeadConfig, embed: nn.Module, out_weight: torch.Tensor, token_ids: torch.Tensor):
        super().__init__()
        self.c = c
        self.fc = nn.Linear(2 * c.hidden_size, c.hidden_size, bias=True)
        self.layer = HeadLayer(c)  # the first layer (its name predates num_layers: saved heads keep loading)
        self.more_layers = nn.ModuleList(HeadLayer(c) for _ in range(c.num_layers - 1))
        self.norm = RMSNorm(c.hidden_size, c.rms_eps)
        lower = len(c.feature_layers) - 1  # fused layers besides the last one
        if lower:
            self.fuse_norms = nn.ModuleList(RMSNorm(c.hidden_size, c.rms_eps) for _ in range(lower))
            self.fuse_proj = nn.Linear(lower * c.hidden_size, c.hidden_size, bias=False)
            nn.init.zeros_(self.fuse_proj.weight)  # starts as the last hidden state alone
        self.out_bias = nn.Parameter(torch.zeros(out_weight.shape[0]))
        kept, hidden = out_weight.shape
        if c.out_rank == 0:
            self.out_delta = nn.Parameter(torch.zeros(kept, hidden))  # [K, H]
        elif c.out_rank is not None:
            self.out_delta_a = nn.Parameter(torch.zeros(kept, c.out_rank))  # [K, r]: zero, so D starts at 0
            self.out_delta_b = nn.Parameter(torch.randn(c.out_rank, hidden) / hidden ** 0.5)  # [r, H]
        self.register_buffer("token_ids", token_ids.to(torch.long))  # [K]
        self.register_buffer("out_weight", out_weight.detach().float().clone(), persistent=False)  # [K, H]
        self.embed = [embed]  # a list: not a submodule, so never saved nor moved with the head
        self._merged: tuple[tuple, torch.Tensor] | None = None  # output_rows() cached outside autograd

    def forward(self, features: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, past: KV | None,
                mask: torch.Tensor, slots: torch.Tensor | None = None) -> tuple[torch.Tensor, KV]:
        """features [b, q, H] (f_{j-1}), tokens [b, q] (t_j), positions [b, q], past and mask as
        :meth:`DraftHead.forward`'s -> (predicted features g_j [b, q, H], the new entries' KV)."""
        x, news, kv_heads = self.entry(features, tokens), [], self.c.num_kv_heads
        for i, layer in enumerate(self.layers()):
            x, new = layer(x, positions, None if past is None else past.layer(i, kv_heads), mask, slots)
            news.append(new)
        return self.norm(x), KV.stack(news)

    def logit_input(self, fed: torch.Tensor) -> torch.Tensor:
        """The predicted feature g itself: the output rows read it as the target's rows read f."""
        return fed

    def shared_with_target(self) -> list:
        return [self.embed[0]]

    def entry(self, features: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """features [..., H] (f_{j-1}), tokens [...] (t_j) -> the first layer's input x_j [..., H]."""
        dtype = self.fc.weight.dtype  # the head may run in another dtype than the target (e.g. bf16)
        embedded = self.embed[0](tokens.to(self.embed[0].weight.device)).to(self.device, dtype)
        return self.fc(torch.cat([embedded, features.to(self.device, dtype)], dim=-1))

    def layers(self) -> list[HeadLayer]:
        """The head's decoder layers, first to last."""
        return [self.layer, *self.more_layers]

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """The target's features [..., len(feature_layers) * H] (its ``feature_layers`` hidden
        states, concatenated in that order) -> what the head reads [..., H].

        A residual form of EAGLE-3's fusion: the last hidden state plus a learnt projection of the
        RMS-normed lower layers (zero at initialisation, so a fused head starts as the plain one).
        Identity for a head that reads the last hidden state alone."""
        h = self.c.hidden_size
        if len(self.c.feature_layers) == 1:
            return features
        dtype = self.fuse_proj.weight.dtype
        features = features.to(self.device, dtype)
        lower = [norm(features[..., i * h:(i + 1) * h]) for i, norm in enumerate(self.fuse_norms)]
        return features[..., -h:] + self.fuse_proj(torch.cat(lower, dim=-1))

    def target_features(self, hidden_states: tuple[torch.Tensor, ...] | list[torch.Tensor]) -> torch.Tensor:
        """The target's ``output_hidden_states`` (each [b, T, H]) -> the head's input [b, T, H]:
        its ``feature_layers`` concatenated, then :meth:`fuse`d. For a plain head this is
        ``hidden_states[-1]`` itself."""
        h = self.c.hidden_size  # an inflated target's states are wider: the head reads the entries it carries
        if len(self.c.feature_layers) == 1:
            last = hidden_states[-1]
            return last if last.shape[-1] == h else last[..., :h]
        states = [hidden_states[i] for i in self.c.feature_layers]
        return self.fuse(torch.cat([s if s.shape[-1] == h else s[..., :h] for s in states], dim=-1))

    def delta_parameters(self) -> list[nn.Parameter]:
        """The parameters of the rows' trained correction: [], [D] or [A, B] (by ``c.out_rank``)."""
        if self.c.out_rank is None:
            return []
        return [self.out_delta] if self.c.out_rank == 0 else [self.out_delta_a, self.out_delta_b]

    def delta(self) -> torch.Tensor | None:
        """The trained correction of the output rows [K, H], or None (``c.out_rank`` is None)."""
        if self.c.out_rank is None:
            return None
        if self.c.out_rank == 0:
            return self.out_delta
        return self.out_delta_a @ self.out_delta_b

    def output_rows(self) -> torch.Tensor:
        """[K, H]: the rows the logits read, the target's plus the trained correction. Outside
        autograd (drafting) the sum is computed once and kept until a weight changes in place."""
        if self.c.out_rank is None:
            return self.out_weight
        if torch.is_grad_enabled():
            return self.out_weight + self.delta().to(self.out_weight.dtype)
        key = tuple((id(t), t._version, t.dtype, t.device) for t in [self.out_weight, *self.delta_parameters()])
        if self._merged is None or self._merged[0] != key:
            self._merged = (key, self.out_weight + self.delta().to(self.out_weight.dtype))
        return self._merged[1]

    @property
    def device(self) -> torch.device:
        return self.fc.weight.device

    def check_fits(self, target) -> None:
        """Refuse a target whose hidden size or vocabulary differs from the one the head was made for."""
        config = text_config(target.config)
        if (carried_width(config), config.vocab_size) != (self.c.hidden_size, self.c.vocab_size):
            raise ValueError(
                f"this feature head was made for a target with hidden size {self.c.hidden_size} and "
                f"vocabulary {self.c.vocab_size}, but the target has {carried_width(config)} and "
                f"{config.vocab_size}; load the head with opttree.load_draft(path, target) "
                "for the target it was trained on, or train one with `opttree distill --kind head`"
            )
