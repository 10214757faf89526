"""Training data for a feature head (EAGLE-style draft): the target's own features and soft labels.

One teacher-forced target forward per text gives, at every position ``i``:
- ``hidden[i]`` [H]: the target's last hidden state, the input of its output head (the *feature*);
- ``topk_ids[i]`` / ``topk_logits[i]`` [k]: its k best next-token ids/logits (the soft label).

Any text works (the labels are the target's, not the text's next tokens); the target's own
answers (:mod:`opttree.distill.data`) are the closest to what it will be asked to draft for.
Shards ``<out_dir>/shard_00012.pt`` that exist are skipped, so an interrupted run resumes.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from .data import load_round

logger = logging.getLogger(__name__)


def answer_marker(tokenizer) -> list[int]:
    """The token ids the tokenizer's chat template puts just before an assistant answer
    (SmolLM2: ``<|im_start|>assistant\\n``); [] without a chat template."""
    if not getattr(tokenizer, "chat_template", None):
        return []
    turn = [{"role": "user", "content": "Hi"}]
    with_answer = tokenizer.apply_chat_template(turn, add_generation_prompt=True, tokenize=False)
    without = tokenizer.apply_chat_template(turn, add_generation_prompt=False, tokenize=False)
    if not with_answer.startswith(without) or with_answer == without:
        return []
    return tokenizer(with_answer[len(without):], add_special_tokens=False)["input_ids"]


def unique_sequences(records: list[dict], max_len: int) -> list[torch.Tensor]:
    """The records' ``input_ids`` ([L] long), duplicates dropped, cut to ``max_len``; order kept."""
    seen, out = set(), []
    for record in records:
        ids = record["input_ids"][:max_len]
        key = tuple(ids.tolist())
        if key not in seen:
            seen.add(key)
            out.append(ids)
    return out


@torch.inference_mode()
def features_of(target, ids: torch.Tensor, topk: int, bf16: bool = False) -> dict:
    """One text ``ids`` [L] → its features [L, H] fp16 and top-k soft labels [L, k].

    ``bf16``: run the target's matmuls in bf16 autocast (several times faster on CPUs with
    AVX512-BF16; the features then carry ~1e-2 relative noise, below the training noise)."""
    with torch.autocast(device_type=target.device.type, dtype=torch.bfloat16, enabled=bf16):
        out = target(input_ids=ids[None].to(target.device), output_hidden_states=True, use_cache=False)
    top_logits, top_ids = out.logits[0].float().topk(topk, dim=-1)  # [L, k]
    return {
        "input_ids": ids.clone(),
        "hidden": out.hidden_states[-1][0].to(torch.float16).cpu(),  # [L, H]
        "topk_ids": top_ids.to(torch.int32).cpu(),
        "topk_logits": top_logits.to(torch.float16).cpu(),
    }


def extract_features(target, sequences: list[torch.Tensor], out_dir: str | Path, topk: int = 16,
                     shard_size: int = 64, bf16: bool = False) -> Path:
    """Features for every sequence, in resumable shards under ``out_dir``. Returns ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    start, done = time.time(), 0
    for s in range(0, len(sequences), shard_size):
        shard = out_dir / f"shard_{s // shard_size:05d}.pt"
        if shard.exists():
            continue
        records = [features_of(target, ids, topk, bf16) for ids in sequences[s:s + shard_size]]
        torch.save(records, shard.with_suffix(".tmp"))
        shard.with_suffix(".tmp").rename(shard)
        done += sum(len(r["input_ids"]) for r in records)
        logger.info("features: %d/%d texts, %.0f tok/s", min(s + shard_size, len(sequences)),
                    len(sequences), done / max(time.time() - start, 1e-9))
    return out_dir


def load_features(out_dir: str | Path) -> list[dict]:
    """Every record of every shard under ``out_dir``, in shard order."""
    return load_round(Path(out_dir))
