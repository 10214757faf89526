"""Train a draft to predict the target's next-token distribution (soft-label distillation).

Loss per answer position: the average of
- soft cross-entropy against the target's top-k distribution (renormalised over the kept
  tokens), i.e. KL(target‖draft) up to a constant, and
- hard cross-entropy against the target's greedy token (when the head keeps it).

Validation agreement = how often the draft's argmax equals the target's greedy token,
teacher-forced on held-out answers; it is logged at every evaluation and the best draft is
saved. Only the draft's layers, final norm and head bias are trained; the embedding and the
head's rows stay the target's.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from ...loading.draft_model import DraftMeta, save_draft
from .model import init_draft
from .shared import kept_tokens, lr_at, soft_hard_loss, split_records

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainConfig:
    """Training knobs. ``max_minutes`` stops early (the schedule still assumes ``epochs``)."""

    init_layers: tuple[int, ...] = (0, 1)
    num_kept_tokens: int = 8192
    epochs: float = 2.0
    batch_size: int = 8
    max_len: int = 512
    lr: float = 1e-3
    fast_lr_mult: float = 10.0  # final norm and head bias: scale parameters, learn faster
    warmup_steps: int = 10
    weight_decay: float = 0.0
    temperature: float = 1.0
    max_minutes: float | None = None
    eval_every: int = 100
    val_fraction: float = 0.04
    seed: int = 0
    save_dtype: str = "float16"


@dataclass
class TrainResult:
    """Where the best draft went and how it did on the held-out answers."""

    path: Path
    val_agreement: float
    initial_agreement: float
    val_coverage: float
    steps: int
    seconds: float
    train_tokens: int


@dataclass
class Batch:
    """Right-padded training batch.

    ``input_ids``/``attention_mask`` [B, T]; ``rows`` [N] and ``cols`` [N]: (sequence, position)
    of every supervised position (the position whose output predicts an answer token);
    ``topk_ids`` [N, k] long and ``topk_logits`` [N, k] float: the target's soft labels there;
    ``greedy`` [N] long: the target's greedy token (= the next answer token).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    rows: torch.Tensor
    cols: torch.Tensor
    topk_ids: torch.Tensor
    topk_logits: torch.Tensor
    greedy: torch.Tensor


def make_batch(records: list[dict], max_len: int, pad_id: int) -> Batch:
    """Collate answers; sequences longer than ``max_len`` lose prompt tokens from the left."""
    seqs, offsets = [], []
    for r in records:
        ids = r["input_ids"]
        cut = max(0, len(ids) - max_len)
        cut = min(cut, r["prompt_len"] - 1)  # never cut into the answer's first predictor
        seqs.append(ids[cut:cut + max_len])
        offsets.append(r["prompt_len"] - 1 - cut)
    width = max(len(s) for s in seqs)
    input_ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    rows, cols, top_ids, top_logits, greedy = [], [], [], [], []
    for i, (s, off, r) in enumerate(zip(seqs, offsets, records)):
        input_ids[i, :len(s)] = s
        mask[i, :len(s)] = 1
        n = min(len(r["topk_ids"]), len(s) - off)  # answer positions still inside the window
        rows.append(torch.full((n,), i, dtype=torch.long))
        cols.append(torch.arange(off, off + n))
        top_ids.append(r["topk_ids"][:n].long())
        top_logits.append(r["topk_logits"][:n].float())
        greedy.append(r["topk_ids"][:n, 0].long())
    return Batch(input_ids, mask, torch.cat(rows), torch.cat(cols), torch.cat(top_ids),
                 torch.cat(top_logits), torch.cat(greedy))


def reduced_logits(draft, batch: Batch) -> torch.Tensor:
    """Draft logits over the kept tokens at the supervised positions [N, K]."""
    hidden = draft.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
    picked = hidden[batch.rows, batch.cols]  # [N, H]
    return draft.lm_head.reduced_logits(picked)  # [N, K]


def distill_loss(logits: torch.Tensor, batch: Batch, full_to_kept: torch.Tensor,
                 temperature: float) -> torch.Tensor:
    """:func:`soft_hard_loss` at the batch's supervised positions."""
    return soft_hard_loss(logits, batch.topk_ids, batch.topk_logits, batch.greedy, full_to_kept, temperature)


@torch.no_grad()
def agreement(draft, records: list[dict], max_len: int, pad_id: int, batch_size: int) -> tuple[float, float]:
    """(top-1 agreement with the target's greedy token, share of greedy tokens kept)."""
    draft.eval()
    token_ids = draft.lm_head.token_ids
    kept = torch.zeros(draft.config.vocab_size, dtype=torch.bool)
    kept[token_ids] = True
    hits = covered = total = 0
    for s in range(0, len(records), batch_size):
        batch = make_batch(records[s:s + batch_size], max_len, pad_id)
        guess = token_ids[reduced_logits(draft, batch).argmax(-1)]  # [N]
        hits += int((guess == batch.greedy).sum())
        covered += int(kept[batch.greedy].sum())
        total += len(batch.greedy)
    draft.train()
    return hits / max(total, 1), covered / max(total, 1)


def _progress(total: int):
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc="train", unit="step")


def train_draft(target, records: list[dict], out_dir: str | Path, cfg: TrainConfig,
                pad_id: int, always_keep: list[int] = ()) -> TrainResult:
    """Build a draft from ``target`` and distil ``records`` into it; save the best to ``out_dir``.

    ``records`` come from :func:`opttree.distill.data.answers.generate_round`. A checkpoint of the
    latest state goes to ``out_dir/checkpoint`` at every evaluation.
    """
    out_dir = Path(out_dir)
    torch.manual_seed(cfg.seed)
    train, val = split_records(records, cfg.val_fraction, cfg.seed)
    vocab = target.config.vocab_size
    token_ids = kept_tokens(train, vocab, cfg.num_kept_tokens, list(always_keep))
    full_to_kept = torch.full((vocab,), -1, dtype=torch.long)
    full_to_kept[token_ids] = torch.arange(len(token_ids))
    draft, meta = init_draft(target, list(cfg.init_layers), token_ids)
    draft.train()
    params = [p for p in draft.parameters() if p.requires_grad]
    fast = {id(draft.model.norm.weight), id(draft.lm_head.bias)}
    optim = torch.optim.AdamW([
        {"params": [p for p in params if id(p) not in fast], "lr_mult": 1.0},
        {"params": [p for p in params if id(p) in fast], "lr_mult": cfg.fast_lr_mult},
    ], lr=cfg.lr, weight_decay=cfg.weight_decay)
    steps_per_epoch = math.ceil(len(train) / cfg.batch_size)
    total = max(1, math.ceil(cfg.epochs * steps_per_epoch))
    train_tokens = sum(len(r["topk_ids"]) for r in train)
    logger.info("train: %d answers (%d tokens), val: %d answers, %d kept tokens, %d steps, "
                "%.1fM trainable params", len(train), train_tokens, len(val), len(token_ids),
                total, sum(p.numel() for p in params) / 1e6)
    val_agree, coverage = agreement(draft, val, cfg.max_len, pad_id, cfg.batch_size)
    initial = val_agree
    logger.info("step 0: val agreement %.3f (kept-token coverage %.3f)", val_agree, coverage)
    best = -1.0
    save_dtype = getattr(torch, cfg.save_dtype) if cfg.save_dtype else None
    rng = random.Random(cfg.seed)
    start, step, running = time.time(), 0, 0.0
    bar = _progress(total)

    def evaluate() -> None:
        nonlocal best, val_agree
        val_agree, _ = agreement(draft, val, cfg.max_len, pad_id, cfg.batch_size)
        logger.info("step %d/%d (%.1f min): train loss %.3f, val agreement %.3f", step, total,
                    (time.time() - start) / 60, running, val_agree)
        save_draft(draft, meta, out_dir / "checkpoint")
        torch.save({"step": step, "optimizer": optim.state_dict()}, out_dir / "checkpoint" / "optimizer.pt")
        if val_agree > best:
            best = val_agree
            save_draft(draft, meta, out_dir, dtype=save_dtype)
            _write_log(out_dir, cfg, step, val_agree, coverage, time.time() - start, train_tokens)

    while step < total:
        order = list(range(len(train)))
        rng.shuffle(order)
        for s in range(0, len(order), cfg.batch_size):
            if step >= total or (cfg.max_minutes and time.time() - start > 60 * cfg.max_minutes):
                total = step  # stop: out of steps or time
                break
            batch = make_batch([train[i] for i in order[s:s + cfg.batch_size]], cfg.max_len, pad_id)
            for group in optim.param_groups:
                group["lr"] = lr_at(step, total, cfg) * group["lr_mult"]
            loss = distill_loss(reduced_logits(draft, batch), batch, full_to_kept, cfg.temperature)
            optim.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(params, 1.0)
            optim.step()
            step += 1
            running = loss.item() if step == 1 else 0.95 * running + 0.05 * loss.item()
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{running:.3f}", val=f"{val_agree:.3f}")
            if step % cfg.eval_every == 0:
                evaluate()
    if bar is not None:
        bar.close()
    if step % cfg.eval_every != 0 or best < 0:
        evaluate()
    return TrainResult(out_dir, best, initial, coverage, step, time.time() - start, train_tokens)


def _write_log(out_dir: Path, cfg: TrainConfig, step: int, val_agree: float, coverage: float,
               seconds: float, train_tokens: int) -> None:
    """``training.json`` next to the best weights: the recipe numbers that produced them."""
    record = {"train_config": asdict(cfg), "step": step, "val_agreement": val_agree,
              "val_kept_coverage": coverage, "train_seconds": round(seconds, 1),
              "train_answer_tokens": train_tokens}
    (out_dir / "training.json").write_text(json.dumps(record, indent=2) + "\n")
