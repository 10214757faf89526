"""An EAGLE-3 head's training passes and loss: the training-time test, fed as the runtime drafter
(:mod:`opttree.drafters.head.drafter`) feeds it.

Pairing (:func:`paired`): entry e reads the target's taps at position e (through ``fc``) with the
embedding of token e + 1, sits at rotary position e, and learns the target's distribution at
position e + 1 (of token e + 2); no entry for the first token (SafeAILab/EAGLE cb7e084
eagle/traineagle3/cnets.py ``dataprepare``/``forward``: ids and target shifted left by one).

Unrolling (:func:`unrolled`): pass d plays a depth-d tree node whose root is entry e - d; it reads
the PRE-norm output ``h2`` of pass d - 1 at entry e - 1 (no ``fc``), sees pass 0 up to its root and
its own ancestors (:func:`opttree.distill.train.head_loss.unroll_mask`, the drafter's tree mask) and sits
at position e (= the root's + d, the drafter's ``root_position + depth``). EAGLE trains 7 passes.

Loss (:func:`pass_loss`), EAGLE-3's: cross-entropy to the target's distribution restricted to the
draft vocabulary and renormalised (here its stored top-k, :func:`opttree.distill.train.shared.soft_hard_loss`
with soft weight 1), only where the target's greedy token is a draft token (``position_mask``
there); pass d weighs 0.8**d (eagle/traineagle3/main.py ``ploss_weight``). No noise, no feature
regression (EAGLE-3 has neither).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..train.head_data import FeatureBatch
from ..train.head_loss import shifted, unroll_mask
from ..train.shared import soft_hard_loss


@dataclass
class Paired:
    """One batch as the head's entries: ``features`` [B, n, 3H] (the taps at e), ``tokens`` [B, n]
    (token e + 1), ``valid`` [B, n], ``topk_ids`` / ``topk_logits`` [B, n, k] (the target's top-k at
    e + 1), ``answer`` [B, n]. n = the batch's length - 1."""

    features: torch.Tensor
    tokens: torch.Tensor
    valid: torch.Tensor
    topk_ids: torch.Tensor
    topk_logits: torch.Tensor
    answer: torch.Tensor


def paired(batch: FeatureBatch) -> Paired:
    """The taps at t with token t + 1 and the label at t + 1 (see the module doc)."""
    return Paired(features=batch.features[:, :-1], tokens=batch.tokens[:, 1:], valid=batch.valid[:, 1:],
                  topk_ids=batch.topk_ids[:, 1:], topk_logits=batch.topk_logits[:, 1:], answer=batch.answer[:, 1:])


def unrolled(head, p: Paired, unroll: int) -> list[torch.Tensor]:
    """The pre-norm outputs ``h2`` of passes 0..unroll-1, each [B, n, h]."""
    b, n = p.tokens.shape
    positions = torch.arange(n, device=p.tokens.device).expand(b, -1)
    fed = head.fc(p.features.to(head.dtype))  # [B, n, h]
    out, past = [], None
    for depth in range(unroll):
        g, new = head(fed, p.tokens, positions, past, unroll_mask(n, depth, p.valid))
        out.append(g)
        past = new if past is None else past.cat(new)
        fed = shifted(g)  # entry e of the next pass reads entry e - 1's h2
    return out


def scored(p: Paired, depth: int, full_to_kept: torch.Tensor, answers_only: bool = False) -> torch.Tensor:
    """[B, n] bool: the entries pass ``depth`` is scored at: a root exists (e >= depth), the label's
    greedy token is a draft token, and (``answers_only``) it is an answer token."""
    where = (p.answer if answers_only else p.valid).clone()
    where[:, :depth] = False
    return where & (full_to_kept[p.topk_ids[..., 0]] >= 0)


def pass_loss(head, g: torch.Tensor, p: Paired, depth: int, full_to_kept: torch.Tensor,
              answers_only: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, hits [N] bool: the head's argmax is the target's greedy token) of one pass."""
    where = scored(p, depth, full_to_kept, answers_only)
    ids, top = p.topk_ids[where], p.topk_logits[where]  # [N, k]
    if len(ids) == 0:
        return g.sum() * 0, torch.zeros(0, dtype=torch.bool, device=g.device)
    logits = head.reduced_logits(g[where])  # [N, Vd]
    loss = soft_hard_loss(logits, ids, top, ids[:, 0], full_to_kept, soft_weight=1.0)
    return loss, head.token_ids[logits.argmax(-1)] == ids[:, 0]


def batch_loss(head, p: Paired, unroll: int, full_to_kept: torch.Tensor, decay: float = 0.8,
               answers_only: bool = False) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(Σ_d decay**d × pass d's loss, the hits of each pass)."""
    total, hits = 0.0, []
    for depth, g in enumerate(unrolled(head, p, unroll)):
        loss, hit = pass_loss(head, g, p, depth, full_to_kept, answers_only)
        total = total + decay ** depth * loss
        hits.append(hit)
    return total, hits


__all__ = ["Paired", "batch_loss", "pass_loss", "paired", "scored", "unrolled"]
