"""What every trainer shares: the held-out split of whole texts (:func:`split_records`), the kept
vocabulary ranked by the target's greedy and soft-label counts (:func:`ranked_tokens`,
:func:`kept_tokens`), the soft + hard cross-entropy to the target's top-k (:func:`soft_hard_loss`)
and the learning-rate schedule (:func:`lr_at`). The independent draft (:mod:`.draft`) and the
feature head (:mod:`.head_train`, :mod:`.head_loss`) train with them; :mod:`.coverage` ranks as they do.
"""

from __future__ import annotations

import math
import random

import torch


def split_records(records: list[dict], val_fraction: float, seed: int) -> tuple[list, list]:
    """Deterministic train/validation split of whole answers."""
    order = list(range(len(records)))
    random.Random(seed).shuffle(order)
    n_val = max(1, round(len(records) * val_fraction)) if len(records) > 1 else 0
    val = [records[i] for i in order[:n_val]]
    train = [records[i] for i in order[n_val:]]
    return train, val


def ranked_tokens(records: list[dict], vocab_size: int, always: list[int]) -> torch.Tensor:
    """Every id [V], most useful first: ``always`` (e.g. EOS), then by how often the target's
    greedy token is that id, then by soft-label count, then by id (a BPE vocabulary's low ids are
    its most frequent merges)."""
    greedy = torch.zeros(vocab_size, dtype=torch.float64)
    soft = torch.zeros(vocab_size, dtype=torch.float64)
    for r in records:
        ids = r["topk_ids"].long().cpu()  # [N, k] (records may lie on a GPU: .resident)
        greedy += torch.bincount(ids[:, 0], minlength=vocab_size).double()
        soft += torch.bincount(ids.flatten(), minlength=vocab_size).double()
    score = greedy * 1e6 + soft  # greedy counts first, soft counts break ties
    score[torch.tensor(always, dtype=torch.long)] = float("inf")
    return torch.sort(score, descending=True, stable=True).indices


def kept_tokens(records: list[dict], vocab_size: int, k: int, always: list[int]) -> torch.Tensor:
    """The ``k`` ids the head keeps [k], sorted ascending: the first ``k`` of :func:`ranked_tokens`."""
    return ranked_tokens(records, vocab_size, always)[:min(k, vocab_size)].sort().values


def soft_hard_loss(logits: torch.Tensor, topk_ids: torch.Tensor, topk_logits: torch.Tensor,
                   greedy: torch.Tensor, full_to_kept: torch.Tensor, temperature: float = 1.0,
                   soft_weight: float = 0.5) -> torch.Tensor:
    """``soft_weight`` × soft CE + (1 - ``soft_weight``) × hard CE, scalar. The soft CE is to the
    target's top-k distribution renormalised over the kept tokens (= KL(target‖draft) plus the
    target's entropy: lowest where the draft's distribution equals it); the hard CE is to the
    greedy token.

    ``logits`` [N, K] over the kept tokens; ``topk_ids``/``topk_logits`` [N, k] the target's
    soft labels; ``greedy`` [N] its greedy token; ``full_to_kept`` [V] long: kept index of each
    vocabulary id or -1.
    """
    log_q = torch.log_softmax(logits.float() / temperature, dim=-1)  # [N, K]
    kept = full_to_kept[topk_ids]  # [N, k]
    target = topk_logits.float() / temperature
    target = target.masked_fill(kept < 0, float("-inf"))
    p = torch.softmax(target, dim=-1).nan_to_num(0.0)  # [N, k]; all-dropped rows → 0
    soft = -(p * log_q.gather(-1, kept.clamp(min=0))).sum(-1).mean()
    hard_idx = full_to_kept[greedy]  # [N]
    valid = hard_idx >= 0
    hard = -log_q[valid].gather(-1, hard_idx[valid, None]).mean() if valid.any() else log_q.sum() * 0
    return soft_weight * soft + (1 - soft_weight) * hard


def lr_at(step: int, total: int, cfg) -> float:
    """Linear warm-up then cosine decay to 10 % of ``cfg.lr`` (any config with lr and warmup_steps)."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps))
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
