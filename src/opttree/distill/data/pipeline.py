"""``distill``: prompts → the target's answers (data) → a trained draft, in one call."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from .answers import DataConfig, generate_round, load_round
from .prompts import Prompt, context_prompts, seed_prompts

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PromptPlan:
    """Which prompts to answer: user prompts, or ``num_seed`` self-made ones + ``num_context``
    tasks over the target's own answers (see :mod:`opttree.distill.data.prompts`)."""

    user_prompts: list[Prompt] | None = None
    num_seed: int = 1600
    num_context: int = 800
    seed: int = 0


def make_data(model, tokenizer, data_dir: str | Path, plan: PromptPlan,
              cfg: DataConfig = DataConfig()) -> list[dict]:
    """Answer every planned prompt (resumable, cached under ``data_dir``) and return records."""
    data_dir = Path(data_dir)
    if plan.user_prompts is not None:
        generate_round(model, tokenizer, plan.user_prompts, data_dir / "user", cfg)
        return load_round(data_dir / "user")
    first = seed_prompts(plan.num_seed, plan.seed)
    generate_round(model, tokenizer, first, data_dir / "round1", cfg)
    records = load_round(data_dir / "round1")
    if plan.num_context > 0:
        answered = [(Prompt(r["prompt"], r["kind"]), r["text"]) for r in records]
        second = context_prompts(answered, plan.num_context, plan.seed)
        generate_round(model, tokenizer, second, data_dir / "round2", cfg)
        records += load_round(data_dir / "round2")
    return records


def load_data(data_dir: str | Path) -> list[dict]:
    """Every cached record under ``data_dir`` (all rounds; partial rounds included)."""
    records = []
    for round_dir in sorted(p for p in Path(data_dir).iterdir() if p.is_dir()):
        records.extend(load_round(round_dir))
    return records
