"""T(n): the target's verification forward over each fixed size, against the time to stream its weights.

What decides whether big trees pay on a machine: a forward over a few rows streams every weight
from memory once, so T(1) cannot beat the weights' stream time, and while the arithmetic hides
behind the stream T(n) stays flat. This prints, from ONE run (so the same load):

* the stream time: every weight of the target read once (``torch.sum`` of each, median of rounds),
  its bytes and the bandwidth;
* T(rows) for each verification size (:data:`opttree.tree.sizes.VERIFY_SIZES` up to ``--max-rows``),
  the sizes taking turns within each round, eager, stock and kernels taking turns forward by forward
  on one cache (a shared machine's speed drifts over minutes: timed one block after the other,
  the later block reads slower whatever its kernels; benchmarks/RESULTS.md, *Flat verification*):
  - ``stock``: torch's own linears (plain decoding as users run it);
  - ``kernels``: opttree's linears (``opttree.kernels.linears``, ``auto``: each shape's fastest kernel,
    timed after a warm-up that lasts until every choice is final, its re-check included);
  - ``kernels ÷ stock``: the median over rounds of each round's kernels forward ÷ the stock forward
    beside it (a pair run seconds apart: the machine's drift, which moves a forward by 2x over
    minutes on a shared VM, cancels in it; the ratio of the two medians would keep it);
  - ``kernels' linears alone``: those linears on random rows, back to back, without the rest of the
    forward (what is above it is the framework: norms, attention, rotary, the cache, Python);
* with ``--compile``: the same forwards over a StaticCache through ``torch.compile`` (static shapes,
  one graph per size; ``--freezing`` adds Inductor's freezing for that compile), the first call's
  compile time per size and T(rows) after it; run it again for what a warm on-disk cache
  (Inductor's FX graph cache) brings the first call down to;
* T(16) / T(1) (how flat verification is) and T(1) / stream time (how close one row is to reading the weights once).

    .venv/bin/python benchmarks/verify_cost.py --threads 2                 # SmolLM2-135M, float32
    .venv/bin/python benchmarks/verify_cost.py --random-weights --compile  # its shapes, random weights
    .venv/bin/python benchmarks/verify_cost.py --target smollm2:1b         # SmolLM2 at a 1 B model's cost
    python benchmarks/verify_cost.py --device cuda --random-weights --dtype bfloat16 --compile  # a GPU

On ``--device cuda`` the CPU kernels' rows are left out (they are CPU kernels), the times are CUDA
events around each forward, and ``--compile`` compiles as generate() does on a GPU: a StaticCache
and ``mode="reduce-overhead"`` (CUDA graphs, one per size). ``--llama-1b`` times a 1.2 B-parameter
Llama of random weights too (hidden 2048, 16 layers), where a GPU's flat region shows better.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

PREFIX = 256


def stream_ms(model, rounds: int = 7) -> tuple[float, int]:
    """Median ms to read every distinct weight of ``model`` once (on CUDA: timed with CUDA events),
    and their bytes."""
    params = list({p.data_ptr(): p for p in model.parameters()}.values())
    size = sum(p.numel() * p.element_size() for p in params)
    cuda = params[0].is_cuda
    times = []
    with torch.inference_mode():
        for _ in range(rounds):
            if cuda:
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                begin.record()
            start = time.perf_counter()
            for p in params:
                p.sum()
            if cuda:
                end.record()
                torch.cuda.synchronize()
                times.append(begin.elapsed_time(end) / 1e3)
            else:
                times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times), size


WARM_ROUNDS = 40  # at most, rounds over the sizes until every key's kernel is final (linears.settled)


def eager_ms(model, rows: list[int], repeats: int) -> tuple[dict[str, list[float]], int]:
    """({"stock": ms per size, "kernels": ms per size, "kernels ÷ stock": the median of each round's
    ratio per size}, warm-up rounds): median ms of a verification
    forward of each size in ``rows``, stock's linears and opttree's (``auto``) taking turns forward by
    forward on one cache (the first of the pair alternating), the sizes in turn within each round: a
    machine whose speed drifts over minutes slows both alike. First the kernels' warm-up: rounds
    over the sizes until every key has its final kernel (its first trials and its re-check)."""
    from opttree.budget import timing
    from opttree.kernels import linears

    os.environ["OPTTREE_LINEAR"] = "auto"
    linears.forget_decisions()
    rig = timing.VerifyRig(model, PREFIX)
    nodes = [r - 1 for r in rows]
    for n in nodes:
        rig.run(n)
    warm = 0
    with linears.fast_linears(model):
        while warm < WARM_ROUNDS and (warm == 0 or not linears.settled()):
            for n in nodes:
                rig.run(n)
            warm += 1
    times = {"stock": {n: [] for n in nodes}, "kernels": {n: [] for n in nodes}}
    for round_ in range(repeats):
        for i, n in enumerate(nodes):
            pair = ("stock", "kernels") if (round_ + i) % 2 == 0 else ("kernels", "stock")
            for name in pair:
                with linears.fast_linears(model, on=name == "kernels"):
                    times[name][n].append(rig.run(n))
    table = {name: [1e3 * statistics.median(t[n]) for n in nodes] for name, t in times.items()}
    # each round's kernels forward over the stock forward it ran beside: the machine's drift cancels in the pair
    table["kernels ÷ stock"] = [statistics.median(k / s for k, s in zip(times["kernels"][n], times["stock"][n]))
                                for n in nodes]
    return table, warm


def kept(rows: list[int]) -> str:
    """What auto kept per row count: "1: stock 5; 4: onednn 4, stock 1; ..."."""
    from collections import Counter

    from opttree.kernels import linears

    chosen = linears.decisions()
    return "; ".join(f"{r}: " + ", ".join(f"{k} {c}" for k, c in Counter(
        name for key, name in chosen.items() if key[2] == r).most_common()) for r in rows)


def linears_ms(model, rows: list[int], repeats: int) -> list[float]:
    """Median ms of every linear of ``model`` on random [rows, in] inputs, back to back in module
    order, through opttree's kernels (after eager_ms let them choose): the forward's linear part."""
    from opttree.kernels import linears

    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    out = []
    with torch.inference_mode(), linears.fast_linears(model):
        for r in rows:
            xs = [torch.randn(r, m.in_features).to(m.weight.dtype) for m in layers]
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                for m, x in zip(layers, xs):
                    m(x)
                times.append(time.perf_counter() - start)
            out.append(1e3 * statistics.median(times))
    return out


def compiled_ms(model, rows: list[int], repeats: int, freezing: bool) -> tuple[list[float], list[float]]:
    """(first-call seconds, median ms after it) of each size through torch.compile over a StaticCache;
    the cache's count is set back after every forward (else the writes run off its end)."""
    from transformers import StaticCache

    from opttree.hf import kv_cache
    from opttree.hf.compat import with_cache
    from opttree.tree import DraftTree
    from opttree.tree.masks import verification_inputs

    vocab = model.config.vocab_size
    length = PREFIX + max(rows)
    cache = StaticCache(config=model.config, max_cache_len=length)
    options = {"freezing": True} if freezing else {}
    forward = torch.compile(model.__call__, dynamic=False, options=options)
    first, after = [], []
    with torch.no_grad():
        model(input_ids=(torch.arange(PREFIX) * 7 % vocab)[None], **with_cache(model, cache), use_cache=True,
              logits_to_keep=1)
        for r in rows:
            tree = DraftTree(torch.arange(r - 1) % vocab, torch.full((r - 1,), -1), torch.ones(r - 1))
            inputs = verification_inputs(1, tree, PREFIX, model.dtype, size=r, kv_len=length).as_kwargs()
            call = dict(**inputs, **with_cache(model, cache), use_cache=True, logits_to_keep=0)
            start = time.perf_counter()
            forward(**call)
            first.append(time.perf_counter() - start)
            kv_cache.rewind(cache, PREFIX)
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                forward(**call)
                times.append(time.perf_counter() - start)
                kv_cache.rewind(cache, PREFIX)
            after.append(1e3 * statistics.median(times))
    return first, after


def llama_1b(seed: int = 0):
    """A Llama of ~1.2 B parameters (hidden 2048, 16 layers, SmolLM2's vocabulary), random weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=49152, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                         num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                         tie_word_embeddings=True)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def cuda_ms(model, rows: list[int], repeats: int, mode: str | None) -> tuple[list[float], list[float]]:
    """(first-call seconds, median ms after it) of a verification forward of each size on CUDA, over a
    StaticCache; ``mode``: None eager, else torch.compile's mode (generate()'s is "reduce-overhead")."""
    from transformers import StaticCache

    from opttree.hf import kv_cache
    from opttree.hf.compat import with_cache
    from opttree.tree import DraftTree
    from opttree.tree.masks import verification_inputs

    device, vocab = model.device, model.config.vocab_size
    length = PREFIX + max(rows)
    cache = StaticCache(config=model.config, max_cache_len=length)
    forward = model.__call__ if mode is None else torch.compile(model.__call__, dynamic=False, mode=mode)
    first, after = [], []
    with torch.no_grad():
        model(input_ids=(torch.arange(PREFIX, device=device) * 7 % vocab)[None], **with_cache(model, cache),
              use_cache=True, logits_to_keep=1)
        for r in rows:
            tree = DraftTree(torch.arange(r - 1, device=device) % vocab, torch.full((r - 1,), -1, device=device),
                             torch.ones(r - 1, device=device))
            inputs = verification_inputs(1, tree, PREFIX, model.dtype, size=r, kv_len=length).as_kwargs()
            call = dict(**inputs, **with_cache(model, cache), use_cache=True, logits_to_keep=0)
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(3):  # reduce-overhead records its graph on a later call than the first
                forward(**call)
                kv_cache.rewind(cache, PREFIX)
            torch.cuda.synchronize()
            first.append(time.perf_counter() - start)
            times = []
            for _ in range(repeats):
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                begin.record()
                forward(**call)
                end.record()
                torch.cuda.synchronize()
                times.append(begin.elapsed_time(end))
                kv_cache.rewind(cache, PREFIX)
            after.append(statistics.median(times))
    return first, after


def cuda_main(args, rows: list[int]) -> None:
    """The table on CUDA: eager and (with --compile) reduce-overhead, per model."""
    models = {"SmolLM2-135M shapes": "smollm2"} if args.random_weights else {"SmolLM2-135M": "real"}
    if args.llama_1b:
        models["Llama 1.2 B shapes"] = "1b"
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, {args.dtype}, {PREFIX}-token prefix, "
          f"median of {args.repeats} (CUDA events)")
    for title, kind in models.items():
        model = (llama_1b() if kind == "1b" else load(args)).to("cuda", getattr(torch, args.dtype))
        stream, size = stream_ms(model)
        table = {"eager": cuda_ms(model, rows, args.repeats, None)[1]}
        first = None
        if args.compile:
            first, table["compiled (reduce-overhead)"] = cuda_ms(model, rows, args.repeats, "reduce-overhead")
        print()
        print(f"{title}: weights {size / 1e6:.0f} MB read in {stream:.2f} ms ({size / stream / 1e6:.0f} GB/s)")
        print("| ms | " + " | ".join(str(r) for r in rows) + " | T(16)/T(1) | T(1)/stream |")
        print("|---|" + "---|" * (len(rows) + 2))
        for name, ms in table.items():
            t1, t16 = ms[rows.index(1)], ms[rows.index(16)] if 16 in rows else float("nan")
            print(f"| {name} | " + " | ".join(f"{m:.2f}" for m in ms) + f" | {t16 / t1:.2f} | {t1 / stream:.2f} |")
        if first is not None:
            print("first three calls (compile, graph capture) per size, s: "
                  + ", ".join(f"{r}: {s:.0f}" for r, s in zip(rows, first)))
        del model
        torch.cuda.empty_cache()


def load(args):
    if args.target:
        from opttree.bench.models import load_target

        return load_target(args.target, getattr(torch, args.dtype), args.device)[0].eval()
    if args.random_weights:
        from opttree.smollm2 import random_smollm2

        return random_smollm2()
    from opttree.smollm2 import load_smollm2

    return load_smollm2()[0].eval()


def main(argv=None) -> None:
    from opttree.kernels import linears
    from opttree.loading.machine import bf16_flags, cpu_model
    from opttree.tree.sizes import VERIFY_SIZES

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--max-rows", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--random-weights", action="store_true", help="SmolLM2-135M's config, random weights")
    parser.add_argument("--target", default=None,
                        help="a target as opttree bench names it, e.g. smollm2:1b (SmolLM2 inflated to a 1 B's cost)")
    parser.add_argument("--compile", action="store_true", help="also torch.compile over a StaticCache")
    parser.add_argument("--freezing", action="store_true", help="with --compile: Inductor's freezing")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--llama-1b", action="store_true", help="on cuda: a 1.2 B Llama of random weights too")
    parser.add_argument("--sizes", help="comma-separated row counts instead of VERIFY_SIZES up to --max-rows")
    args = parser.parse_args(argv)
    if args.device == "cuda":
        cuda_main(args, [int(r) for r in args.sizes.split(",")] if args.sizes
                  else [r for r in VERIFY_SIZES if r <= args.max_rows])
        return
    torch.set_num_threads(args.threads)
    model = load(args).to(getattr(torch, args.dtype))
    rows = [int(r) for r in args.sizes.split(",")] if args.sizes else [r for r in VERIFY_SIZES if r <= args.max_rows]
    saved = os.environ.get("OPTTREE_LINEAR")
    try:
        stream, size = stream_ms(model)
        table, warm = eager_ms(model, rows, args.repeats)
        settled = linears.settled()
        table["kernels' linears alone"] = linears_ms(model, rows, args.repeats)
        compiled = compiled_ms(model, rows, args.repeats, args.freezing) if args.compile else None
        stream_again, _ = stream_ms(model)
    finally:
        if saved is None:
            os.environ.pop("OPTTREE_LINEAR", None)
        else:
            os.environ["OPTTREE_LINEAR"] = saved
    print(f"{cpu_model()} ({', '.join(bf16_flags()) or 'no AVX-512/AMX'}), torch {torch.__version__}, "
          f"{args.threads} thread(s), {args.dtype}, {PREFIX}-token prefix, median of {args.repeats}; "
          f"stock and kernels take turns forward by forward")
    print(f"weights: {size / 1e6:.0f} MB read in {stream:.1f} ms ({size / stream / 1e6:.1f} GB/s; "
          f"{stream_again:.1f} ms at the end)")
    print(f"the kernels' warm-up: {warm} round(s) over the sizes, "
          + ("every kernel final" if settled else "NOT every kernel final yet") + f"; kept per row count: {kept(rows)}")
    print()
    print("| ms | " + " | ".join(str(r) for r in rows) + " | T(16)/T(1) | T(1)/stream |")
    print("|---|" + "---|" * (len(rows) + 2))
    if compiled is not None:
        table["compiled" + (" + freezing" if args.freezing else "")] = compiled[1]
    for name, ms in table.items():
        if name == "kernels ÷ stock":
            print(f"| {name} | " + " | ".join(f"{m:.2f}" for m in ms) + " | | |")
            continue
        t1, t16 = ms[rows.index(1)], ms[rows.index(16)] if 16 in rows else float("nan")
        print(f"| {name} | " + " | ".join(f"{m:.1f}" for m in ms) + f" | {t16 / t1:.2f} | {t1 / stream:.2f} |")
    if compiled is not None:
        print()
        print("first call (compile) per size, s: " + ", ".join(f"{r}: {s:.0f}" for r, s in zip(rows, compiled[0])))


if __name__ == "__main__":
    main()
