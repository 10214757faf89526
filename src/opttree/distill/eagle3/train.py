"""Train an EAGLE-3 head on cached features of the three taps (:func:`train_eagle3`) and write it as
an EAGLE-3 folder (:func:`save_eagle3`): ``config.json`` and ``model.safetensors`` exactly as
:func:`opttree.export_draft` writes them (``midlayer.*``, ``fc``, ``norm``, ``lm_head``, ``d2t``,
``t2d``, ``norm_before_residual`` explicit, no embedding), plus ``training.json`` (what was done).

Records are :mod:`opttree.distill.data.features`'s, their ``hidden`` holding the taps (``layers``); texts
are cut and batched by :mod:`opttree.distill.train.head_data`; the passes and loss are :mod:`.unroll`'s.
AdamW with betas (0.9, 0.95), no weight decay and gradients clipped to 0.5 (EAGLE-3's
eagle/traineagle3 ds_config.json and main.py), linear warm-up then cosine decay
(:func:`opttree.distill.train.lr_at`).
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

from ...loading.eagle_export import export_draft
from ..train.head_data import chunks, make_batch, token_batches
from ..train.head_loss import kept_index
from ..train.shared import lr_at, split_records
from .head import new_eagle3_head
from .unroll import batch_loss, paired
from .vocab import draft_vocabulary

logger = logging.getLogger(__name__)
TRAINING_FILE = "training.json"


@dataclass(frozen=True)
class Eagle3TrainConfig:
    draft_vocab_size: int = 32000  # Vd (EAGLE-3's Llama-3 heads keep 32k)
    unroll: int = 7  # training-time test passes (EAGLE-3: 7)
    decay: float = 0.8  # pass d weighs decay**d (EAGLE-3)
    epochs: float = 2.0
    batch_tokens: int = 2048
    max_len: int = 512
    lr: float = 5e-4
    warmup_steps: int = 20
    max_steps: int | None = None  # stop after this many optimizer steps
    max_minutes: float | None = None
    eval_every: int = 50
    val_fraction: float = 0.05
    seed: int = 0
    save_dtype: str = "float16"
    answers_only: bool = False


@dataclass
class Eagle3Result:
    path: Path
    steps: int
    seconds: float
    train_tokens: int
    losses: list[float] = field(default_factory=list)  # the training loss of each step
    val_agreement: list[float] = field(default_factory=list)  # by pass (depth 1 first), at the end


def taps_records(records: list[dict], taps: tuple[int, ...], max_len: int, answers_only: bool = False,
                 marker: list[int] = ()) -> list[dict]:
    """Records cut into pieces of at most ``max_len + 1`` positions (n + 1 positions make n entries),
    their features the taps, low to high."""
    return chunks(records, max_len + 1, marker, answers_only, layers=tuple(taps))


@torch.no_grad()
def agreement(head, pieces: list[dict], cfg: Eagle3TrainConfig, full_to_kept: torch.Tensor) -> list[float]:
    """Per pass, how often the head's argmax is the target's greedy token (over the scored entries)."""
    was, hits = head.training, [[] for _ in range(cfg.unroll)]
    head.eval()
    for i in range(0, len(pieces), 8):
        p = paired(make_batch(pieces[i:i + 8], head.device))
        for d, hit in enumerate(batch_loss(head, p, cfg.unroll, full_to_kept, cfg.decay, cfg.answers_only)[1]):
            hits[d].append(hit)
    head.train(was)
    return [float(torch.cat(h).float().mean()) if sum(len(x) for x in h) else 0.0 for h in hits]


def train_eagle3(target, records: list[dict], out: str | Path, cfg: Eagle3TrainConfig,
                 marker: list[int] = ()) -> Eagle3Result:
    """Train a new head on ``records`` (features of the default taps) and save it to ``out``."""
    target.requires_grad_(False)  # the target's embedding is read, frozen, never saved
    train_records, val_records = split_records(records, cfg.val_fraction, cfg.seed)
    vocab = target.get_input_embeddings().weight.shape[0]
    head = new_eagle3_head(target, draft_vocabulary(train_records, vocab, cfg.draft_vocab_size), cfg.seed)
    full_to_kept = kept_index(head)
    pieces = taps_records(train_records, head.c.taps, cfg.max_len, cfg.answers_only, marker)
    val = taps_records(val_records, head.c.taps, cfg.max_len, cfg.answers_only, marker)
    rng = random.Random(cfg.seed)
    per_epoch = len(token_batches(pieces, cfg.batch_tokens, random.Random(cfg.seed)))
    total = max(1, math.ceil(per_epoch * cfg.epochs))
    if cfg.max_steps:
        total = min(total, cfg.max_steps)
    optimizer = torch.optim.AdamW(head.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    result, start, step = Eagle3Result(Path(out), 0, 0.0, 0), time.time(), 0
    while step < total:
        for batch_ids in token_batches(pieces, cfg.batch_tokens, rng):
            if step >= total or (cfg.max_minutes and time.time() - start > cfg.max_minutes * 60):
                total = step
                break
            p = paired(make_batch([pieces[i] for i in batch_ids], head.device))
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, total, cfg)
            loss, _ = batch_loss(head, p, cfg.unroll, full_to_kept, cfg.decay, cfg.answers_only)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 0.5)
            optimizer.step()
            step += 1
            result.losses.append(float(loss.detach()))
            result.train_tokens += int(p.valid.sum())
            if cfg.eval_every and step % cfg.eval_every == 0 and val:
                logger.info("eagle3 step %d/%d loss %.3f val agreement by depth %s", step, total, float(loss.detach()),
                            " ".join(f"{a:.3f}" for a in agreement(head, val, cfg, full_to_kept)))
    result.steps, result.seconds = step, time.time() - start
    result.val_agreement = agreement(head, val, cfg, full_to_kept) if val else []
    save_eagle3(head, out, cfg.save_dtype, {"config": asdict(cfg), "steps": step, "seconds": result.seconds,
                                            "train_tokens": result.train_tokens, "losses": result.losses,
                                            "val_agreement_by_depth": result.val_agreement})
    return result


def save_eagle3(head, out: str | Path, dtype: str = "float16", training: dict | None = None) -> Path:
    """The head (cast to ``dtype``) written as export_draft's EAGLE-3 folder, and ``training.json``."""
    out = Path(out)
    export_draft(head.to(getattr(torch, dtype)), out, layout="eagle3")
    head.float()
    if training is not None:
        (out / TRAINING_FILE).write_text(json.dumps(training, indent=1) + "\n")
    return out


__all__ = ["Eagle3Result", "Eagle3TrainConfig", "TRAINING_FILE", "agreement", "save_eagle3", "taps_records",
           "train_eagle3"]
