"""Where a decoding step's time goes, on the real pair: SmolLM2-135M (or a stand-in of it,
``--target smollm2:1b``) + a shipped feature head.

Wraps a few functions of the loop with wall-clock timers (no profiler: their own cost is a few µs
a call) and prints ms per step for each: the target's verify forward, the whole drafting phase,
and inside it the head's forward, its probabilities, the tree layer's top-k and read. Greedy,
batch 1, a few Spec-Bench prompts, the head alone or (``--mix-lookup W``) mixed with prompt lookup.

    .venv/bin/python benchmarks/step_profile.py --dtype bfloat16 --nodes 60 --threads 1
    PYTHONPATH=<another checkout>/src .venv/bin/python benchmarks/step_profile.py ...   # that code, timed alike
"""

from __future__ import annotations

import argparse
import collections
import functools
import importlib
import json
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
TIMED = [("opttree.loop.generation", "target_forward"), ("opttree.loop.drafting", "draft_trees"),
         ("opttree.drafters.base", "PerRow.expand"), ("opttree.drafters.ngram", "PromptLookupDrafter._probs"),
         ("opttree.drafters.head.feature_head", "FeatureHeadDrafter._run"),
         ("opttree.drafters.head.feature_head", "FeatureHeadDrafter._probs"),
         ("opttree.drafters.head.feature_head", "FeatureHead.reduced_logits"),
         ("opttree.drafters.head.feature_head", "FeatureHeadDrafter.root_probs"),
         ("opttree.tree.builder", "top_children"), ("opttree.tree.builder", "read_layer"),
         ("opttree.tree.draft_tree", "DraftTree.extend"), ("opttree.loop.walking", "greedy_walk"),
         ("opttree.loop.generation", "verify_inputs"), ("opttree.loop.slots", "Slots.keep"),
         ("opttree.loop.committing", "commit_tokens"), ("opttree.drafters.mixed", "MixedDrafter.commit"),
         ("opttree.drafters.mixed", "MixedDrafter.add_features"),
         ("opttree.drafters.head.feature_head", "FeatureHeadDrafter.commit"),
         ("opttree.drafters.head.feature_head", "FeatureHeadDrafter.add_features")]


def timed(spent: collections.Counter) -> list:
    """Wrap every TIMED function (in the module that looks it up) so that ``spent[name]`` adds its
    seconds; returns what to put back."""
    undo = []
    for module_name, qualname in TIMED:
        owner = importlib.import_module(module_name)
        *outer, attr = qualname.split(".")
        for name in outer:
            owner = getattr(owner, name)
        original = getattr(owner, attr)

        @functools.wraps(original)
        def wrapper(*args, _original=original, _name=qualname, **kwargs):
            start = time.perf_counter()
            try:
                return _original(*args, **kwargs)
            finally:
                spent[_name] += time.perf_counter() - start

        setattr(owner, attr, wrapper)
        undo.append((owner, attr, original))
    return undo


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--target", default="smollm2", help="as opttree bench names it, e.g. smollm2:1b")
    parser.add_argument("--draft-dtype", default=None, help="the head's dtype (default: the target's)")
    parser.add_argument("--draft", default=str(ROOT / "drafts" / "smollm2-135m-head"))
    parser.add_argument("--nodes", type=int, default=60)
    parser.add_argument("--threshold", type=float, default=0.5)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--stride", type=int, default=40, help="every stride-th Spec-Bench question")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--mix-lookup", type=float, default=None, metavar="W",
                        help="draft with MixedDrafter(head, weight=W): the head mixed with prompt lookup")
    parser.add_argument("--questions", type=Path, default=ROOT.parent / "shared" / "data" / "spec_bench_questions.jsonl")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    from opttree import SpeculativeGenerator
    from opttree import load_draft
    from opttree.loading.machine import cpu_model
    from opttree.bench.models import load_target

    dtype = getattr(torch, args.dtype)
    target, tok = load_target(args.target, dtype)
    head = load_draft(args.draft, target, dtype=getattr(torch, args.draft_dtype or args.dtype))
    questions = [json.loads(line) for line in args.questions.read_text().splitlines() if line.strip()]
    chosen = questions[::args.stride][:args.prompts]
    prompts = [tok.apply_chat_template([{"role": "user", "content": q["turns"][0]}], add_generation_prompt=True,
                                       return_tensors="pt", return_dict=True)["input_ids"] for q in chosen]
    draft = head
    if args.mix_lookup is not None:
        from opttree.drafters import MixedDrafter
        draft = MixedDrafter(head, weight=args.mix_lookup)
    gen = SpeculativeGenerator(target, draft, nodes=args.nodes, threshold=args.threshold)
    gen.generate(prompts[0], max_new_tokens=8)  # warm-up
    spent: collections.Counter = collections.Counter()
    undo = timed(spent)
    try:
        steps = tokens = 0
        start = time.perf_counter()
        for ids in prompts:
            out = gen.generate(ids, max_new_tokens=args.max_new_tokens)
            steps += len(gen.last_stats.steps)
            tokens += out.shape[1] - ids.shape[1]
        total = time.perf_counter() - start
    finally:
        for owner, attr, original in undo:
            setattr(owner, attr, original)
    print(f"{cpu_model()}, torch {torch.__version__}, {args.threads} thread(s); target {args.dtype}, head "
          f"{args.draft_dtype or args.dtype}{'' if args.mix_lookup is None else f' mixed with lookup {args.mix_lookup}'}, nodes={args.nodes}, threshold={args.threshold}: {steps} steps, "
          f"tau {tokens / steps:.2f}, {1000 * total / steps:.1f} ms/step")
    print("| part | ms/step |\n|---|---|")
    for name, seconds in spent.most_common():
        print(f"| `{name}` | {1000 * seconds / steps:.2f} |")


if __name__ == "__main__":
    main()
