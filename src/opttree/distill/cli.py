"""``opttree distill`` / ``python -m opttree.distill``: make a draft model for a target.

One command rebuilds a shipped draft from its recipe file (:mod:`opttree.distill.recipes.recipe`)::

    opttree distill --recipe drafts/smollm2-135m-head/recipe.toml --cache ~/distill-cache \
        --out my-head --device cuda

Data, features and every training stage are cached under ``--cache`` and resumed when the same
command runs again; ``--stage data`` / ``features`` stops after that step.

Without a recipe, flags describe one run (the older interface; beside ``--recipe`` they are refused,
the recipe file holds them)::

    opttree distill --target smollm2 --out my-head --max-minutes 40

``--kind head`` (recommended) trains an EAGLE-style feature head that reads the target's last
hidden state (:mod:`opttree.distill.train.head_train`); ``--kind eagle3`` a head in the EAGLE-3 layout
itself, whose folder vLLM and SGLang read as it is (:mod:`opttree.distill.eagle3`); ``--kind layers``
an independent small model made of a few of the target's layers (:mod:`opttree.distill.train.draft`).

``--stage data`` only generates (and caches) the target's answers; ``--stage train`` only
trains on what is cached (for a head, it first caches the target's features of those answers);
``all`` (default) does both. Generation is resumable: run the same
command again after an interruption. Load the result with
``opttree.load_draft(out_dir, target)`` (or pass the folder: ``draft_model=out_dir``).

How long (measured with `--stage probe`, SmolLM2-135M, one thread, another job on the second core):
on an AMD EPYC with AVX512-BF16, target features 430-470 tokens/s in bf16 and about 290 in fp32,
the head's training step about 410 tokens/s in bf16 and 290 in fp32; on an AVX2-only AMD EPYC,
features about 150 tokens/s and training about 175 in fp32, bf16 5-8x slower (so fp32 is picked).
So 1 M tokens of features take 40 minutes to 2 hours, and each epoch of training over them about
as long again. On a shared machine use --threads 1: with two threads while another job held a
core, both stages ran about 10x slower (20-75 tokens/s). The target's answers to prompts, in
batches of 32 on one thread, ran at 50-130 answer tokens/s (plus their prompt tokens' features).
Generating answers costs far more per token than teacher-forced text. One GPU does a round in
10-15 minutes (--device cuda). --precision auto (the default with --recipe) measures which
precision is faster on the machine; --max-minutes caps the training; --num-seed-prompts /
--num-context-prompts shrink the data for a first try.
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
from pathlib import Path

import torch

from .data.targets import load_target

logger = logging.getLogger("opttree.distill")


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The description as written; each option's default where it has one (never "(default: None)")."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False or action.default == []:
            return action.help
        return super()._get_help_string(action)


def build_parser(prog: str = "opttree distill") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n", 1)[1].replace("``", "`"),
                                formatter_class=HelpFormatter)
    p.add_argument("--recipe", help="a recipe file (TOML): data sources, stages, seeds, time limits")
    p.add_argument("--target",
                   help="'smollm2' (SmolLM2-135M-Instruct, fetched once), a folder of the target model "
                        "(HF format, or holding one .gguf file); required without --recipe")
    p.add_argument("--out", required=True, help="output folder of the draft")
    p.add_argument("--cache", help="data cache folder; default: $OPTTREE_CACHE/distill/<target>")
    p.add_argument("--stage", choices=["all", "data", "features", "train", "probe", "coverage"], default="all",
                   help="all: every step; data: answer prompts only; features (with --recipe): stop after "
                        "the features; train: train on the cached data; probe (with --recipe): time both "
                        "precisions on the round's shapes, print tokens/s per stage, and stop; coverage (with --recipe): "
                        "the share of held-out greedy tokens that 8k / 16k / 32k kept tokens cover, from the cached "
                        "features")
    p.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto",
                   help="with --recipe: auto times a short probe of bf16 (autocast, float32 master weights) and "
                        "fp32 on the round's shapes and picks the faster per stage (kept in <cache>/precision.json "
                        "for this machine); bf16 / fp32 name it")
    p.add_argument("--probe-seconds", type=float, default=1.0, help="seconds each precision's probe runs")
    p.add_argument("--kind", choices=["head", "eagle3", "layers"], default="head",
                   help="head: an EAGLE-style feature head; eagle3: a head in the EAGLE-3 layout (fc over three "
                        "target layers, its own lm_head over the --kept-tokens most frequent tokens), a folder "
                        "vLLM/SGLang read as it is; layers: an independent small model")
    g = p.add_argument_group("data")
    g.add_argument("--prompts", help="JSONL of user prompts ('prompt' or 'turns'); default: self-made")
    g.add_argument("--num-seed-prompts", type=int, default=1024, help="self-made prompts answered in round 1")
    g.add_argument("--num-context-prompts", type=int, default=768, help="round 2: tasks over the target's own round-1 answers")
    g.add_argument("--max-new-tokens", type=int, default=128, help="tokens per answer")
    g.add_argument("--gen-batch-size", type=int, default=32, help="prompts answered per batch")
    g.add_argument("--topk", type=int, default=32, help="soft labels kept per token")
    g.add_argument("--extra-data", action="append", default=[],
                   help="another cache folder whose answers are added to training (repeatable)")
    t = p.add_argument_group("training")
    t.add_argument("--init-layers", default="0,1", help="target layers copied into the draft")
    t.add_argument("--kept-tokens", type=int, default=8192,
                   help="output vocabulary of the draft (with --init-head: a larger number widens it)")
    t.add_argument("--epochs", type=float, default=2.0, help="passes over the data")
    t.add_argument("--batch-size", type=int, default=8, help="sequences per step (--kind layers)")
    t.add_argument("--max-len", type=int, default=512, help="tokens per training sequence")
    t.add_argument("--lr", type=float, default=5e-4, help="peak learning rate")
    t.add_argument("--max-minutes", type=float, default=None, help="stop training after this long; default: no limit")
    t.add_argument("--eval-every", type=int, default=100, help="steps between validation agreement checks")
    t.add_argument("--save-dtype", default="float16", choices=["float16", "bfloat16", "float32"], help="dtype of the saved weights")
    h = p.add_argument_group("feature head (--kind head)")
    h.add_argument("--init-layer", type=int, default=-1, help="target layer copied into the head (-1: last)")
    h.add_argument("--unroll", type=int, default=3, help="training-time test passes (tree depths trained)")
    h.add_argument("--batch-tokens", type=int, default=2048, help="tokens per training step")
    h.add_argument("--init-head", default=None, help="a saved head to go on training (keeps its kept tokens); default: a new head")
    h.add_argument("--answers-only", action="store_true",
                   help="train on answer positions only (the prompt stays as context)")
    p.add_argument("--seed", type=int, default=0, help="prompts, shuffling and initialisation")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads; default: torch's")
    p.add_argument("--device", default=None,
                   help="where the target answers prompts, gives features and a head trains"
                        "; default: cuda when present, else cpu (an independent draft trains on the CPU)")
    return p


def main(argv: list[str] | None = None, prog: str = "opttree distill") -> int:
    args = build_parser(prog).parse_args(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    if args.recipe:
        held = recipe_held_flags(build_parser(prog), args, sys.argv[1:] if argv is None else argv)
        if held:
            build_parser(prog).error(f"{', '.join(held)}: the recipe file holds these; leave them out beside --recipe")
        return _run_recipe(args)
    if not args.target:
        build_parser().error("--target is required without --recipe")

    from ..smollm2 import cache_dir
    from .data.answers import DataConfig, eos_ids
    from .data.pipeline import PromptPlan, load_data, make_data
    from .data.prompts import read_jsonl_prompts
    from .train.draft import TrainConfig, train_draft

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    target, tokenizer = load_target(args.target)
    target = target.to(device)
    cache = Path(args.cache) if args.cache else cache_dir() / "distill" / Path(args.target).name
    data_cfg = DataConfig(max_new_tokens=args.max_new_tokens, batch_size=args.gen_batch_size,
                          topk=args.topk)
    plan = PromptPlan(
        user_prompts=read_jsonl_prompts(args.prompts) if args.prompts else None,
        num_seed=args.num_seed_prompts, num_context=args.num_context_prompts, seed=args.seed,
    )
    if args.stage in ("all", "data"):
        make_data(target, tokenizer, cache, plan, data_cfg)
    if args.stage == "data":
        return 0
    records = load_data(cache)
    for extra in args.extra_data:
        records += load_data(extra)
    if not records:
        logger.error("no cached answers under %s: run with --stage data first", cache)
        return 1
    train_cfg = TrainConfig(
        init_layers=tuple(int(i) for i in args.init_layers.split(",")),
        num_kept_tokens=args.kept_tokens, epochs=args.epochs, batch_size=args.batch_size,
        max_len=args.max_len, lr=args.lr, max_minutes=args.max_minutes,
        eval_every=args.eval_every, seed=args.seed, save_dtype=args.save_dtype,
    )
    stop = eos_ids(target, tokenizer)
    if args.kind == "eagle3":
        from .eagle3.run import run_eagle3

        return run_eagle3(target, tokenizer, records, cache, args)
    if args.kind == "head":
        return _train_head(target, tokenizer, records, cache, args, sorted(stop))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(stop)
    target = target.cpu()
    result = train_draft(target, records, args.out, train_cfg, pad_id, sorted(stop))
    logger.info("draft saved to %s: val agreement %.3f after %d steps (%.1f min, %d answer tokens)",
                result.path, result.val_agreement, result.steps, result.seconds / 60,
                result.train_tokens)
    return 0


# What a run with --recipe reads of the flags; every other flag describes a run without a recipe.
RECIPE_RUN_FLAGS = {"recipe", "out", "cache", "stage", "precision", "probe_seconds", "threads", "device", "help"}


def recipe_held_flags(parser: argparse.ArgumentParser, args, argv: list[str]) -> list[str]:
    """The flags given (named in ``argv`` or set off their default) that a recipe file holds."""
    named = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
    return [action.option_strings[0] for action in parser._actions
            if action.dest not in RECIPE_RUN_FLAGS and action.option_strings
            and (named & set(action.option_strings) or getattr(args, action.dest) != action.default)]


def _run_recipe(args) -> int:
    from .recipes.recipe import load_recipe
    from .recipes.recipe_run import run_recipe

    if not args.cache:
        build_parser().error("--recipe needs --cache (the folder that holds its data and stages)")
    recipe = load_recipe(args.recipe)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.stage == "probe":
        return _probe(recipe, device, args.probe_seconds)
    if args.stage == "coverage":
        return _coverage(recipe, Path(args.cache))
    until = args.stage if args.stage in ("data", "features") else "all"
    manifest = run_recipe(recipe, args.cache, args.out if until == "all" else None, device, until,
                          args.precision, args.probe_seconds)
    if until == "all":
        last = manifest["stages"][recipe.stages[-1].name]
        logger.info("%s: draft saved to %s; validation agreement by depth %s", recipe.name, args.out,
                    " ".join(f"{a:.3f}" for a in last["val_agreement_by_depth"]))
    return 0


def _probe(recipe, device: str, seconds: float) -> int:
    """``--stage probe``: measure both precisions on the recipe's shapes and print them (nothing is kept)."""
    from .recipes.precision import bf16_flags, choose, machine_name, probe_round
    from .recipes.recipe_run import load_recipe_target

    target, _ = load_recipe_target(recipe, device)
    cfg = recipe.train_config(recipe.stages[0])
    probes = probe_round(target, cfg, recipe.features.layers, seconds, feature_tokens=min(256, recipe.features.max_len),
                         train_tokens=min(512, cfg.batch_tokens), topk=recipe.features.topk)
    print(choose(probes, machine_name(device)).report())
    print(f"  CPU flags (not used to decide): {' '.join(bf16_flags()) or 'none read'}")
    for p in probes:
        print(f"  {p.stage:8s} {p.precision}: {p.calls} call(s) of {p.tokens} positions in {p.seconds:.2f} s"
              + (" (lost the scouting: not timed at the full shape)" if p.scout else ""))
    return 0


def _coverage(recipe, cache: Path) -> int:
    """``--stage coverage``: kept-vocabulary coverage per source and overall, from cached features."""
    from .train.coverage import split_coverage
    from .recipes.recipe_run import features_folder
    from .data.shards import load_records, shard_paths

    everything = []
    for source in recipe.sources:
        records = [r for p in shard_paths(features_folder(cache, recipe, source)) for r in load_records(p)]
        everything += records
        if records:
            print(f"{source.name}: " + ", ".join(f"{c.size}: {c.covered:.1%}" for c in split_coverage(records))
                  + f" of {sum(len(r['topk_ids']) for r in records):,} greedy tokens ({len(records)} texts)")
    if not everything:
        logger.error("no cached features under %s: run --stage features first", cache)
        return 1
    cov = split_coverage(everything)
    print("all: " + ", ".join(f"{c.size}: {c.covered:.1%}" for c in cov) + f" of {cov[0].tokens:,} held-out tokens")
    return 0


def checkpoint_folder(cache: Path, out: str) -> Path:
    """Where a head trained into ``out`` keeps its checkpoint: in the cache (never in the shipped
    folder), one per output folder, so a rerun into the same folder goes on from its last step."""
    import hashlib

    return cache / "head-checkpoints" / hashlib.sha256(str(Path(out).resolve()).encode()).hexdigest()[:12]


def _train_head(target, tokenizer, records: list[dict], cache: Path, args, always_keep: list[int]) -> int:
    from .data.features import answer_marker, extract_features, load_features, unique_sequences
    from .train.head_train import HeadTrainConfig, train_head

    sequences = unique_sequences(records, 1024)
    random.Random(args.seed).shuffle(sequences)
    features = extract_features(target, sequences, cache / "features", topk=min(args.topk, 16))
    cfg = HeadTrainConfig(
        num_kept_tokens=args.kept_tokens, init_layer=args.init_layer, unroll=args.unroll, epochs=args.epochs,
        batch_tokens=args.batch_tokens, max_len=args.max_len, lr=args.lr, max_minutes=args.max_minutes,
        eval_every=args.eval_every, seed=args.seed, save_dtype=args.save_dtype, answers_only=args.answers_only,
    )
    result = train_head(target, load_features(features), args.out, cfg, always_keep,
                        answer_marker=answer_marker(tokenizer), init=args.init_head,
                        checkpoint_dir=checkpoint_folder(cache, args.out))
    logger.info("feature head saved to %s: val agreement by depth %s after %d steps (%.1f min, %d tokens)",
                result.path, " ".join(f"{a:.3f}" for a in result.val_agreement), result.steps,
                result.seconds / 60, result.train_tokens)
    return 0


if __name__ == "__main__":
    sys.exit(main())
