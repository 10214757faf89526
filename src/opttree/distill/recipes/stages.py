"""A recipe's stages, one head each: what a stage starts from, the training call, the summary it
leaves and the files that ship. The one stage runner of :mod:`.recipe_run` (resumable, through files)
and :mod:`.resident` (in memory, against a clock); each loop adds only its own keys to the summary.
The recipe's kind picks the trainer by its config: :func:`~..train.head_train.train_head` for a
``HeadTrainConfig``, :func:`~..eagle3.train.train_eagle3` for an ``Eagle3TrainConfig``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ..eagle3.train import HEAD_FILES as EAGLE3_FILES, Eagle3TrainConfig, train_eagle3
from ..train.head_train import HeadTrainConfig, train_head
from .recipe import Recipe, Stage

HEAD_FILES = ("model.safetensors", "opttree_draft.json", "training.json")  # a trained head; its checkpoint stays behind


def stage_init(recipe: Recipe, stage: Stage, previous: Path | None) -> Path | None:
    """The head a stage goes on training: the stage before it's (``init = "^"``), a folder the recipe
    names (relative to the recipe file), or none (a new head)."""
    if stage.init == "^":
        return previous
    return recipe.base / stage.init if stage.init else None


def stage_summary(result) -> dict:
    """The keys every stage reports (a HeadTrainResult or an Eagle3Result): its steps, seconds,
    tokens and validation agreement by depth."""
    return {"steps": result.steps, "seconds": round(result.seconds, 1), "train_tokens": result.train_tokens,
            "val_agreement_by_depth": [round(a, 4) for a in result.val_agreement],
            "initial_agreement_by_depth": [round(a, 4) for a in result.initial_agreement]}


def train_stage(target, tokenizer, records: list[dict], folder: Path, cfg: HeadTrainConfig | Eagle3TrainConfig,
                init: Path | None, val_records: list[dict] | None = None, checkpoint_dir: Path | None = None) -> dict:
    """Train one stage's head into ``folder`` (the module doc's trainer; a feature head keeps the
    tokenizer's end tokens; both find its answer marker) and return its :func:`stage_summary`."""
    from ..data.answers import eos_ids
    from ..data.features import answer_marker

    marker = answer_marker(tokenizer)
    if isinstance(cfg, Eagle3TrainConfig):
        result = train_eagle3(target, records, folder, cfg, marker, init=init, val_records=val_records,
                              checkpoint_dir=checkpoint_dir)
    else:
        result = train_head(target, records, folder, cfg, sorted(eos_ids(target, tokenizer)), answer_marker=marker,
                            init=init, val_records=val_records, checkpoint_dir=checkpoint_dir)
    return stage_summary(result)


def shipped_files(recipe: Recipe) -> tuple[str, ...]:
    """The files of a trained stage that ship: :data:`HEAD_FILES`, or an EAGLE-3 folder's."""
    return EAGLE3_FILES if recipe.kind == "eagle3" else HEAD_FILES


def check_kind(recipe: Recipe, target) -> None:
    """An eagle3 recipe's ``[features] layers`` must be ``target``'s default taps (what the head's
    config.json will say it reads): refused before any data is made, naming the list to write."""
    if recipe.kind != "eagle3":
        return
    from ...drafters.head.eagle import default_taps
    from ...hf.width import text_config

    layers = text_config(target.config).num_hidden_layers
    taps = default_taps(layers)
    if tuple(recipe.features.layers) != taps:
        raise ValueError(f"recipe {recipe.name}: an eagle3 head reads the target's default taps (2, L//2, L-3 of its "
                         f"{layers} layers): set [features] layers = {list(taps)}, not {list(recipe.features.layers)}")


def ship_head(folder: Path, out: Path, files: tuple[str, ...]) -> None:
    """Copy the last stage's head (``files``: :func:`shipped_files`) from ``folder`` into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    for name in files:
        shutil.copy2(folder / name, out / name)


__all__ = ["HEAD_FILES", "check_kind", "ship_head", "shipped_files", "stage_init", "stage_summary", "train_stage"]
