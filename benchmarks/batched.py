"""Batched throughput: opttree vs plain batched ``generate()`` at several batch sizes.

Throughput = new tokens per second summed over the batch's rows (a row's tokens end at its EOS;
generate()'s pad tokens after it are not counted). Target: SmolLM2-135M-Instruct
(``opttree.smollm2.load_smollm2()``); draft: ``opttree.load_draft(--draft, target)``;
prompts: the first turns of Spec-Bench questions (``--per-category`` of each task, in turn), left-
padded per batch. For each batch size the same prompts are cut into batches; plain generate() and
opttree run on each batch in turn (interleaved), greedy, and every opttree output is checked row by
row against plain's. Writes a markdown table (stdout, and ``--out`` if given).

    python benchmarks/batched.py --questions ../shared/data/spec_bench_questions.jsonl \
        --batch-sizes 1,4,8 --per-category 3 --max-new-tokens 64 --out benchmarks/batched.md
    python benchmarks/batched.py --quick     # a smoke run: 2 prompts, batch 1 and 2, 8 tokens
"""

from __future__ import annotations

import argparse
import logging
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from opttree import speculative_generate
from opttree.bench.questions import load_questions, prompt_ids, select_questions

logger = logging.getLogger("benchmarks.batched")


@dataclass
class Tally:
    new_tokens: int = 0
    seconds: float = 0.0
    steps: int = 0  # opttree: target verification forwards
    mismatches: int = 0  # opttree rows whose output differs from plain generate()'s


def left_padded(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists -> (input_ids [B, T], attention_mask [B, T]), padded on the left."""
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for b, row in enumerate(rows):
        ids[b, width - len(row):] = torch.tensor(row)
        mask[b, width - len(row):] = 1
    return ids, mask


def generated(sequences: torch.Tensor, prompt_width: int, eos: set[int]) -> int:
    """New tokens summed over rows, each row's up to and including its first EOS."""
    total = 0
    for row in sequences[:, prompt_width:].tolist():
        total += next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
    return total


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--questions", default="../shared/data/spec_bench_questions.jsonl")
    p.add_argument("--target", default=None, help="folder holding SmolLM2's GGUF file (default: fetched/cached)")
    p.add_argument("--draft", default="drafts/smollm2-135m-draft", help="a draft folder (a model or a feature head)")
    p.add_argument("--draft-dtype", default=None, help="e.g. bfloat16 (default: the target's)")
    p.add_argument("--mix-lookup", type=float, default=None,
                   help="mix the draft with prompt lookup (MixedDrafter) at this n-gram weight")
    p.add_argument("--batch-sizes", default="1,4,8")
    p.add_argument("--per-category", type=int, default=3, help="questions per Spec-Bench task")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--nodes", default="16", help='an integer, or "auto"')
    p.add_argument("--threshold", default="0.3", help='a number, or "auto"')
    p.add_argument("--max-depth", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", default=None, help="also write the markdown table here")
    p.add_argument("--quick", action="store_true", help="smoke run: 2 prompts, batch sizes 1 and 2, 8 new tokens")
    args = p.parse_args(argv)
    if args.quick:
        args.batch_sizes, args.per_category, args.max_new_tokens = "1,2", 1, 8
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(args.threads)

    from opttree import load_draft
    from opttree.smollm2 import load_smollm2

    target, tokenizer = load_smollm2(args.target)
    target = target.to(args.device).eval()
    dtype = getattr(torch, args.draft_dtype) if args.draft_dtype else None
    draft = load_draft(args.draft, target, dtype=dtype).to(args.device).eval()
    if args.mix_lookup is not None:
        from opttree.drafters import MixedDrafter

        draft = MixedDrafter(draft, weight=args.mix_lookup)
    chosen = select_questions(load_questions(args.questions), per_category=args.per_category)
    if args.quick:
        chosen = chosen[:2]
    prompts = [prompt_ids(tokenizer, q.turns[:1], []) for q in chosen]
    config = target.generation_config
    pad = config.pad_token_id if config.pad_token_id is not None else tokenizer.pad_token_id
    eos = config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id]
    eos = {int(t) for t in eos if t is not None}
    tree = dict(nodes=args.nodes if args.nodes == "auto" else int(args.nodes),
                threshold=args.threshold if args.threshold == "auto" else float(args.threshold), max_depth=args.max_depth)
    sizes = [int(s) for s in args.batch_sizes.split(",")]

    with torch.inference_mode():  # warm-up outside the timings
        ids, mask = left_padded(prompts[:2], pad)
        target.generate(ids.to(args.device), attention_mask=mask.to(args.device), max_new_tokens=4, do_sample=False)
        target.generate(ids.to(args.device), attention_mask=mask.to(args.device), max_new_tokens=4, do_sample=False,
                        custom_generate=speculative_generate, draft_model=draft, **tree)

    results = []
    for size in sizes:
        plain, spec = Tally(), Tally()
        for start in range(0, len(prompts), size):
            ids, mask = left_padded(prompts[start:start + size], pad)
            ids, mask = ids.to(args.device), mask.to(args.device)
            if size == 1:  # a single prompt goes unpadded (one row: no holes, no lockstep)
                mask = None
            kw = dict(attention_mask=mask, max_new_tokens=args.max_new_tokens, do_sample=False)
            t0 = time.perf_counter()
            ref = target.generate(ids, **kw)
            t1 = time.perf_counter()
            out = target.generate(ids, custom_generate=speculative_generate, draft_model=draft,
                                  return_dict_in_generate=True, **tree, **kw)
            t2 = time.perf_counter()
            plain.seconds += t1 - t0
            plain.new_tokens += generated(ref, ids.shape[1], eos)
            spec.seconds += t2 - t1
            spec.new_tokens += generated(out.sequences, ids.shape[1], eos)
            spec.steps += len(out.stats.steps)
            spec.mismatches += sum(not torch.equal(a, b) for a, b in zip(out.sequences, ref))
            logger.info("batch size %d: prompts %d-%d done", size, start + 1, start + ids.shape[0])
        results.append((size, plain, spec))

    lines = [
        f"{len(prompts)} Spec-Bench prompts ({args.per_category} per task), {args.max_new_tokens} new tokens, "
        f"greedy; nodes={args.nodes} threshold={args.threshold} max_depth={args.max_depth}; device {args.device}, "
        f"{args.threads} threads, {platform.processor() or platform.machine()}; draft {args.draft}"
        f"{f' ({args.draft_dtype})' if args.draft_dtype else ''}"
        f"{f' mixed with prompt lookup ({args.mix_lookup})' if args.mix_lookup is not None else ''}",
        "",
        "| batch | plain tokens/s | opttree tokens/s | speedup | τ (tokens per verify forward, all rows) "
        "| outputs ≠ plain |",
        "|---|---|---|---|---|---|",
    ]
    for size, plain, spec in results:
        base = plain.new_tokens / plain.seconds
        ours = spec.new_tokens / spec.seconds
        lines.append(f"| {size} | {base:.1f} | {ours:.1f} | {ours / base:.2f}× | {spec.new_tokens / max(spec.steps, 1):.2f} "
                     f"| {spec.mismatches} |")
    table = "\n".join(lines)
    print("\n" + table)
    if args.out:
        Path(args.out).write_text(table + "\n")
    return int(any(spec.mismatches for _, _, spec in results))


if __name__ == "__main__":
    raise SystemExit(main())
