"""Training data for a feature head (EAGLE-style draft): the target's own features and soft labels.

One teacher-forced target forward per text gives, at every position ``i``:
- ``hidden[i]`` [len(layers) * H]: the target's hidden states (by default the last one alone, the
  input of its output head: the *feature*);
- ``topk_ids[i]`` / ``topk_logits[i]`` [k]: its k best next-token ids/logits (the soft label).

Any text works (the labels are the target's, not the text's next tokens); the target's own
answers (:mod:`opttree.distill.data.answers`) are the closest to what it will be asked to draft for.
Shards ``<out_dir>/shard_00012.safetensors`` (:mod:`.shards`) that exist are skipped, so an
interrupted run resumes. ``hidden`` may hold several target layers (``layers``, concatenated).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from .answers import load_round
from .shards import save_records, shard_name

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
def features_of(target, ids: torch.Tensor, topk: int, bf16: bool = False,
                layers: tuple[int, ...] = (-1,)) -> dict:
    """One text ``ids`` [L] → its features [L, len(layers) * H] fp16 and top-k soft labels [L, k].

    ``layers``: which entries of the target's ``output_hidden_states`` are kept, concatenated in
    this order (``HeadConfig.feature_layers``; the default is the last hidden state alone).
    ``bf16``: run the target's matmuls in bf16 autocast (several times faster on CPUs with
    AVX512-BF16; the features then carry ~1e-2 relative noise, below the training noise)."""
    with torch.autocast(device_type=target.device.type, dtype=torch.bfloat16, enabled=bf16):
        out = target(input_ids=ids[None].to(target.device), output_hidden_states=True, use_cache=False)
    top_logits, top_ids = out.logits[0].float().topk(topk, dim=-1)  # [L, k]
    hidden = torch.cat([out.hidden_states[i][0] for i in layers], dim=-1)  # [L, len(layers) * H]
    return {
        "input_ids": ids.clone(),
        "hidden": sixteen_bits(hidden).cpu(),
        "topk_ids": top_ids.to(torch.int32).cpu(),
        "topk_logits": top_logits.to(torch.float16).cpu(),
        "layers": list(layers),
        "bf16": bool(bf16),  # the precision of the forward that made it
    }


def sixteen_bits(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float16 (11-bit mantissa), or bfloat16 where float16 would overflow (inner target
    layers can carry activations beyond its 65,504): 16 bits on disk either way."""
    return x.to(torch.float16) if x.abs().max() < 65000 else x.to(torch.bfloat16)


def extract_features(target, sequences: list[torch.Tensor], out_dir: str | Path, topk: int = 16,
                     shard_size: int = 64, bf16: bool = False, layers: tuple[int, ...] = (-1,)) -> Path:
    """Features for every sequence, in resumable shards under ``out_dir``. Returns ``out_dir``."""
    from .answers import progress

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    starts = range(0, len(sequences), shard_size)
    todo = [s for s in starts if not _done(out_dir, s // shard_size)]
    total = sum(len(x) for x in sequences)
    done_before = total - sum(len(x) for s in todo for x in sequences[s:s + shard_size])
    bar = progress(total, f"features {out_dir.name}", unit="tok", initial=done_before)
    start, done = time.time(), 0
    for s in todo:
        records = [features_of(target, ids, topk, bf16, layers) for ids in sequences[s:s + shard_size]]
        save_records(records, out_dir / shard_name(s // shard_size))
        tokens = sum(len(r["input_ids"]) for r in records)
        done += tokens
        logger.info("features: %d/%d texts, %.0f tok/s", min(s + shard_size, len(sequences)),
                     len(sequences), done / max(time.time() - start, 1e-9))
        if bar is not None:
            bar.update(tokens)
    if bar is not None:
        bar.close()
    return out_dir


def _done(out_dir: Path, index: int) -> bool:
    return (out_dir / shard_name(index)).exists() or (out_dir / f"shard_{index:05d}.pt").exists()


def load_features(out_dir: str | Path) -> list[dict]:
    """Every record of every shard under ``out_dir``, in shard order."""
    return load_round(Path(out_dir))
