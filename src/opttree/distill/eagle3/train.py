"""Train an EAGLE-3 head on cached features of the three taps (:func:`train_eagle3`) and write it as
an EAGLE-3 folder (:func:`save_eagle3`): ``config.json`` and ``model.safetensors`` exactly as
:func:`opttree.export_draft` writes them (``midlayer.*``, ``fc``, ``norm``, ``lm_head``, ``d2t``,
``t2d``, ``norm_before_residual`` explicit, no embedding), plus ``training.json`` (what was done).

Records are :mod:`opttree.distill.data.features`'s, their ``hidden`` holding the taps (``layers``); texts
are cut and batched by :mod:`opttree.distill.train.head_data`; the passes and loss are :mod:`.unroll`'s.
AdamW with betas (0.9, 0.95), no weight decay and gradients clipped to 0.5 (EAGLE-3's
eagle/traineagle3 ds_config.json and main.py), linear warm-up then cosine decay
(:func:`opttree.distill.train.lr_at`); with ``max_minutes`` the schedule is fitted to end in time
(:func:`opttree.distill.train.head_train.fitted_steps`, as the feature head's).

A run starts from a new head (:func:`.head.new_eagle3_head`) or goes on training an EAGLE-3 folder
(``init``: its draft vocabulary kept). With a ``checkpoint_dir`` it resumes where it stopped
(:mod:`opttree.distill.train.checkpoint`, the feature head's format) and ends as an uninterrupted run.
The folder written is the head at the end of the run (EAGLE-3 keeps its last weights too).
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

from ...drafters.head.eagle import default_taps
from ...hf.width import text_config
from ...loading.eagle import Eagle3Head
from ...loading.eagle_export import write_eagle_folder
from ..train.checkpoint import load_train_state, resume, rng_from_json, rng_to_json, save_train_state, snapshot
from ..train.head_data import chunks, make_batch, token_batches
from ..train.head_loss import kept_index
from ..train.head_train import fitted_steps, run_key
from ..train.shared import lr_at, split_records
from .head import new_eagle3_head
from .unroll import batch_loss, paired
from .vocab import draft_vocabulary

logger = logging.getLogger(__name__)
TRAINING_FILE = "training.json"
HEAD_FILES = ("config.json", "model.safetensors", TRAINING_FILE)  # the folder a run writes


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
    max_minutes: float | None = None  # the cosine schedule is fitted to end within this time
    eval_every: int = 50
    val_fraction: float = 0.05
    seed: int = 0
    save_dtype: str = "float16"
    answers_only: bool = False
    bf16: bool = False  # bf16 autocast for the passes' matmuls (float32 master weights)
    checkpoint_every: int = 25  # steps between checkpoints (with a checkpoint_dir; 0: at evaluations only)


@dataclass
class Eagle3Result:
    path: Path
    steps: int
    seconds: float
    train_tokens: int
    losses: list[float] = field(default_factory=list)  # the training loss of each step
    val_agreement: list[float] = field(default_factory=list)  # by pass (depth 1 first), at the end
    initial_agreement: list[float] = field(default_factory=list)  # by pass, before the first step


def taps_records(records: list[dict], taps: tuple[int, ...], max_len: int, answers_only: bool = False,
                 marker: list[int] = ()) -> list[dict]:
    """Records cut into pieces of at most ``max_len + 1`` positions (n + 1 positions make n entries),
    their features the taps, low to high."""
    return chunks(records, max_len + 1, marker, answers_only, layers=tuple(taps))


def passes_loss(head, p, cfg: Eagle3TrainConfig, full_to_kept: torch.Tensor):
    """:func:`.unroll.batch_loss` under bf16 autocast where ``cfg.bf16``."""
    with torch.autocast(device_type=head.device.type, dtype=torch.bfloat16, enabled=cfg.bf16):
        return batch_loss(head, p, cfg.unroll, full_to_kept, cfg.decay, cfg.answers_only)


def new_optimizer(head, lr: float) -> torch.optim.Optimizer:
    """EAGLE-3's AdamW: betas (0.9, 0.95), no weight decay."""
    return torch.optim.AdamW(head.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)


def train_step(head, optimizer: torch.optim.Optimizer, p, cfg: Eagle3TrainConfig, full_to_kept: torch.Tensor,
               lr: float) -> torch.Tensor:
    """One optimizer step at learning rate ``lr``, gradients clipped to 0.5; the loss (detached)."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    loss, _ = passes_loss(head, p, cfg, full_to_kept)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(head.parameters(), 0.5)
    optimizer.step()
    return loss.detach()


@torch.no_grad()
def agreement(head, pieces: list[dict], cfg: Eagle3TrainConfig, full_to_kept: torch.Tensor) -> list[float]:
    """Per pass, how often the head's argmax is the target's greedy token (over the scored entries)."""
    was, hits = head.training, [[] for _ in range(cfg.unroll)]
    head.eval()
    for i in range(0, len(pieces), 8):
        p = paired(make_batch(pieces[i:i + 8], head.device))
        for d, hit in enumerate(passes_loss(head, p, cfg, full_to_kept)[1]):
            hits[d].append(hit)
    head.train(was)
    return [float(torch.cat(h).float().mean()) if sum(len(x) for x in h) else 0.0 for h in hits]


def start_head(target, train_records: list[dict], cfg: Eagle3TrainConfig, init: str | Path | None):
    """A new head over the training texts' most frequent tokens, the EAGLE-3 head in ``init``
    (refused, naming the fix, where its layout, taps or draft vocabulary differ from the run's), or
    the feature head in ``init`` mapped into the layout (:mod:`.from_feature_head`, fitted on 64
    training texts)."""
    if init is None:
        vocab = target.get_input_embeddings().weight.shape[0]
        return new_eagle3_head(target, draft_vocabulary(train_records, vocab, cfg.draft_vocab_size), cfg.seed)
    from ...loading.eagle_folder import is_eagle_head, load_eagle
    from ...loading.head_file import is_feature_head_folder

    fix = "set the stage's init to an EAGLE-3 folder, a feature head's, or to \"\" for a new head"
    if is_feature_head_folder(Path(init)):  # mapped where the layouts agree (.from_feature_head)
        from ...loading.load import load_draft
        from .from_feature_head import eagle3_from_feature_head

        vocab = target.get_input_embeddings().weight.shape[0]
        used = draft_vocabulary(train_records, vocab, cfg.draft_vocab_size)
        texts = [r["input_ids"] for r in random.Random(cfg.seed).sample(train_records, min(64, len(train_records)))]
        return eagle3_from_feature_head(load_draft(init, target), target, used, texts, cfg.seed).train()
    if not is_eagle_head(Path(init)):
        raise ValueError(f"{init} holds no EAGLE head nor feature head (an eagle3 run goes on training EAGLE-3 "
                         f"heads): {fix}")
    head = load_eagle(init, target)
    taps = default_taps(text_config(target.config).num_hidden_layers)
    if not isinstance(head, Eagle3Head):
        raise ValueError(f"{init} holds an {head.kind} head: an eagle3 run goes on training EAGLE-3 heads only; {fix}")
    if tuple(head.c.taps) != taps:
        raise ValueError(f"{init} reads the target's layers {list(head.c.taps)}, the features hold the default taps "
                         f"{list(taps)}: set the stage's init to a head over those taps, or to \"\" for a new head")
    if head.c.draft_vocab_size != cfg.draft_vocab_size:
        raise ValueError(f"{init} keeps {head.c.draft_vocab_size} draft tokens, the stage asks for "
                         f"{cfg.draft_vocab_size}: set draft_vocab_size = {head.c.draft_vocab_size}")
    return head.float().train()


def train_eagle3(target, records: list[dict], out: str | Path, cfg: Eagle3TrainConfig, marker: list[int] = (),
                 init: str | Path | None = None, val_records: list[dict] | None = None,
                 checkpoint_dir: str | Path | None = None) -> Eagle3Result:
    """Train a head on ``records`` (features of the default taps) and save it to ``out``.
    ``val_records``: the validation texts (every record then trains; default ``val_fraction`` of
    ``records``); ``init`` and ``checkpoint_dir``: the module doc."""
    target.requires_grad_(False)  # the target's embedding is read, frozen, never saved
    if val_records is None:
        train_records, val_records = split_records(records, cfg.val_fraction, cfg.seed)
    else:
        train_records = records
    head = start_head(target, train_records, cfg, init)
    full_to_kept = kept_index(head)
    pieces = taps_records(train_records, head.c.taps, cfg.max_len, cfg.answers_only, marker)
    val = taps_records(val_records, head.c.taps, cfg.max_len, cfg.answers_only, marker)
    rng = random.Random(cfg.seed)
    per_epoch = len(token_batches(pieces, cfg.batch_tokens, random.Random(cfg.seed)))
    planned = max(1, math.ceil(per_epoch * cfg.epochs))
    if cfg.max_steps:
        planned = min(planned, cfg.max_steps)
    optimizer = new_optimizer(head, cfg.lr)
    key = run_key(cfg, pieces, val, init)
    state = load_train_state(checkpoint_dir, key) if checkpoint_dir is not None else None
    if state is None:
        step, total, offset, epoch_rng, elapsed = 0, planned, 0, None, 0.0
        extra = {"initial": agreement(head, val, cfg, full_to_kept) if val else [], "losses": [], "tokens": 0,
                 "finished": False}
    else:
        step, total, offset, epoch_rng, elapsed, extra = resume(state, head, optimizer, rng, head.device)
        logger.info("eagle3: resumed from %s at step %d/%d", checkpoint_dir, step, total)
    start = time.time() - elapsed

    def checkpoint(finished: bool = False) -> None:
        if checkpoint_dir is not None:
            extra["finished"] = finished
            save_train_state(snapshot(key, step, total, head, optimizer, epoch_rng, offset, time.time() - start, extra,
                                      rng, head.device), checkpoint_dir)

    while step < total and not extra["finished"]:
        if epoch_rng is None:  # a new epoch: its batch order is drawn from this state
            epoch_rng, offset = rng_to_json(rng.getstate()), 0
        else:
            rng.setstate(rng_from_json(epoch_rng))
        for batch_ids in token_batches(pieces, cfg.batch_tokens, rng)[offset:]:
            if step >= total or (cfg.max_minutes and time.time() - start > cfg.max_minutes * 60):
                total = step
                break
            p = paired(make_batch([pieces[i] for i in batch_ids], head.device))
            loss = train_step(head, optimizer, p, cfg, full_to_kept, lr_at(step, total, cfg))
            step, offset = step + 1, offset + 1
            extra["losses"].append(float(loss))
            extra["tokens"] += int(p.valid.sum())
            evaluated = bool(cfg.eval_every) and step % cfg.eval_every == 0
            if evaluated and val:
                logger.info("eagle3 step %d/%d loss %.3f val agreement by depth %s", step, total,
                            extra["losses"][-1], " ".join(f"{a:.3f}" for a in agreement(head, val, cfg, full_to_kept)))
            if evaluated and cfg.max_minutes and step > cfg.warmup_steps:  # re-fit as start-up costs amortise
                total = fitted_steps(step, time.time() - start, planned, cfg.max_minutes, total)
            if evaluated or (cfg.checkpoint_every and step % cfg.checkpoint_every == 0):
                checkpoint()
        else:
            epoch_rng = None  # the epoch ran to its end
    seconds = time.time() - start
    if not extra["finished"]:
        checkpoint(finished=True)
    result = Eagle3Result(Path(out), step, seconds, extra["tokens"], extra["losses"],
                          agreement(head, val, cfg, full_to_kept) if val else [], extra["initial"])
    save_eagle3(head, out, cfg.save_dtype, {"config": asdict(cfg), "init": str(init) if init else None, "steps": step,
                                            "seconds": result.seconds, "train_tokens": result.train_tokens,
                                            "losses": result.losses, "val_agreement_by_depth": result.val_agreement,
                                            "initial_agreement_by_depth": result.initial_agreement})
    return result


def step_probe(target, cfg: Eagle3TrainConfig, tokens: int, bf16: bool):
    """One optimizer step of a new head shaped as ``cfg`` on a random batch of ``tokens`` positions
    (rows of ``cfg.max_len``), as :func:`train_eagle3` runs it: what ``--precision auto`` times."""
    from ..train.head_data import FeatureBatch

    vocab = target.get_input_embeddings().weight.shape[0]
    head = new_eagle3_head(target, torch.arange(min(cfg.draft_vocab_size, vocab)), cfg.seed)
    rows, length = max(1, tokens // cfg.max_len), min(tokens, cfg.max_len) + 1  # n + 1 positions make n entries
    g, k = torch.Generator().manual_seed(0), 8
    batch = FeatureBatch(  # [B, L] tokens, [B, L, 3H] taps, [B, L, k] soft labels
        tokens=torch.randint(0, vocab, (rows, length), generator=g),
        features=torch.randn(rows, length, head.c.feature_width, generator=g),
        valid=torch.ones(rows, length, dtype=torch.bool),
        topk_ids=torch.randint(0, len(head.token_ids), (rows, length, k), generator=g),
        topk_logits=torch.randn(rows, length, k, generator=g).sort(-1, descending=True).values,
        answer=torch.ones(rows, length, dtype=torch.bool)).to(head.device)
    p, step_cfg, full_to_kept = paired(batch), Eagle3TrainConfig(**{**asdict(cfg), "bf16": bf16}), kept_index(head)
    optimizer = new_optimizer(head, 1e-6)
    return lambda: train_step(head, optimizer, p, step_cfg, full_to_kept, 1e-6).item()


def save_eagle3(head, out: str | Path, dtype: str = "float16", training: dict | None = None) -> Path:
    """The head (cast to ``dtype``) written as export_draft's EAGLE-3 folder, and ``training.json``."""
    out = Path(out)
    write_eagle_folder(head, out, layout=Eagle3Head.kind, dtype=dtype)
    if training is not None:
        (out / TRAINING_FILE).write_text(json.dumps(training, indent=1) + "\n")
    return out


__all__ = ["Eagle3Result", "Eagle3TrainConfig", "HEAD_FILES", "TRAINING_FILE", "agreement", "passes_loss",
           "new_optimizer", "save_eagle3", "start_head", "step_probe", "taps_records", "train_eagle3", "train_step"]
