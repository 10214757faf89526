"""Which kept set a feature head should have: coverage of the target's greedy tokens on categories the
set was NOT chosen from, and what each size costs per tree layer (the head's second round picks its
``num_kept_tokens`` from this; drafts/smollm2-135m-head/RECIPE.md).

For each Spec-Bench category in turn, the kept sets are chosen without it and counted on its answers
(the target's greedy answers: every answer token is a greedy token):
- ``shipped + ids``: the shipped head's kept tokens, widened in id order (a BPE vocabulary's low ids
  are its most frequent merges: what a widening without counts adds);
- ``shipped + counts``: the shipped head's, widened by how often the target wrote each token in the
  OTHER categories' answers, then in id order (what a round ranking on its own answers adds);
- ``counts alone``: a set ranked from the other categories' answers alone, then id order (no shipped set).
A tree layer of the head widened to each size is timed against a target forward, in each dtype asked.

    OMP_NUM_THREADS=1 python benchmarks/kept_coverage.py --questions ../shared/data/spec_bench_questions.jsonl \\
        --per-category 10 --max-new-tokens 128 --answers-cache /tmp/specbench_answers_10x128.json \\
        --sizes 16384 20480 24576 32768 --threads 1
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from draft_agreement import forward_ms, head_layer_ms, select_questions, target_answers  # noqa: E402

HEAD = Path(__file__).resolve().parents[1] / "drafts" / "smollm2-135m-head"


def held_out_coverage(kept_ids: torch.Tensor, answers: list[dict], sizes: list[int], vocab: int) -> dict:
    """{rule: {size: (token-weighted coverage, category mean, worst category and its coverage)}}, each
    category's kept sets chosen from the other categories' answers."""
    from opttree.distill.train.coverage import extended_kept, id_ranking, set_coverage
    from opttree.distill.train.shared import ranked_tokens

    by_category: dict[str, list[int]] = defaultdict(list)
    for a in answers:
        by_category[a["category"]].extend(a["answer_ids"])
    per: dict[str, dict[int, dict[str, float]]] = {rule: defaultdict(dict) for rule in
                                                   ("shipped + ids", "shipped + counts", "counts alone")}
    for category, tokens in by_category.items():
        truth = torch.tensor(tokens, dtype=torch.long)
        others = [{"topk_ids": torch.tensor(t, dtype=torch.long)[:, None]}
                  for c, t in by_category.items() if c != category and t]
        counted = ranked_tokens(others, vocab, [])  # [V]: by count in the other categories, then id order
        for size in sizes:
            per["shipped + ids"][size][category] = set_coverage(extended_kept(kept_ids, id_ranking(vocab), size), truth)
            per["shipped + counts"][size][category] = set_coverage(extended_kept(kept_ids, counted, size), truth)
            per["counts alone"][size][category] = set_coverage(counted[:size], truth)
    weights = {c: len(t) for c, t in by_category.items()}
    total = sum(weights.values())
    out = {}
    for rule, sizes_ in per.items():
        out[rule] = {}
        for size, cov in sizes_.items():
            worst = min(cov, key=cov.get)
            out[rule][size] = (sum(cov[c] * weights[c] for c in cov) / total, statistics.mean(cov.values()),
                               worst, cov[worst])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--questions", required=True, type=Path, help="Spec-Bench question.jsonl (read by path)")
    p.add_argument("--head", type=Path, default=HEAD)
    p.add_argument("--target", default=None, help="folder holding the SmolLM2 GGUF (default: fetched)")
    p.add_argument("--per-category", type=int, default=10)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--answers-cache", type=Path, default=None, help="the target's answers, kept outside the repository")
    p.add_argument("--sizes", type=int, nargs="+", default=[16384, 20480, 24576, 32768])
    p.add_argument("--layer-dtypes", nargs="*", default=["bfloat16", "float32"], choices=["float32", "bfloat16"])
    p.add_argument("--prefix", type=int, default=256)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(args.threads)

    from opttree import load_draft
    from opttree.distill.train.coverage import extended_kept
    from opttree.distill.train.head import widened
    from opttree.smollm2 import load_smollm2

    target, tokenizer = load_smollm2(args.target)
    vocab = target.config.vocab_size
    head = load_draft(args.head, target)  # float32
    questions = select_questions(args.questions, args.per_category)
    if args.answers_cache and args.answers_cache.exists():
        answers = json.loads(args.answers_cache.read_text())
        assert [a["id"] for a in answers] == [q["id"] for q in questions], "the answers cache is of other questions"
    else:
        answers = target_answers(target, tokenizer, questions, args.max_new_tokens, args.batch_size, 1024)
        if args.answers_cache:
            args.answers_cache.write_text(json.dumps(answers))
    tokens = sum(len(a["answer_ids"]) for a in answers)
    print(f"{len(answers)} prompts, {tokens} answer tokens, {len({a['category'] for a in answers})} categories")
    print("| kept | rule | held-out coverage (tokens) | category mean | worst category |")
    print("|---|---|---|---|---|")
    report = held_out_coverage(head.token_ids, answers, args.sizes, vocab)
    for size in args.sizes:
        for rule, by_size in report.items():
            overall, mean, worst, low = by_size[size]
            print(f"| {size:,} | {rule} | {100 * overall:.1f} % | {100 * mean:.1f} % | {worst} {100 * low:.1f} % |")
    print("\n| kept | dtype | tree layer, 1 / 8 nodes (ms) | ÷ target forward of as many tokens |")
    print("|---|---|---|---|")
    for dtype_name in args.layer_dtypes:  # (cast outside inference mode: the heads' weights stay ordinary tensors)
        dtype = getattr(torch, dtype_name)
        cast = target.to(dtype)
        target_ms = [forward_ms(cast, args.prefix, q, args.reps, vocab) for q in (1, 8)]
        for size in args.sizes:
            wide = head if size == len(head.token_ids) else widened(
                head, target, extended_kept(head.token_ids, torch.arange(vocab), size))
            wide = wide.to(dtype).eval()
            layer = [head_layer_ms(wide, cast, args.prefix, q, args.reps) for q in (1, 8)]
            print(f"| {size:,} | {dtype_name} | {layer[0]:.1f} / {layer[1]:.1f} | "
                  f"{layer[0] / target_ms[0]:.3f} / {layer[1] / target_ms[1]:.3f} |", flush=True)
        target.to(torch.float32)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
