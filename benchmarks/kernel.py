"""Does opttree's few-row linear kernel (``opttree.hf.fast_linear``) pay on this machine?

Times one target forward over a root and n tree nodes on a cached prefix (the verify of a decoding
step; ``opttree.budget.calibration.measure_verify``) with the kernel off, on, and in ``auto`` mode, and prints
the medians as a markdown table. ``auto`` is timed after a first pass that lets it make its
choices (``fast_linear.decisions()``, summarised below the table).

Usage::

    python benchmarks/kernel.py                       # SmolLM2-135M-Instruct, fetched as the demo does
    python benchmarks/kernel.py --target path/to/model --threads 1
"""

from __future__ import annotations

import argparse
import os
import platform

import torch

from opttree.budget import calibration
from opttree.hf import fast_linear

MODES = ("off", "on", "auto")


def verify_ms(target, sizes: list[int], prefix: int, repeats: int, mode: str) -> list[float]:
    """Median ms of a verify over 1 + n tokens for each n in ``sizes``, under kernel ``mode``."""
    os.environ["OPTTREE_WEIGHT_MAJOR"] = mode
    with fast_linear.weight_major():
        if mode == "auto":  # let it try both paths for every shape first
            calibration.measure_verify(target, sizes, prefix, repeats=2 * fast_linear.TRIALS)
        seconds = calibration.measure_verify(target, sizes, prefix, repeats=repeats)
    return [1000 * s for s in seconds]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default=None, help="model folder (default: SmolLM2-135M-Instruct, fetched)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--sizes", type=int, nargs="+", default=[0, 1, 2, 3, 5, 7, 11, 15],
                   help="tree nodes n under the root (the forward takes n + 1 tokens)")
    p.add_argument("--prefix", type=int, default=256, help="cached tokens before the root")
    p.add_argument("--repeats", type=int, default=10)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.target is None:
        from opttree.smollm2 import load_smollm2

        target, _ = load_smollm2()
    else:
        from transformers import AutoModelForCausalLM

        target = AutoModelForCausalLM.from_pretrained(args.target, attn_implementation="sdpa")
    target.eval()
    saved = os.environ.get("OPTTREE_WEIGHT_MAJOR")
    try:
        rows = {mode: verify_ms(target, args.sizes, args.prefix, args.repeats, mode) for mode in MODES}
    finally:
        if saved is None:
            os.environ.pop("OPTTREE_WEIGHT_MAJOR", None)
        else:
            os.environ["OPTTREE_WEIGHT_MAJOR"] = saved
    print(f"{platform.processor() or platform.machine()}, torch {torch.__version__}, {args.threads} thread(s), "
          f"{type(target).__name__}, {args.prefix}-token prefix, median of {args.repeats}; ms per forward")
    print()
    print("| tokens | " + " | ".join(str(n + 1) for n in args.sizes) + " |")
    print("|---|" + "---|" * len(args.sizes))
    for mode in MODES:
        print(f"| `{mode}` | " + " | ".join(f"{ms:.1f}" for ms in rows[mode]) + " |")
    chosen = fast_linear.decisions()
    stock = sorted(key for key, faster in chosen.items() if not faster)
    print()
    print(f"auto: weight-major kept for {len(chosen) - len(stock)} of {len(chosen)} (rows, out, in) shapes; "
          f"F.linear for {stock if stock else 'none'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
