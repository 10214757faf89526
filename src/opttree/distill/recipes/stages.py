"""A recipe's stages, one head each: what a stage starts from, the training call, the summary it
leaves and the files that ship. The one stage runner of :mod:`.recipe_run` (resumable, through files)
and :mod:`.resident` (in memory, against a clock); each loop adds only its own keys to the summary.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ..train.head_train import HeadTrainConfig, HeadTrainResult, train_head
from .recipe import Recipe, Stage

HEAD_FILES = ("model.safetensors", "opttree_draft.json", "training.json")  # a trained head; its checkpoint stays behind


def stage_init(recipe: Recipe, stage: Stage, previous: Path | None) -> Path | None:
    """The head a stage goes on training: the stage before it's (``init = "^"``), a folder the recipe
    names (relative to the recipe file), or none (a new head)."""
    if stage.init == "^":
        return previous
    return recipe.base / stage.init if stage.init else None


def stage_summary(result: HeadTrainResult) -> dict:
    """The keys every stage reports: its steps, seconds, tokens and validation agreement by depth."""
    return {"steps": result.steps, "seconds": round(result.seconds, 1), "train_tokens": result.train_tokens,
            "val_agreement_by_depth": [round(a, 4) for a in result.val_agreement],
            "initial_agreement_by_depth": [round(a, 4) for a in result.initial_agreement]}


def train_stage(target, tokenizer, records: list[dict], folder: Path, cfg: HeadTrainConfig, init: Path | None,
                val_records: list[dict] | None = None, checkpoint_dir: Path | None = None) -> dict:
    """Train one stage's head into ``folder`` (:func:`~.train.head_train.train_head`, the tokenizer's end
    tokens always kept and its answer marker found) and return its :func:`stage_summary`."""
    from ..data.answers import eos_ids
    from ..data.features import answer_marker

    result = train_head(target, records, folder, cfg, sorted(eos_ids(target, tokenizer)),
                        answer_marker=answer_marker(tokenizer), init=init, val_records=val_records,
                        checkpoint_dir=checkpoint_dir)
    return stage_summary(result)


def ship_head(folder: Path, out: Path) -> None:
    """Copy the last stage's head (:data:`HEAD_FILES`) from ``folder`` into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    for name in HEAD_FILES:
        shutil.copy2(folder / name, out / name)


__all__ = ["HEAD_FILES", "ship_head", "stage_init", "stage_summary", "train_stage"]
