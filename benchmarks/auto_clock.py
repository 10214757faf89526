"""``"auto"``'s latency model, two ways, against plain generate() in one process: the speed-ups.

- ``auto``: as shipped: decoding's clock prices each verification size it has counted steps at, smaller
  sizes probed (``budget.latency.SeenSize``, ``LatencyModel.probe``);
- ``table``: T(n) from the calibration through one online correction for every size, no probes (the
  model before the clock per size: its constants set out of reach).

Each variant keeps its own latency model (one calibration read from the same file), the methods take
turns per prompt (the order reversed every other prompt), and every output is checked against plain's.
Spec-Bench's first turns, ``--per-category`` per category, chat template, at most 384 prompt tokens.

Usage::

    OPTTREE_CALIBRATION_DIR=$(mktemp -d) python benchmarks/auto_clock.py \\
        --questions ../shared/data/spec_bench_questions.jsonl --dtype float32 --threads 2 --per-category 2
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from opttree import load_draft, speculative_generate
from opttree.budget import calibration, latency as latency_module
from opttree.smollm2 import load_smollm2

VARIANTS = ("auto", "table")
OUT_OF_REACH = 10**9


def first_turns(path: str, per_category: int) -> list[str]:
    seen: dict[str, int] = {}
    turns = []
    for line in open(path).read().splitlines():
        q = json.loads(line)
        if seen.get(q["category"], 0) < per_category:
            seen[q["category"]] = seen.get(q["category"], 0) + 1
            turns.append(q["turns"][0])
    return turns


class Variants:
    """Switches the module constants and the pair's remembered latency model per variant."""

    def __init__(self):
        self.clock = (latency_module.SEEN_AFTER, latency_module.PROBE_EVERY, latency_module.PROBE_AGAIN)
        self.pairs = {name: {} for name in VARIANTS}

    def use(self, name: str) -> None:
        clock = self.clock if name != "table" else (OUT_OF_REACH,) * 3
        latency_module.SEEN_AFTER, latency_module.PROBE_EVERY, latency_module.PROBE_AGAIN = clock
        calibration._PAIRS = self.pairs[name]

    def model(self, name: str):
        return next(iter(self.pairs[name].values()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--questions", required=True)
    parser.add_argument("--draft", default="drafts/smollm2-135m-head")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--draft-dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, tok = load_smollm2(dtype=getattr(torch, args.dtype))
    head = load_draft(args.draft, target, dtype=getattr(torch, args.draft_dtype))
    ids = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, return_tensors="pt",
                                   return_dict=True)["input_ids"][:, -384:]
           for q in first_turns(args.questions, args.per_category)]
    variants, n = Variants(), args.max_new_tokens
    steps: dict[str, list] = {name: [] for name in VARIANTS}

    def plain(x):
        return target.generate(x, max_new_tokens=n, do_sample=False)

    def auto(x, name):
        variants.use(name)
        out = target.generate(x, max_new_tokens=n, do_sample=False, custom_generate=speculative_generate,
                              draft_model=head, return_dict_in_generate=True)
        steps[name] += out.stats.steps
        return out.sequences

    seconds = {"plain": 0.0, **{name: 0.0 for name in VARIANTS}}
    equal = 0
    with torch.inference_mode():
        plain(ids[0])
        for name in VARIANTS:  # each variant's calibration and first call (warm-up, not timed)
            auto(ids[0], name)
        steps = {name: [] for name in VARIANTS}
        for i, x in enumerate(ids):
            order = [("plain", lambda: plain(x))] + [(name, lambda name=name: auto(x, name)) for name in VARIANTS]
            outs = {}
            for name, run in (order if i % 2 == 0 else order[::-1]):
                start = time.perf_counter()
                outs[name] = run()
                seconds[name] += time.perf_counter() - start
            equal += all(torch.equal(outs[name], outs["plain"]) for name in VARIANTS)
    print(f"{len(ids)} prompts x {n} tokens, {args.dtype} target, {args.draft_dtype} draft, {args.threads} threads; "
          f"outputs equal to plain's: {equal}/{len(ids)}")
    for name in VARIANTS:
        model, mine = variants.model(name), steps[name]
        clock = {size: round(seen.seconds * 1e3, 1) for size, seen in sorted(model.seen.items()) if seen.counted >= 2}
        print(f"{name:8s} {seconds['plain'] / seconds[name]:.3f}x plain, tau "
              f"{sum(s.emitted for s in mine) / len(mine):.2f}, tree {sum(s.tree_size for s in mine) / len(mine):.1f}; "
              f"T(n) on decoding's clock (ms) {clock}")


if __name__ == "__main__":
    main()
