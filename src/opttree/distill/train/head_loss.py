"""A feature head's training passes and their loss (:mod:`.head_train` runs them).

Training-time test (as EAGLE-3): the head is unrolled ``unroll`` times over each text so that it
also learns from its OWN predicted features, which is what it reads for tree nodes deeper than
one (:func:`unrolled`, :func:`unroll_mask`: exactly the tree drafting mask).

Loss of one pass (:func:`pass_loss`) at the positions that have a root:
- ``soft_weight`` × CE to the target's top-k distribution renormalised over the kept tokens, plus
  the rest × CE to its argmax (:func:`opttree.distill.train.shared.soft_hard_loss`);
- ``topk_weight`` × HASS's top-K term (:func:`topk_loss`);
- ``reg_weight`` × smooth-L1 between the predicted feature and ``f_j`` (EAGLE-1's feature loss;
  EAGLE-3 drops it).

Noise on the target's features of pass 0 (:func:`noised`): ``"rms"``, uniform in ±noise × their
RMS (this project's default), or ``"eagle"``, EAGLE's own: uniform (U - 0.5) × noise × 512 / L
in absolute units, L the text's length (EAGLE's ``AddUniformNoise``, std 0.2 there).
"""

from __future__ import annotations

import torch
from torch import nn

from ...drafters.head.feature_head import FeatureHead
from .head_data import FeatureBatch
from .shared import soft_hard_loss

NOISE_KINDS = ("rms", "eagle")


def unroll_mask(length: int, depth: int, valid: torch.Tensor) -> torch.Tensor:
    """Additive mask [B, 1, L, (depth + 1) L] of pass ``depth`` over passes 0..depth; ``valid``
    [B, L] hides padding keys of pass 0. Pass ``d`` plays a depth-``d`` tree node at ``j``: its
    root is ``r = j - d``; it attends to pass-0 entries ``≤ r`` and to one entry of each pass
    ``e`` (``1 ≤ e ≤ d``), the one at ``r + e`` (its own ancestors, itself last)."""
    j = torch.arange(length, device=valid.device)[:, None]
    i = torch.arange(length, device=valid.device)[None, :]
    blocks = [(i <= j - depth)[None] & valid[:, None, :]]  # pass 0: up to the root
    blocks += [(i == j - depth + e)[None].expand(valid.shape[0], -1, -1) for e in range(1, depth + 1)]
    visible = torch.cat(blocks, dim=-1)  # [B, L, (depth + 1) L]
    visible[..., length * depth:] |= torch.eye(length, dtype=torch.bool, device=valid.device)  # itself (rows j < depth)
    return torch.zeros(visible.shape, device=valid.device).masked_fill_(~visible, float("-inf"))[:, None]


def shifted(features: torch.Tensor) -> torch.Tensor:
    """[B, L, H] -> what entry j reads: features[j - 1], zeros at j = 0."""
    return torch.cat([torch.zeros_like(features[:, :1]), features[:, :-1]], dim=1)


def noised(features: torch.Tensor, valid: torch.Tensor, noise: float, kind: str = "rms") -> torch.Tensor:
    """``features`` [B, L, H] plus uniform noise (see the module doc); ``valid`` [B, L] gives each
    text's length for ``"eagle"``. Unchanged when ``noise`` is 0."""
    if kind not in NOISE_KINDS:
        raise ValueError(f"noise_kind must be one of {NOISE_KINDS}, not {kind!r}")
    if noise <= 0:
        return features
    if kind == "rms":
        scale = features.pow(2).mean().sqrt() * noise
        return features + (torch.rand_like(features) * 2 - 1) * scale
    lengths = valid.sum(dim=1).clamp(min=1).to(features.dtype)  # [B]
    return features + (torch.rand_like(features) - 0.5) * (noise * 512 / lengths)[:, None, None]


def unrolled(head: FeatureHead, batch: FeatureBatch, unroll: int, noise: float,
             noise_kind: str = "rms") -> list[torch.Tensor]:
    """The head's predicted features of each pass: ``unroll`` tensors [B, L, H]. Pass 0 reads
    the target's features, fused (:meth:`FeatureHead.fuse`), plus noise (:func:`noised`)."""
    b, length = batch.tokens.shape
    positions = torch.arange(length, device=batch.tokens.device).expand(b, -1)
    features = noised(head.fuse(batch.features), batch.valid, noise, noise_kind)  # [B, L, H]
    predicted, past, inputs = [], None, shifted(features)
    for depth in range(unroll):
        g, new = head(inputs, batch.tokens, positions, past, unroll_mask(length, depth, batch.valid))
        predicted.append(g)
        past = new if past is None else past.cat(new)
        inputs = shifted(g)
    return predicted


def topk_loss(logits: torch.Tensor, topk_ids: torch.Tensor, topk_logits: torch.Tensor,
              full_to_kept: torch.Tensor, k: int) -> torch.Tensor:
    """HASS's top-K distillation term, scalar: -Σ over the target's K best tokens of
    p(token) log q(token). ``p`` is the target's distribution over its stored top-k (its full
    normaliser is not stored; the stored top-16 carry nearly all of it), NOT renormalised over the
    kept tokens or over the K (as HASS: the weight a token gets is its probability); ``q`` is the
    head's softmax over its kept tokens; a token outside them adds nothing.

    ``logits`` [N, K'] over the kept tokens; ``topk_ids``/``topk_logits`` [N, k'] (k' ≥ k, best
    first); ``full_to_kept`` [V] long: kept index of each id or -1."""
    log_q = torch.log_softmax(logits.float(), dim=-1)  # [N, K']
    p = torch.softmax(topk_logits.float(), dim=-1)[:, :k]  # [N, k]
    kept = full_to_kept[topk_ids[:, :k]]  # [N, k]
    p = p.masked_fill(kept < 0, 0.0)
    return -(p * log_q.gather(-1, kept.clamp(min=0))).sum(-1).mean()


def pass_loss(head: FeatureHead, g: torch.Tensor, batch: FeatureBatch, depth: int,
              full_to_kept: torch.Tensor, reg_weight: float, answers_only: bool = False,
              soft_weight: float = 0.5, topk_weight: float = 0.0,
              topk_k: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, hits [N] bool) of one pass over the positions that have a root (j >= depth),
    answer positions only if ``answers_only``."""
    where = (batch.answer if answers_only else batch.valid).clone()
    where[:, :depth] = False
    pred = g[where]  # [N, H]
    logits = head.reduced_logits(pred)  # [N, K]
    ids, top = batch.topk_ids[where], batch.topk_logits[where]  # [N, k]
    loss = soft_hard_loss(logits, ids, top, ids[:, 0], full_to_kept, soft_weight=soft_weight)
    if topk_weight:
        loss = loss + topk_weight * topk_loss(logits, ids, top, full_to_kept, topk_k)
    if reg_weight:
        true = batch.features[..., -g.shape[-1]:][where]  # [N, H]: f_j is the last layer
        loss = loss + reg_weight * nn.functional.smooth_l1_loss(pred, true)
    hits = head.token_ids[logits.argmax(-1)] == ids[:, 0]
    return loss, hits


def kept_index(head: FeatureHead) -> torch.Tensor:
    """[V] long: the kept index of each vocabulary id, or -1."""
    full_to_kept = torch.full((head.c.vocab_size,), -1, dtype=torch.long, device=head.device)
    full_to_kept[head.token_ids] = torch.arange(len(head.token_ids), device=head.device)
    return full_to_kept
