"""Host work per decoding step OUTSIDE the model forwards: aten ops, host reads, host ms.

A tiny peaked Llama pair (random weights, output rows scaled so that the draft's q is sharp and
trees grow deep, as a good draft's would) decodes with each drafter, greedy and sampled, for
every node budget × max_depth; :class:`opttree.tools.overhead.OverheadCounter` counts the span between
consecutive verify forwards. Ops and reads are deterministic (pinned in tests/test_overhead.py):
they are counted with torch's own linears (``OPTTREE_LINEAR=stock``), because ``auto`` picks each
shape's CPU kernel by timing it, and the kernels differ in ops (a feature head's output rows are a
direct ``linears.linear`` call, outside any module's forward); host ms depends on the machine and
its load, and is timed with the kernels as users get them.

    .venv/bin/python benchmarks/overhead.py                  # the whole grid
    .venv/bin/python benchmarks/overhead.py --nodes 60 --depths 10 --drafters model
    .venv/bin/python benchmarks/overhead.py --nodes 60 --depths 10 --timed-runs 7   # host ms: median (range) of 7 runs
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from models import peaked, tiny_model  # noqa: E402  (tests/models.py: tiny random models)

from opttree import SpeculativeGenerator  # noqa: E402
from opttree.distill.train.head import new_head  # noqa: E402
from opttree.tools.overhead import OverheadCounter, StepCounts  # noqa: E402

PROMPT = torch.tensor([[5, 17, 33, 2, 41, 8, 19, 60]])


def tiny_pair(seed: int = 0):
    """A peaked tiny Llama target and a draft that is its exact copy (it agrees everywhere)."""
    target = peaked(tiny_model("llama", seed=seed), 300)
    return target, copy.deepcopy(target)


def make_draft(kind: str, target, draft):
    if kind == "model":
        return draft, [draft]
    if kind == "head":
        head, _ = new_head(target)
        return head, [head]
    if kind == "lookup":
        return "prompt_lookup", []
    raise KeyError(kind)


@contextmanager
def stock_linears():
    """OPTTREE_LINEAR=stock inside the block (what a GPU runs: the CPU kernels are CPU-only), as it was after."""
    saved = os.environ.get("OPTTREE_LINEAR")
    os.environ["OPTTREE_LINEAR"] = "stock"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("OPTTREE_LINEAR", None)
        else:
            os.environ["OPTTREE_LINEAR"] = saved


def measure(kind: str, nodes: int, depth: int, sample: bool, new_tokens: int = 120, seed: int = 0) -> tuple[StepCounts, float]:
    """(mean counts per step, mean tree depth) for one set-up; host ms from a second, uncounted run."""
    target, draft = tiny_pair(seed)
    draft_model, modules = make_draft(kind, target, draft)
    gen = SpeculativeGenerator(target, draft_model, nodes=nodes, threshold=0.5, max_depth=depth)
    kwargs = dict(do_sample=True, top_k=0, generator=torch.Generator().manual_seed(seed)) if sample else {}
    with stock_linears():
        gen.generate(PROMPT, max_new_tokens=8, **kwargs)  # warm-up: lazy inits are not steps
        with OverheadCounter(target, *modules) as counter:
            gen.generate(PROMPT, max_new_tokens=new_tokens, **kwargs)
    steps = gen.last_stats.steps
    if sample:
        kwargs["generator"] = torch.Generator().manual_seed(seed)
    with OverheadCounter(target, *modules, count=False) as clock:
        gen.generate(PROMPT, max_new_tokens=new_tokens, **kwargs)
    counts = counter.mean()
    counts.host_ms = clock.mean().host_ms
    return counts, sum(s.tree_depth for s in steps) / max(len(steps), 1)


def host_ms_samples(kind: str, nodes: int, depth: int, sample: bool, runs: int, new_tokens: int = 120,
                    seed: int = 0) -> list[float]:
    """Mean host ms per step of each of ``runs`` uncounted runs of one set-up (after a warm-up):
    on a shared machine one run can be off by a third."""
    target, draft = tiny_pair(seed)
    draft_model, modules = make_draft(kind, target, draft)
    gen = SpeculativeGenerator(target, draft_model, nodes=nodes, threshold=0.5, max_depth=depth)

    def kwargs():
        return dict(do_sample=True, top_k=0, generator=torch.Generator().manual_seed(seed)) if sample else {}

    gen.generate(PROMPT, max_new_tokens=8, **kwargs())
    samples = []
    for _ in range(runs):
        with OverheadCounter(target, *modules, count=False) as clock:
            gen.generate(PROMPT, max_new_tokens=new_tokens, **kwargs())
        samples.append(clock.mean().host_ms)
    return samples


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[8, 16, 60, 128])
    parser.add_argument("--depths", type=int, nargs="+", default=[4, 10])
    parser.add_argument("--drafters", nargs="+", default=["model", "head", "lookup"], choices=["model", "head", "lookup"])
    parser.add_argument("--modes", nargs="+", default=["greedy", "sampled"], choices=["greedy", "sampled"])
    parser.add_argument("--timed-runs", type=int, default=1, help="host ms as the median (and range) of this many runs")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread; per step, outside the forwards")
    print("| drafter | decoding | nodes | max_depth | depth reached | aten ops | of which kernels | host reads | host ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for kind in args.drafters:
        for mode in args.modes:
            for depth in args.depths:
                for nodes in args.nodes:
                    counts, reached = measure(kind, nodes, depth, mode == "sampled")
                    host = f"{counts.host_ms:.1f}"
                    if args.timed_runs > 1:
                        ms = host_ms_samples(kind, nodes, depth, mode == "sampled", args.timed_runs)
                        host = f"{statistics.median(ms):.1f} ({min(ms):.1f}–{max(ms):.1f})"
                    print(f"| {kind} | {mode} | {nodes} | {depth} | {reached:.1f} | {counts.ops:.0f} | "
                          f"{counts.kernels:.0f} | {counts.reads:.0f} | {host} |", flush=True)


if __name__ == "__main__":
    main()
