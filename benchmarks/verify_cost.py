"""T(n): the target's forward over n new tokens after a cached prefix, per dtype (ms, median).

What decides whether big trees pay on a machine: where T(n) stays flat, verifying a 60-node tree
costs about one plain token; where it grows, only small trees pay.

    .venv/bin/python benchmarks/verify_cost.py --threads 1            # SmolLM2-135M, float32 and bfloat16
"""

from __future__ import annotations

import argparse
import time

import torch


def forward_ms(model, prefix: int, n: int, reps: int) -> float:
    """Median ms of one forward over n random tokens after a fresh ``prefix``-token prefill."""
    from transformers import DynamicCache

    from opttree.hf.compat import with_cache

    vocab = model.config.vocab_size
    times = []
    for _ in range(reps):
        cache = DynamicCache(config=model.config)
        with torch.inference_mode():
            model(input_ids=torch.randint(0, vocab, (1, prefix)), **with_cache(model, cache), use_cache=True,
                  logits_to_keep=1)
            tokens = torch.randint(0, vocab, (1, n))
            start = time.perf_counter()
            model(input_ids=tokens, **with_cache(model, cache), use_cache=True, logits_to_keep=0)
            times.append(time.perf_counter() - start)
    return 1000 * sorted(times)[len(times) // 2]


def main(argv=None) -> None:
    from opttree.loading.machine import cpu_model
    from opttree.smollm2 import load_smollm2

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prefix", type=int, default=200)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    target, _ = load_smollm2()
    print(f"{cpu_model()}, torch {torch.__version__}, {args.threads} thread(s), prefix {args.prefix}, median of {args.reps}")
    print("| dtype | " + " | ".join(str(n) for n in args.sizes) + " |")
    print("|---|" + "---|" * len(args.sizes))
    for name in args.dtypes:
        model = target.to(getattr(torch, name))
        print(f"| {name} | " + " | ".join(f"{forward_ms(model, args.prefix, n, args.reps):.0f}" for n in args.sizes) + " |",
              flush=True)


if __name__ == "__main__":
    main()
