"""Self-distillation data: the target's own greedy answers plus its top-k logits.

Each prompt is wrapped in the target's chat template and answered greedily in left-padded
batches. For every answer token the target's raw logits give the soft label (top-k ids and
logits, fp16); the answer token itself IS the target's greedy token there.

Batches are written as shards ``<data_dir>/<round>/shard_00012.safetensors`` (:mod:`.shards`, no
pickle); a shard that exists is skipped, so an interrupted run resumes where it stopped (prompt
order is deterministic).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .prompts import Prompt
from .shards import load_records, save_records, shard_name, shard_paths

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DataConfig:
    """How answers are generated. ``topk`` soft labels are kept per answer token."""

    max_new_tokens: int = 160
    batch_size: int = 16
    topk: int = 32
    max_prompt_tokens: int = 768
    bf16: bool = False  # generate under bf16 autocast (2-3x faster on CPUs with AVX512-BF16 and on GPUs)


@dataclass
class Sample:
    """One prompt + greedy answer.

    ``input_ids`` [L] long: chat-formatted prompt followed by the answer (EOS kept).
    ``prompt_len``: number of prompt tokens; answer token j sits at ``prompt_len + j``.
    ``topk_ids`` [L - prompt_len, k] int32, ``topk_logits`` [L - prompt_len, k] fp16: the
    target's k best next-token ids/logits for each answer position (row j predicts token j).
    """

    input_ids: torch.Tensor
    prompt_len: int
    topk_ids: torch.Tensor
    topk_logits: torch.Tensor
    text: str = ""

    def to_dict(self) -> dict:
        return {"input_ids": self.input_ids, "prompt_len": self.prompt_len,
                "topk_ids": self.topk_ids, "topk_logits": self.topk_logits, "text": self.text}


def chat_ids(tokenizer, prompt: str) -> list[int]:
    """Token ids of ``prompt`` as one user turn in the chat template, ready for the answer."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer(prompt)["input_ids"]


def _left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad ``rows`` → ``(input_ids [B, T], attention_mask [B, T])``."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row):] = torch.tensor(row)
        mask[i, width - len(row):] = 1
    return ids, mask


def eos_ids(model, tokenizer) -> set[int]:
    """Every token id that ends an answer (the generation config may name several)."""
    ids = model.generation_config.eos_token_id
    ids = set(ids if isinstance(ids, (list, tuple)) else [ids] if ids is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


@torch.inference_mode()
def answer_batch(model, tokenizer, prompt_ids: list[list[int]], cfg: DataConfig,
                 with_logits: bool = True) -> list[Sample]:
    """Greedy answers for one batch of tokenised prompts, with the target's top-k logits
    (``with_logits=False``: none, ``topk_*`` empty; a big batch then holds no [B, N, V] logits,
    for callers that take the labels from a features pass: :mod:`.recipes.resident`)."""
    stop = eos_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(stop)
    ids, mask = (t.to(model.device) for t in _left_pad(prompt_ids, pad_id))  # [B, T]
    with torch.autocast(device_type=model.device.type, dtype=torch.bfloat16, enabled=cfg.bf16):
        out = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=cfg.max_new_tokens, do_sample=False,
            output_logits=with_logits, return_dict_in_generate=True, pad_token_id=pad_id,
            eos_token_id=sorted(stop),
        )
    answers = out.sequences[:, ids.shape[1]:].cpu()  # [B, N]
    if with_logits:
        logits = torch.stack(out.logits, dim=1).float()  # [B, N, V]
        top_logits, top_ids = logits.topk(cfg.topk, dim=-1)  # [B, N, k]
    else:
        top_ids = torch.zeros(*answers.shape, 0, dtype=torch.int32)  # [B, N, 0]
        top_logits = torch.zeros(*answers.shape, 0, dtype=torch.float16)
    stops = torch.tensor(sorted(stop))
    samples = []
    for i, prompt in enumerate(prompt_ids):
        ended = torch.isin(answers[i], stops).nonzero()  # [n, 1]
        end = int(ended[0]) + 1 if len(ended) else answers.shape[1]
        answer = answers[i, :end].tolist()
        samples.append(Sample(
            input_ids=torch.tensor(prompt + answer, dtype=torch.long),
            prompt_len=len(prompt),
            topk_ids=top_ids[i, :end].to(torch.int32).cpu(),
            topk_logits=top_logits[i, :end].to(torch.float16).cpu(),
            text=tokenizer.decode(answer, skip_special_tokens=True),
        ))
    return samples


def progress(total: int, desc: str, unit: str = "batch", initial: int = 0):
    """A tqdm bar (with its ETA) when tqdm is installed, else ``None`` (progress then goes to the log)."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, unit=unit, initial=initial, dynamic_ncols=True)


def _done(out_dir: Path, b: int) -> bool:
    return (out_dir / shard_name(b)).exists() or (out_dir / f"shard_{b:05d}.pt").exists()


def generate_round(model, tokenizer, prompts: list[Prompt], out_dir: Path, cfg: DataConfig) -> Path:
    """Answer ``prompts`` in batches into shards under ``out_dir`` (resumable). Returns it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenised = [chat_ids(tokenizer, p.text)[-cfg.max_prompt_tokens:] for p in prompts]
    # Similar lengths share a batch (less padding); the order is deterministic, so resumable.
    order = sorted(range(len(prompts)), key=lambda i: (len(tokenised[i]), i))
    batches = [order[s:s + cfg.batch_size] for s in range(0, len(order), cfg.batch_size)]
    todo = [b for b in range(len(batches)) if not _done(out_dir, b)]
    bar = progress(len(batches), out_dir.name, initial=len(batches) - len(todo))
    start, new_tokens = time.time(), 0
    for b in todo:
        batch = batches[b]
        samples = answer_batch(model, tokenizer, [tokenised[i] for i in batch], cfg)
        records = [dict(s.to_dict(), prompt=prompts[i].text, kind=prompts[i].kind)
                   for s, i in zip(samples, batch)]
        save_records(records, out_dir / shard_name(b))
        new_tokens += sum(len(s.topk_ids) for s in samples)
        rate = new_tokens / max(time.time() - start, 1e-9)
        logger.info("%s: batch %d/%d done, %.1f answer tok/s", out_dir.name, b + 1, len(batches), rate)
        if bar is not None:
            bar.update(1)
            bar.set_postfix_str(f"{rate:.0f} answer tok/s")
    if bar is not None:
        bar.close()
    return out_dir


def load_round(out_dir: Path) -> list[dict]:
    """All records of one round, in shard order (never unpickles: see :mod:`.shards`)."""
    records = []
    for shard in shard_paths(out_dir):
        records.extend(load_records(shard))
    return records
