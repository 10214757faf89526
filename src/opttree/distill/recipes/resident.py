"""A whole distillation round in ONE process with everything kept on the device: the round a lent
GPU runs inside its minutes (``python -m opttree.distill.recipes.resident``).

What :mod:`.recipe_run` does in resumable steps through files, this does in memory, against a
clock, in the order a short-lived machine needs:

1. the target answers the prompts greedily in large batches (no logits kept: the labels come from
   step 2), for at most ``generate_share`` of the time;
2. one batched teacher-forced forward per ``feature_tokens`` positions gives every text's features
   (the recipe's ``[features] layers``) and top-k labels, kept on the device as records
   (:mod:`.data.features`' layout) that :func:`~.train.head_train.make_batch` collates where they lie;
3. each recipe stage trains a head (:func:`~.stages.train_stage`) in the time left, its cosine
   schedule fitted to it (``max_minutes``), the validation texts the same for every stage;
4. only the head's files are written (``--out``), with ``round.json``: each step's seconds,
   tokens and rates, the machine, and the validation agreement by depth.

With ``--texts DIR ...`` the answers are folders of committed texts (:mod:`..data.texts`: prompts and
the target's greedy answers as token ids, made and gone on from on any machine) and step 1 is
skipped. Otherwise prompts come from the recipe's first ``answers`` source, or from ``--prompts`` (a JSONL, gzipped
or not, e.g. the one ``--write-prompts`` made on another machine: a GPU machine lacks the local
documents the ``chat`` prompts are written from). Nothing resumes: a lent machine forgets its
disk when it goes cold; the round is sized to finish.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from .recipe import Recipe, Source, load_recipe
from .stages import ship_head, shipped_files, stage_init, train_stage

logger = logging.getLogger("opttree.distill")


@dataclass(frozen=True)
class Budget:
    """How a round spends ``seconds`` of wall clock from its start (the target's load included):
    generation stops starting batches at ``generate_share`` of it, features at ``feature_share``
    (cumulative), and the stages share what is left less ``reserve`` seconds (evaluation, saving)."""

    seconds: float
    generate_share: float = 0.4
    feature_share: float = 0.5
    reserve: float = 20.0


@dataclass
class Timings:
    """What each step took and made: ``round.json``."""

    machine: str = ""
    device: str = ""
    load_s: float = 0.0
    generate_s: float = 0.0
    prompts_answered: int = 0
    prompts_offered: int = 0
    answer_tokens: int = 0
    tokens: int = 0
    feature_s: float = 0.0
    stages: dict = field(default_factory=dict)
    total_s: float = 0.0

    def rates(self) -> dict:
        answered = round(self.answer_tokens / self.generate_s, 1) if self.generate_s > 0 else None  # None: read
        return {"answer_tok_per_s": answered,
                "feature_tok_per_s": round(self.tokens / max(self.feature_s, 1e-9), 1)}


def round_source(recipe: Recipe) -> Source:
    """The source whose prompts the round answers: the recipe's first ``answers`` source."""
    source = next((s for s in recipe.sources if s.kind == "answers"), None)
    if source is None:
        raise ValueError(f"recipe {recipe.name}: the resident round needs an 'answers' source")
    return source


def round_prompts(recipe: Recipe, prompts_file: Path | None):
    """The prompts to answer: ``prompts_file``'s (first ``count``), else the source's own."""
    from ..data.prompts import read_jsonl_prompts
    from ..data.sources import prompts_of

    source = round_source(recipe)
    seed = recipe.seed if source.seed is None else source.seed
    if prompts_file is not None:
        return read_jsonl_prompts(prompts_file)[:source.count]
    return prompts_of(source.prompts, source.count, seed, recipe.base)


def generate_texts(target, tokenizer, prompts, source: Source, deadline: float) -> list[dict]:
    """The target's greedy answers, shortest prompts first in batches of ``source.batch_size``,
    until ``deadline`` (time.time(); one batch at least): records ``{"input_ids" [L], "prompt_len"}``
    on the CPU."""
    from ..data.answers import DataConfig, answer_batch, chat_ids

    cfg = DataConfig(max_new_tokens=source.max_new_tokens, batch_size=source.batch_size, topk=1,
                     max_prompt_tokens=source.max_prompt_tokens, bf16=source.bf16)
    ids = [chat_ids(tokenizer, p.text)[-cfg.max_prompt_tokens:] for p in prompts]
    order = sorted(range(len(ids)), key=lambda i: (len(ids[i]), i))
    out = []
    for s in range(0, len(order), cfg.batch_size):
        if out and time.time() > deadline:  # one batch at least, however late
            logger.info("generation: out of time after %d of %d prompts", len(out), len(ids))
            break
        batch = order[s:s + cfg.batch_size]
        for sample in answer_batch(target, tokenizer, [ids[i] for i in batch], cfg, with_logits=False):
            out.append({"input_ids": sample.input_ids, "prompt_len": sample.prompt_len})
    return out


@torch.inference_mode()
def batched_features(target, texts: list[torch.Tensor], layers: tuple[int, ...], topk: int, bf16: bool,
                     feature_tokens: int, deadline: float, prompt_lens: list[int] | None = None) -> list[dict]:
    """:func:`.data.features.features_of` for many texts at once: right-padded batches of about
    ``feature_tokens`` positions, one forward each; the records stay on the target's device
    (features 16-bit, :func:`.data.features.sixteen_bits`). Texts not reached by ``deadline`` are left out
    (the first batch is always made). ``prompt_lens``: each text's, kept in its record (the answers' start)."""
    from ..data.features import sixteen_bits

    device = target.get_input_embeddings().weight.device
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    records: dict[int, dict] = {}
    start = 0
    while start < len(order) and (not records or time.time() < deadline):  # one batch at least
        end = start + 1
        while end < len(order) and len(texts[order[end]]) * (end - start + 1) <= feature_tokens:
            end += 1
        chunk = order[start:end]
        width = len(texts[chunk[-1]])
        ids = torch.zeros(len(chunk), width, dtype=torch.long)
        mask = torch.zeros(len(chunk), width, dtype=torch.long)
        for row, i in enumerate(chunk):
            ids[row, :len(texts[i])] = texts[i]
            mask[row, :len(texts[i])] = 1
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=bf16):
            out = target(input_ids=ids.to(device), attention_mask=mask.to(device), output_hidden_states=True,
                         use_cache=False)
        top_logits, top_ids = out.logits.float().topk(topk, dim=-1)  # [B, W, k]
        hidden = torch.cat([out.hidden_states[i] for i in layers], dim=-1)  # [B, W, len(layers) * H]
        for row, i in enumerate(chunk):
            n = len(texts[i])
            records[i] = {"input_ids": texts[i].to(device), "hidden": sixteen_bits(hidden[row, :n]).clone(),
                          "topk_ids": top_ids[row, :n].to(torch.int32), "topk_logits": top_logits[row, :n].half(),
                          "layers": list(layers), "bf16": bool(bf16)}
            if prompt_lens is not None:
                records[i]["prompt_len"] = int(prompt_lens[i])
        start = end
    return [records[i] for i in sorted(records)]


def machine_of(device: str) -> str:
    from ...loading.machine import cpu_model

    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return cpu_model()


def run_round(recipe: Recipe, out: str | Path, device: str, budget: Budget, prompts_file: Path | None = None,
              feature_tokens: int = 16384, texts_dirs: tuple[Path, ...] = ()) -> Timings:
    """The round (module doc); returns its :class:`Timings` (also in ``out/round.json``)."""
    from .recipe_run import load_recipe_target
    from ..train.shared import split_records

    start = time.time()
    out = Path(out)
    timings = Timings(machine=machine_of(device), device=device)
    target, tokenizer = load_recipe_target(recipe, device)
    timings.load_s = round(time.time() - start, 1)
    t = time.time()
    if texts_dirs:  # the committed answers (:mod:`..data.texts`): no generation here
        from ..data.texts import read_texts

        texts = [r for folder in texts_dirs for r in read_texts(folder)]
        prompts = texts
    else:
        prompts = round_prompts(recipe, prompts_file)
        texts = generate_texts(target, tokenizer, prompts, round_source(recipe),
                               start + budget.generate_share * budget.seconds)
    timings.generate_s = 0.0 if texts_dirs else round(time.time() - t, 1)  # reading committed texts generates none
    timings.prompts_offered = len(prompts)
    timings.prompts_answered = len(texts)
    timings.answer_tokens = sum(len(r["input_ids"]) - r["prompt_len"] for r in texts)
    spec = recipe.features
    t = time.time()
    sequences = [r["input_ids"][:spec.max_len] for r in texts]
    records = batched_features(target, sequences, spec.layers, spec.topk, spec.bf16, feature_tokens,
                               start + budget.feature_share * budget.seconds, [r["prompt_len"] for r in texts])
    timings.feature_s, timings.tokens = round(time.time() - t, 1), sum(len(r["input_ids"]) for r in records)
    logger.info("round: %d texts (%d answer tokens) in %.0f s; features of %d tokens in %.0f s",
                len(texts), timings.answer_tokens, timings.generate_s, timings.tokens, timings.feature_s)
    first = recipe.train_config(recipe.stages[0])
    train, val = split_records(records, first.val_fraction, first.seed)  # the same validation for every stage
    previous = None
    work = out.parent / f".{out.name}-stages"
    for k, stage in enumerate(recipe.stages):
        left = budget.seconds - (time.time() - start) - budget.reserve
        minutes = max(left / (len(recipe.stages) - k), 1.0) / 60
        if stage.minutes is not None:
            minutes = min(minutes, stage.minutes)
        cfg = replace(recipe.train_config(stage), max_minutes=minutes, checkpoint_every=0)
        folder = work / stage.name
        summary = train_stage(target, tokenizer, train, folder, cfg, stage_init(recipe, stage, previous), val_records=val)
        timings.stages[stage.name] = {**summary, "minutes_given": round(minutes, 2)}
        previous = folder
    ship_head(previous, out, shipped_files(recipe))
    shutil.rmtree(work, ignore_errors=True)
    timings.total_s = round(time.time() - start, 1)
    report = {"recipe": recipe.name, **asdict(timings), "rates": timings.rates()}
    (out / "round.json").write_text(json.dumps(report, indent=2) + "\n")
    return timings


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m opttree.distill.recipes.resident", description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", required=True, type=Path)
    p.add_argument("--out", type=Path, help="the head's folder")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--seconds", type=float, default=330.0, help="the round's wall-clock budget, the load included")
    p.add_argument("--prompts", type=Path, default=None, help="a JSONL of prompts instead of the source's own")
    p.add_argument("--write-prompts", type=Path, default=None,
                   help="only write the source's prompts to this JSONL (.gz: gzipped) and stop")
    p.add_argument("--texts", type=Path, nargs="+", default=(),
                   help="train on these folders' committed answers (opttree.distill.data.texts) instead of generating")
    p.add_argument("--feature-tokens", type=int, default=16384, help="positions per features forward")
    p.add_argument("--feature-share", type=float, default=Budget.feature_share,
                   help="features stop starting batches at this share of --seconds (cumulative)")
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    recipe = load_recipe(args.recipe)
    if args.write_prompts:
        from ..data.prompts import write_jsonl_prompts

        path = write_jsonl_prompts(round_prompts(recipe, None), args.write_prompts)
        print(f"{path}: {path.stat().st_size} bytes")
        return 0
    if args.out is None:
        p.error("--out is required for a round")
    timings = run_round(recipe, args.out, args.device, Budget(args.seconds, feature_share=args.feature_share), args.prompts, args.feature_tokens,
                        args.texts)
    print(json.dumps({**asdict(timings), "rates": timings.rates()}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
