"""Train a :class:`~opttree.drafters.head.feature_head.FeatureHead` on the target's features.

Data: records from :mod:`opttree.distill.data.features` (tokens, the target's features ``f`` and its
top-k next-token logits at every position).

The passes and their loss are :mod:`.head_loss`'s: training-time test (the head unrolled
``unroll`` times, reading its own predicted features as a tree node does), and at every pass,
weighted ``decay**d``, soft + hard cross-entropy to the target's top-k (``soft_weight``), HASS's
top-K term (``topk_weight``) and the feature regression (``reg_weight``). The optimizer trains
every weight of the head; a trained correction of the output rows (``out_rank``) learns at
``out_lr_scale`` × the learning rate.

Validation agreement per depth = how often the head's argmax at depth ``d`` equals the target's
greedy token there (depth 1 is the root's children: the first drafted token).

Answer positions: with an ``answer_marker`` (the token ids the chat template puts before an
answer, :func:`~opttree.distill.data.features.answer_marker`), only the positions that predict answer
tokens are scored in validation, and, with ``HeadTrainConfig.answers_only``, in the loss. The
prompt still serves as context. Without it, every position counts (the system prompt and the
user's text then inflate the validation number: they are not what the head drafts).

With a ``checkpoint_dir``, a run resumes where it stopped (:mod:`.checkpoint`) and ends exactly as
an uninterrupted run would; :func:`train_step` is also what :mod:`.recipes.precision` times.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from ...drafters.head.feature_head import FeatureHead
from .head_data import FeatureBatch, chunks, make_batch, pieces, token_batches
from .checkpoint import load_train_state, resume, rng_from_json, rng_to_json, save_train_state, snapshot
from ...loading.head_file import HeadMeta, save_head
from .head import continued_head, grown, new_head, widened, with_trained_rows
from .head_loss import kept_index, pass_loss, unrolled
from ..data.shards import sha256
from .shared import kept_tokens, lr_at, ranked_tokens, split_records

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class HeadTrainConfig:
    num_kept_tokens: int = 8192
    init_layer: int | None = -1  # the target layer copied into the head (-1 = last; None = random)
    unroll: int = 3  # training-time test passes: depths 1..unroll
    decay: float = 0.8  # loss weight of pass d: decay**d
    reg_weight: float = 1.0  # smooth-L1 feature regression (EAGLE-1); 0 drops it (EAGLE-3)
    noise: float = 0.05  # uniform noise on pass-0 features (head_loss.noised)
    noise_kind: str = "rms"  # "rms": ± noise × their RMS; "eagle": (U - 0.5) × noise × 512 / length (EAGLE: 0.2)
    epochs: float = 4.0
    batch_tokens: int = 2048
    max_len: int = 512
    lr: float = 1e-3
    warmup_steps: int = 20
    max_minutes: float | None = None  # the cosine schedule is shortened to end within this time
    eval_every: int = 25
    val_fraction: float = 0.05
    seed: int = 0
    save_dtype: str = "float16"
    bf16: bool = True  # bf16 autocast for training matmuls (~5x faster on CPUs with AVX512-BF16)
    answers_only: bool = False  # loss only where the label is an answer token (needs answer_marker)
    num_layers: int = 1  # decoder layers of the head (HeadConfig.num_layers)
    feature_layers: tuple[int, ...] = (-1,)  # target layers the head reads (HeadConfig.feature_layers)
    soft_weight: float = 0.5  # loss: this × CE to the target's top-k distribution + the rest × CE to its argmax
    topk_weight: float = 0.0  # HASS's top-K term (head_loss.topk_loss), over the target's topk_k best tokens
    topk_k: int = 10
    out_rank: int | None = None  # output rows: None the target's, frozen; 0 trained in full; r a rank-r correction
    out_lr_scale: float = 0.1  # the trained rows' learning rate, as a share of lr
    checkpoint_every: int = 25  # steps between checkpoints (with a checkpoint_dir; 0: at evaluations only)


@torch.no_grad()
def agreement(head: FeatureHead, records: list[dict], unroll: int, batch_size: int = 8) -> list[float]:
    """Top-1 agreement with the target's greedy token at depths 1..unroll, at answer positions."""
    head.eval()
    full_to_kept = kept_index(head)
    hits, total = [0] * unroll, [0] * unroll
    for s in range(0, len(records), batch_size):
        batch = make_batch(records[s:s + batch_size], head.device)
        for depth, g in enumerate(unrolled(head, batch, unroll, 0.0)):
            _, h = pass_loss(head, g, batch, depth, full_to_kept, 0.0, answers_only=True)
            hits[depth] += int(h.sum())
            total[depth] += len(h)
    head.train()
    return [x / max(t, 1) for x, t in zip(hits, total)]


@dataclass
class HeadTrainResult:
    path: Path
    val_agreement: list[float]  # per depth, of the saved head
    initial_agreement: list[float]
    steps: int
    seconds: float
    train_tokens: int


def build_head(target, train: list[dict], cfg: HeadTrainConfig, always_keep: list[int],
               init: str | Path | None) -> tuple[FeatureHead, HeadMeta]:
    """The head a run starts from: new (kept tokens ranked on ``train``), or ``init`` grown to
    ``cfg``'s layers and widened to ``cfg.num_kept_tokens``; on the target's device."""
    feature_layers = tuple(cfg.feature_layers)
    if init is None:
        token_ids = kept_tokens(train, target.config.vocab_size, cfg.num_kept_tokens, list(always_keep))
        layers = len(target.get_decoder().layers)
        init_layer = None if cfg.init_layer is None else cfg.init_layer % layers
        head, meta = new_head(target, token_ids, init_layer, cfg.num_layers, feature_layers, cfg.out_rank)
    else:
        head, meta = continued_head(init, target)
        head, meta = grown(head, meta, target, cfg.num_layers, feature_layers)
        head, meta = with_trained_rows(head, meta, cfg.out_rank)
        if cfg.num_kept_tokens > len(head.token_ids):  # widen: the most useful tokens it lacks
            ranked = ranked_tokens(train, target.config.vocab_size, list(always_keep))
            ranked = ranked[~torch.isin(ranked, head.token_ids.cpu())]
            head = widened(head, target, ranked[:cfg.num_kept_tokens - len(head.token_ids)])
    return head.to(target.get_input_embeddings().weight.device).train(), meta


def head_optimizer(head: FeatureHead, cfg: HeadTrainConfig) -> torch.optim.Optimizer:
    """AdamW over the head's trainable weights in two groups: the trained output rows (if any) at
    ``cfg.out_lr_scale`` × the learning rate, everything else at it (``lr_scale`` of each group)."""
    rows = {id(p) for p in head.delta_parameters()}
    params = [p for p in head.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if id(p) not in rows], "lr_scale": 1.0}]
    if rows:
        groups.append({"params": [p for p in params if id(p) in rows], "lr_scale": cfg.out_lr_scale})
    return torch.optim.AdamW(groups, lr=cfg.lr, weight_decay=0.0)


def train_step(head: FeatureHead, optim: torch.optim.Optimizer, batch: FeatureBatch, cfg: HeadTrainConfig,
               full_to_kept: torch.Tensor, lr: float) -> float:
    """One optimizer step on ``batch`` at learning rate ``lr``: the unrolled passes' weighted
    loss, in bf16 autocast (float32 master weights) when ``cfg.bf16``. Returns the loss."""
    for group in optim.param_groups:
        group["lr"] = lr * group["lr_scale"]
    with torch.autocast(device_type=head.device.type, dtype=torch.bfloat16, enabled=cfg.bf16):
        loss = sum(cfg.decay ** d * pass_loss(head, g, batch, d, full_to_kept, cfg.reg_weight, cfg.answers_only,
                                              cfg.soft_weight, cfg.topk_weight, cfg.topk_k)[0]
                   for d, g in enumerate(unrolled(head, batch, cfg.unroll, cfg.noise, cfg.noise_kind)))
    optim.zero_grad(set_to_none=True)
    loss.backward()
    nn.utils.clip_grad_norm_([p for g in optim.param_groups for p in g["params"]], 1.0)
    optim.step()
    return loss.item()


# HeadTrainConfig fields that change how fast a run goes, not what it computes: a checkpoint or a
# cached stage stays valid when they change (another machine may pick another precision).
EXECUTION_FIELDS = ("bf16", "checkpoint_every")


def run_key(cfg, train: list[dict], val: list[dict], init: str | Path | None) -> str:
    """What a checkpoint belongs to: the settings that shape the result (``cfg``: a trainer's config
    dataclass, this one's or the EAGLE-3 head's), the data's size and the init."""
    settings = {k: v for k, v in asdict(cfg).items() if k not in EXECUTION_FIELDS}
    sizes = [len(train), sum(len(r["input_ids"]) for r in train), len(val), sum(len(r["input_ids"]) for r in val)]
    start = sha256(Path(init) / "model.safetensors") if init else ""  # by content: folders move between machines
    text = json.dumps({"settings": settings, "sizes": sizes, "init": start}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def train_head(target, records: list[dict], out_dir: str | Path, cfg: HeadTrainConfig,
               always_keep: list[int] = (), answer_marker: list[int] = (),
               init: str | Path | None = None, val_records: list[dict] | None = None,
               checkpoint_dir: str | Path | None = None) -> HeadTrainResult:
    """Train a head for ``target`` on feature ``records``; the best (by mean validation agreement
    over depths) is saved to ``out_dir`` with ``training.json``.

    - ``answer_marker``: see the module doc.
    - ``init``: a saved head to go on training. Its kept tokens grow to ``num_kept_tokens`` if that
      is larger; ``init_layer`` is then unused.
    - ``val_records``: the validation texts; every record then trains. Default: ``val_fraction``
      of ``records``. Use it to keep the validation set of the run ``init`` came from.
    - ``checkpoint_dir``: every ``checkpoint_every`` steps, after each evaluation and at the end,
      the run's whole state goes there (:mod:`.checkpoint`); a run started again with the same
      data and settings goes on from it and ends exactly as an uninterrupted run would."""
    from ..data.answers import progress

    out_dir = Path(out_dir)
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    if val_records is None:
        train, val = split_records(records, cfg.val_fraction, cfg.seed)
    else:
        train, val = records, val_records
    feature_layers = tuple(cfg.feature_layers)
    train = chunks(train, cfg.max_len, answer_marker, cfg.answers_only, feature_layers)
    val = chunks(val, cfg.max_len, answer_marker, layers=feature_layers)
    head, meta = build_head(target, train, cfg, always_keep, init)
    full_to_kept = kept_index(head)
    optim = head_optimizer(head, cfg)
    params = [p for g in optim.param_groups for p in g["params"]]
    per_epoch = len(token_batches(train, cfg.batch_tokens, random.Random(0)))
    planned = max(1, math.ceil(cfg.epochs * per_epoch))
    train_tokens = sum(len(r["input_ids"]) for r in train)
    logger.info("head: %d train pieces (%d tokens), %d val pieces, %d kept tokens, %d steps, %.1fM params",
                len(train), train_tokens, len(val), len(head.token_ids), planned,
                sum(p.numel() for p in params) / 1e6)
    key = run_key(cfg, train, val, init)
    state = load_train_state(checkpoint_dir, key) if checkpoint_dir is not None else None
    if state is None:
        initial = agreement(head, val, cfg.unroll)
        logger.info("step 0: val agreement by depth %s", _fmt(initial))
        step, total, offset, epoch_rng, elapsed = 0, planned, 0, None, 0.0
        extra = {"best": -1.0, "best_agree": initial, "initial": initial, "running": 0.0, "finished": False}
    else:
        step, total, offset, epoch_rng, elapsed, extra = resume(state, head, optim, rng, head.device)
        logger.info("resumed from %s at step %d/%d", checkpoint_dir, step, total)
    start = time.time() - elapsed

    def checkpoint(finished: bool = False) -> None:
        if checkpoint_dir is None:
            return
        extra["finished"] = finished
        save_train_state(snapshot(key, step, total, head, optim, epoch_rng, offset, time.time() - start, extra, rng,
                                  head.device), checkpoint_dir)

    def evaluate() -> None:
        agree = agreement(head, val, cfg.unroll)
        logger.info("step %d/%d (%.1f min): loss %.3f, val agreement by depth %s", step, total,
                    (time.time() - start) / 60, extra["running"], _fmt(agree))
        if sum(agree) / len(agree) > extra["best"]:
            extra["best"], extra["best_agree"] = sum(agree) / len(agree), agree
            save_head(head, meta, out_dir, getattr(torch, cfg.save_dtype))
            record = {"train_config": asdict(cfg), "step": step, "val_agreement_by_depth": agree,
                      "initial_agreement_by_depth": extra["initial"], "train_seconds": round(time.time() - start, 1),
                      "train_tokens": train_tokens, "val_tokens": sum(len(r["input_ids"]) for r in val)}
            (out_dir / "training.json").write_text(json.dumps(record, indent=2) + "\n")

    bar = progress(total, f"train {out_dir.name}", unit="step", initial=step) if not extra["finished"] else None
    while step < total and not extra["finished"]:
        if epoch_rng is None:  # a new epoch: its batch order is drawn from this state
            epoch_rng, offset = rng_to_json(rng.getstate()), 0
        else:
            rng.setstate(rng_from_json(epoch_rng))
        batches = token_batches(train, cfg.batch_tokens, rng)
        for ids in batches[offset:]:
            if step >= total or (cfg.max_minutes and time.time() - start > 60 * cfg.max_minutes):
                total = step
                break
            loss = train_step(head, optim, make_batch([train[i] for i in ids], head.device), cfg, full_to_kept,
                              lr_at(step, total, cfg))
            step, offset = step + 1, offset + 1
            extra["running"] = loss if step == 1 else 0.9 * extra["running"] + 0.1 * loss
            if bar is not None:
                bar.update(1)
                bar.set_postfix_str(f"loss {extra['running']:.3f} val@1 {extra['best_agree'][0]:.3f}")
            if step % cfg.eval_every == 0:
                evaluate()
                if cfg.max_minutes and step > cfg.warmup_steps:  # re-fit as start-up costs amortise
                    total = fitted_steps(step, time.time() - start, planned, cfg.max_minutes, total)
                    if bar is not None:
                        bar.total = total
                        bar.refresh()
            if step % cfg.eval_every == 0 or (cfg.checkpoint_every and step % cfg.checkpoint_every == 0):
                checkpoint()
        else:
            epoch_rng = None  # the epoch ran to its end
    if bar is not None:
        bar.close()
    if not extra["finished"]:
        if step % cfg.eval_every != 0 or extra["best"] < 0:
            evaluate()
        checkpoint(finished=True)
    return HeadTrainResult(out_dir, extra["best_agree"], extra["initial"], step, time.time() - start, train_tokens)


def fitted_steps(step: int, seconds: float, planned: int, max_minutes: float, current: int | None = None) -> int:
    """The ``planned`` steps, or fewer if at the pace so far (``step`` steps in ``seconds``,
    evaluations included) they would not fit in ``max_minutes``: the learning-rate schedule then
    ends in time instead of being cut off at a high rate. Logged when it moves ``current`` by 5 %."""
    fitted = min(planned, max(int(max_minutes * 60 * step / max(seconds, 1e-9)), step + 1))
    if fitted < planned and abs(fitted - (current or planned)) > 0.05 * (current or planned):
        logger.info("%d steps do not fit in %.1f min at %.2f s/step: the schedule now ends at step %d",
                    planned, max_minutes, seconds / step, fitted)
    return fitted


def _fmt(values: list[float]) -> str:
    return " ".join(f"{v:.3f}" for v in values)
