"""Which linear kernel pays on this machine (``opttree.kernels.linears``)?

Two views, both printed as markdown tables with the machine's name:

* forwards (default): one verification forward of the target over each padded size (the root and a
  tree, ``opttree.budget.timing.VerifyRig``) with every kernel fixed in turn
  (``OPTTREE_LINEAR=stock``, ``weight_major``, ``onednn``, ``onednn_pad``) and with ``auto``, timed once
  its choices are final, re-check included (summarised below the table);
* ``--products``: each distinct linear shape of the target alone, per row count, for every kernel
  and for MKL's packed GEMM (``torch.ops.mkl._mkl_linear``, one packed copy per row count) and
  numpy's BLAS (OpenBLAS in numpy's wheels; ``x @ W.T`` on the tensors' own memory, no copy):
  no runtime candidates, measured here so that the choice stays a measurement. The weights cycle
  through copies larger than the CPU's caches, so they come from memory as in decoding.

Usage::

    python benchmarks/kernel.py                       # SmolLM2-135M-Instruct, fetched as the demo does
    python benchmarks/kernel.py --products --threads 2
    python benchmarks/kernel.py --random-weights      # SmolLM2-135M's shapes, random weights (no download)
    python benchmarks/kernel.py --products --target smollm2:1b   # the shapes of SmolLM2 inflated to a 1 B's cost
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections import Counter

import torch

from opttree.budget import timing
from opttree.kernels import linears
from opttree.loading.machine import bf16_flags, cpu_model

MODES = ("stock", "weight_major", "onednn", "onednn_pad", "auto")


def verify_ms(target, sizes: list[int], prefix: int, repeats: int, mode: str) -> list[float]:
    """Median ms of a verification over 1 + n rows for each n in ``sizes``, under kernel ``mode``
    (``auto``: timed once every choice is final, its re-check included, at most 40 rounds of warm-up)."""
    os.environ["OPTTREE_LINEAR"] = mode
    linears.forget_decisions()
    with linears.fast_linears(target):
        rig = timing.VerifyRig(target, prefix)
        warm = 0
        while warm == 0 or (mode == "auto" and not linears.settled() and warm < 40):
            for n in sizes:
                rig.run(n)
            warm += 1
        times = {n: [] for n in sizes}
        for _ in range(repeats):
            for n in sizes:
                times[n].append(rig.run(n))
    return [1000 * statistics.median(times[n]) for n in sizes]


def product_us(out: int, inn: int, rows: int, dtype: torch.dtype, kernel: str, budget: float = 96e6) -> float:
    """Median µs of one ``rows`` x ``inn`` -> ``out`` product by ``kernel``, the weight cycling through
    copies that together exceed ``budget`` bytes (so it comes from memory)."""
    size = out * inn * torch.finfo(dtype).bits // 8
    weights = [(torch.randn(out, inn) * 0.02).to(dtype) for _ in range(max(1, min(256, int(budget // size))))]
    x = torch.randn(rows, inn).to(dtype)
    if kernel == "mkl_packed":
        packed = [(torch.ops.mkl._mkl_reorder_linear_weight(w, rows), w) for w in weights]
        call = lambda p: torch.ops.mkl._mkl_linear(x, p[0], p[1], None, rows)  # noqa: E731
        items = packed
    elif kernel == "numpy":
        xs = x.numpy()
        call = lambda w: xs @ w.T  # noqa: E731  (numpy's BLAS on the same memory)
        items = [w.numpy() for w in weights]
    else:
        os.environ["OPTTREE_LINEAR"] = kernel
        call = lambda w: linears.fast_linear(x, w, None, auto=False, kernel=kernel)  # noqa: E731
        items = weights
    call(items[0])
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for item in items:
            call(item)
        times.append((time.perf_counter() - start) / len(items))
    return 1e6 * statistics.median(times)


def load(args):
    if args.target is not None and ":" in args.target:  # a stand-in, as opttree bench names it
        from opttree.bench.models import load_target

        return load_target(args.target, getattr(torch, args.dtype))[0].eval()
    if args.random_weights:
        from opttree.smollm2 import random_smollm2

        return random_smollm2()
    if args.target is None:
        from opttree.smollm2 import load_smollm2

        return load_smollm2()[0].eval()
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(args.target, attn_implementation="sdpa").eval()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default=None, help="model folder, or smollm2:1b / smollm2:7b (SmolLM2 inflated to "
                                                  "that cost); default: SmolLM2-135M-Instruct, fetched")
    p.add_argument("--random-weights", action="store_true", help="SmolLM2-135M's config with random weights")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--sizes", type=int, nargs="+", default=[0, 1, 3, 7, 15, 31, 63],
                   help="tree nodes n under the root (the forward takes n + 1 rows)")
    p.add_argument("--prefix", type=int, default=256, help="cached tokens before the root")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--products", action="store_true", help="time each linear shape alone instead")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    target = load(args).to(dtype)
    saved = os.environ.get("OPTTREE_LINEAR")
    print(f"{cpu_model()} ({', '.join(bf16_flags()) or 'no AVX-512/AMX'}), torch {torch.__version__}, "
          f"{args.threads} thread(s), {type(target).__name__} {args.dtype}")
    print()
    try:
        if args.products:
            shapes = sorted(Counter(tuple(m.weight.shape) for m in target.modules()
                                    if isinstance(m, torch.nn.Linear)).items())
            kernels = [k for k in linears.KERNELS if k in linears.candidates(dtype, rows=1)]
            kernels += ["mkl_packed", "numpy"] if dtype == torch.float32 else []
            rows = [n + 1 for n in args.sizes]
            print("µs per product (weights from memory), median of 5 passes")
            print()
            print("| out × in (count) | rows | " + " | ".join(kernels) + " |")
            print("|---|---|" + "---|" * len(kernels))
            for (out, inn), count in shapes:
                for r in rows:
                    print(f"| {out} × {inn} ({count}) | {r} | "
                          + " | ".join(f"{product_us(out, inn, r, dtype, k):.0f}" for k in kernels) + " |", flush=True)
            return 0
        table = {mode: verify_ms(target, args.sizes, args.prefix, args.repeats, mode) for mode in MODES}
    finally:
        if saved is None:
            os.environ.pop("OPTTREE_LINEAR", None)
        else:
            os.environ["OPTTREE_LINEAR"] = saved
    print(f"ms per verification forward, {args.prefix}-token prefix, median of {args.repeats}")
    print()
    print("| rows | " + " | ".join(str(n + 1) for n in args.sizes) + " |")
    print("|---|" + "---|" * len(args.sizes))
    for mode in MODES:
        print(f"| `{mode}` | " + " | ".join(f"{ms:.1f}" for ms in table[mode]) + " |")
    chosen = Counter(linears.decisions().values())
    print()
    print("auto kept: " + ", ".join(f"{kernel} for {n} shapes" for kernel, n in chosen.most_common()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
