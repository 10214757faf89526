"""Run a recipe (:mod:`.recipe`) end to end: sources → features → stages → the shipped draft.

Cache layout, under the folder the user names (``--cache``)::

    sources/<source>/shard_*.safetensors          texts (and, for answers, the target's top-k)
    sources/<source>/source.json                  the source's settings and fingerprint
    features/<layers>-<fp>/<source>/shard_*       the target's features of those texts
    stages/<stage>/                               the stage's head, training.json, stage.json
    manifest.json                                 every shard with its sha256, counts, stage results

Every step is resumable: finished shards are skipped, a stage whose ``stage.json`` says it is
complete (with the same fingerprint) is not trained again. A cache made by other settings is
refused, never mixed.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, replace
from pathlib import Path

import torch

from .precision import PrecisionChoice
from .recipe import Recipe, Source, Stage, fingerprint
from ..data.shards import load_records, save_records, sha256, shard_name, shard_paths
from .stages import check_kind, ship_head, shipped_files, stage_init, train_stage

logger = logging.getLogger("opttree.distill")
STAGE_FILE = "stage.json"


def load_recipe_target(recipe: Recipe, device: str):
    """``(target, tokenizer)`` named by the recipe, fp32, on ``device`` (an eagle3 recipe's features
    checked against its layers: :func:`.stages.check_kind`)."""
    if recipe.target == "smollm2":
        from ...smollm2 import load_smollm2

        target, tokenizer = load_smollm2()
    else:
        from ..data.targets import load_target

        path = Path(recipe.target)
        target, tokenizer = load_target(path if path.is_absolute() else recipe.base / path)
    check_kind(recipe, target)
    return target.to(device).eval(), tokenizer


def source_fingerprint(recipe: Recipe, source: Source) -> str:
    return fingerprint({"source": source, "seed": recipe.seed if source.seed is None else source.seed,
                        "target": recipe.target})


def _claim(folder: Path, stamp: dict) -> None:
    """Write ``stamp`` into ``folder/source.json``, or check that the cache there was made by it."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "source.json"
    if path.exists():
        old = json.loads(path.read_text())
        if old.get("fingerprint") != stamp["fingerprint"]:
            raise SystemExit(f"{folder} was made by other settings ({old.get('settings')}); "
                             "delete it or give the source another name")
    else:
        path.write_text(json.dumps(stamp, indent=2) + "\n")


def teacher_records(tokenizer, pairs: list[tuple[str, str]], max_len: int) -> list[dict]:
    """(user turn, assistant text) pairs → records with ``input_ids`` [L] and ``prompt_len``."""
    from ..data.answers import chat_ids

    out = []
    for user, text in pairs:
        prompt = chat_ids(tokenizer, user)
        answer = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids = (prompt + answer)[:max_len]
        out.append({"input_ids": torch.tensor(ids, dtype=torch.long), "prompt_len": len(prompt),
                    "kind": "teacher"})
    return out


def make_source(recipe: Recipe, source: Source, target, tokenizer, folder: Path) -> list[dict]:
    """Make (or resume) one source's texts under ``folder``; returns its records."""
    from ..data.answers import DataConfig, generate_round, load_round
    from ..data.sources import prompts_of, teacher_pairs

    seed = recipe.seed if source.seed is None else source.seed
    _claim(folder, {"fingerprint": source_fingerprint(recipe, source), "settings": asdict(source), "seed": seed})
    if source.kind == "answers":
        prompts = prompts_of(source.prompts, source.count, seed, recipe.base)
        cfg = DataConfig(max_new_tokens=source.max_new_tokens, batch_size=source.batch_size,
                         topk=source.topk, max_prompt_tokens=source.max_prompt_tokens, bf16=source.bf16)
        generate_round(target, tokenizer, prompts, folder, cfg)
    elif not (folder / shard_name(0)).exists():
        save_records(teacher_records(tokenizer, teacher_pairs(source.count, seed), recipe.features.max_len),
                     folder / shard_name(0))
    return load_round(folder)


def features_folder(cache: Path, recipe: Recipe, source: Source) -> Path:
    """Where a source's features go. The precision is not part of the name: it is how the
    features are computed on one machine, and a round resumed on another machine goes on in
    the same folder (each record names its precision)."""
    spec = recipe.features
    tag = "L" + "_".join(str(i) for i in spec.layers).replace("-", "m")
    fp = fingerprint(replace(spec, bf16=False))[:8]
    return cache / "features" / f"{tag}-{fp}" / f"{source.name}-{source_fingerprint(recipe, source)[:8]}"


def make_features(recipe: Recipe, source: Source, records: list[dict], target, folder: Path,
                  precision: PrecisionChoice | None = None) -> Path:
    """The features of ``records`` under ``folder`` (resumed by shard), in ``precision``'s
    (default: the recipe's ``[features] bf16``)."""
    from ..data.features import extract_features, unique_sequences

    spec = recipe.features
    bf16 = precision.features == "bf16" if precision is not None else spec.bf16
    sequences = unique_sequences(records, spec.max_len)
    return extract_features(target, sequences, folder, topk=spec.topk, shard_size=spec.shard_size,
                            bf16=bf16, layers=spec.layers)


def stage_fingerprint(recipe: Recipe, stage: Stage, init_fp: str) -> str:
    """What a stage's result depends on; how fast it ran (precision, checkpoint spacing) is left out."""
    from ..train.head_train import EXECUTION_FIELDS

    train = {k: v for k, v in asdict(recipe.train_config(stage)).items() if k not in EXECUTION_FIELDS}
    return fingerprint({"stage": stage, "train": train, "init": init_fp,
                        "features": replace(recipe.features, bf16=False),
                        "sources": [source_fingerprint(recipe, s) for s in recipe.stage_sources(stage)]})


def stage_done(folder: Path, fp: str) -> bool:
    path = folder / STAGE_FILE
    return path.exists() and json.loads(path.read_text()).get("fingerprint") == fp


def run_stage(recipe: Recipe, stage: Stage, records: list[dict], target, tokenizer, folder: Path,
              init: Path | None, fp: str, init_label: str | None = None,
              precision: PrecisionChoice | None = None) -> dict:
    """Train one stage into ``folder`` (resumed from its checkpoint there) and write its ``stage.json``."""
    cfg = recipe.train_config(stage)
    if precision is not None:
        cfg = replace(cfg, bf16=precision.train == "bf16")
    summary = {"fingerprint": fp, "complete": True, "precision": "bf16" if cfg.bf16 else "fp32",
               **train_stage(target, tokenizer, records, folder, cfg, init, checkpoint_dir=folder),
               "init": init_label}  # as the recipe names it: no machine's paths in the manifest
    (folder / STAGE_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def shard_table(folder: Path) -> dict:
    return {p.name: sha256(p) for p in shard_paths(folder)}


def count_tokens(records: list[dict]) -> dict:
    answers = sum(len(r["input_ids"]) - int(r.get("prompt_len", 0)) for r in records)
    return {"texts": len(records), "tokens": sum(len(r["input_ids"]) for r in records), "answer_tokens": answers}


def round_precision(recipe: Recipe, target, cache: Path, requested: str, device: str,
                    probe_seconds: float = 1.0) -> PrecisionChoice:
    """``--precision``: as named, or (``auto``) measured on the round's own shapes, or kept from
    an earlier measurement on this machine (:mod:`.precision`)."""
    from .precision import probe_round, resolve

    cfg = recipe.train_config(recipe.stages[0])

    def measure():
        return probe_round(target, cfg, recipe.features.layers, probe_seconds,
                           feature_tokens=min(256, recipe.features.max_len),
                           train_tokens=min(512, cfg.batch_tokens), topk=recipe.features.topk)

    return resolve(requested, device, cache, measure)


def previous_manifest(cache: Path) -> dict:
    """The manifest an earlier run wrote (``{}`` if none): rebuilt shards are checked against it."""
    path = cache / "manifest.json"
    return json.loads(path.read_text()) if path.exists() else {}


def check_rebuilt(old: dict, new: dict, what: str) -> list[str]:
    """The shards of ``new`` (name -> sha256) whose hash differs from the manifest's ``old``; each
    is named in the log (a different machine or precision can change generated text and features)."""
    differ = sorted(name for name, h in new.items() if name in old and old[name] != h)
    if differ:
        logger.warning("%s: %d shard(s) differ from the manifest (%s): made on another machine or "
                       "precision?", what, len(differ), ", ".join(differ[:5]))
    return differ


def run_recipe(recipe: Recipe, cache: str | Path, out: str | Path | None, device: str = "cpu",
               until: str = "all", precision: str | None = None, probe_seconds: float = 1.0) -> dict:
    """Run ``recipe`` with its cache under ``cache``; ``until``: "data", "features" or "all".
    ``precision``: "fp32", "bf16" or "auto" (:func:`round_precision`); None keeps the recipe's
    ``bf16`` flags. Returns the manifest (also written to ``cache/manifest.json`` and, with
    ``out``, next to the shipped draft as ``data_manifest.json``). Shards rebuilt after a cache
    was lost are checked against the manifest left there."""
    cache = Path(cache)
    cache.mkdir(parents=True, exist_ok=True)
    target, tokenizer = load_recipe_target(recipe, device)
    old = previous_manifest(cache)
    manifest = {"recipe": recipe.name, "recipe_fingerprint": fingerprint(recipe), "target": recipe.target,
                "device": device, "sources": {}, "features": {}, "stages": {}}
    records_of, feature_dirs = {}, {}
    choice = round_precision(recipe, target, cache, precision, device, probe_seconds) \
        if precision and until != "data" else None
    if choice is not None:
        logger.info("%s", choice.report())
        manifest["precision"] = choice.to_json()
    for source in recipe.sources:  # each source's texts, then (unless --stage data) its features
        folder = cache / "sources" / source.name
        logger.info("source %s: %s x %d", source.name, source.kind, source.count)
        records_of[source.name] = make_source(recipe, source, target, tokenizer, folder)
        manifest["sources"][source.name] = {"fingerprint": source_fingerprint(recipe, source),
                                            **count_tokens(records_of[source.name]), "shards": shard_table(folder)}
        check_rebuilt(old.get("sources", {}).get(source.name, {}).get("shards", {}),
                      manifest["sources"][source.name]["shards"], f"source {source.name}")
        _write(cache, manifest)
        if until == "data":
            continue
        folder = features_folder(cache, recipe, source)
        feature_dirs[source.name] = make_features(recipe, source, records_of[source.name], target, folder, choice)
        manifest["features"][source.name] = {"folder": str(folder.relative_to(cache)), "shards": shard_table(folder)}
        check_rebuilt(old.get("features", {}).get(source.name, {}).get("shards", {}),
                      manifest["features"][source.name]["shards"], f"features of {source.name}")
        _write(cache, manifest)
    if until in ("data", "features"):
        return manifest
    previous, previous_fp = None, ""
    for stage in recipe.stages:
        folder = cache / "stages" / stage.name
        init = stage_init(recipe, stage, previous)
        init_fp = previous_fp if stage.init == "^" else stage.init
        fp = stage_fingerprint(recipe, stage, init_fp)
        if stage_done(folder, fp):
            logger.info("stage %s: already complete in %s", stage.name, folder)
            summary = json.loads((folder / STAGE_FILE).read_text())
        else:
            records = []
            for source in recipe.stage_sources(stage):
                records += [r for p in shard_paths(feature_dirs[source.name]) for r in load_records(p)]
            logger.info("stage %s: %d texts from %s", stage.name, len(records),
                        ", ".join(s.name for s in recipe.stage_sources(stage)))
            label = f"stages/{previous.name}" if stage.init == "^" else (stage.init or None)
            summary = run_stage(recipe, stage, records, target, tokenizer, folder, init, fp, label, choice)
        manifest["stages"][stage.name] = summary
        previous, previous_fp = folder, fp
    _write(cache, manifest)
    if out is not None:
        out = Path(out)
        ship_head(previous, out, shipped_files(recipe))
        (out / "data_manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _write(cache: Path, manifest: dict) -> None:
    (cache / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
