"""Seeded sampling repeats under ``nodes="auto"``: the same call with the same ``generator=`` (or
``torch.manual_seed``) gives the same tokens, for one prompt and for a batch, on every way in.

The rule (DESIGN.md, *Seeded sampling repeats*): a sampled call's trees are a function of its inputs and
the pair's calibration alone. Its ``"auto"`` policy plans from a copy of the calibration as measured
(not from what earlier calls refreshed), prices the drafting time so far by that model (not by the
clock), and learns within the call only from acceptances (deterministic given the draws). Greedy calls
keep learning from timings: their output does not depend on the tree.

The machine is made to matter: the pair's calibration is a CPU-like one (verification cost grows with
the tree, so the tree size is a real decision) and the clock jitters. Negative control: before the
rule, the batch's 8 repeats gave several outputs (the live latency model, refreshed by every call, grew
different trees, and a batch's rows draw from one generator in an order that depends on how many
tokens each row accepted).
"""

from __future__ import annotations

import random
import time

import pytest
import torch

from models import partly_agreeing, peaked, tiny_model
from opttree import SpeculativeGenerator, speculative, speculative_generate
from opttree.budget import calibration
from opttree.budget.latency import LatencyModel, LatencyTable, complete_table
from opttree.budget.timing import VERIFY_NODES

REPEATS = 8
CPU_LIKE = {0: 0.060, 1: 0.061, 3: 0.062, 7: 0.066, 15: 0.075, 31: 0.095, 63: 0.140}


def cpu_like_measure(*args, **kwargs) -> LatencyModel:
    """What calibration would measure on a slow CPU: T(n) grows with n, a draft layer costs 5 ms."""
    sizes = tuple(n for n in VERIFY_NODES if n in CPU_LIKE)
    return LatencyModel(verify=complete_table(LatencyTable(sizes, tuple(CPU_LIKE[n] for n in sizes)),
                                                          VERIFY_NODES),
                        verify_measured=frozenset(sizes), layer=LatencyTable((1, 8), (0.004, 0.006)),
                        root_seconds=0.005)


@pytest.fixture
def cpu_like_machine(monkeypatch):
    """A CPU-like calibration for every pair, and a clock that jitters by a few milliseconds a read."""
    calibration.clear_calibrations()
    monkeypatch.setenv("OPTTREE_CALIBRATION", "off")
    monkeypatch.setattr(calibration, "measure", cpu_like_measure)
    real, extra, rng = time.perf_counter, [0.0], random.Random(0)

    def jittery() -> float:
        extra[0] += rng.expovariate(1 / 0.003)
        return real() + extra[0]

    monkeypatch.setattr(time, "perf_counter", jittery)
    yield
    calibration.clear_calibrations()


@pytest.fixture(scope="module")
def pair():
    target = peaked(tiny_model("llama", seed=0), scale=10.0)
    return target, partly_agreeing(target, 0.3)


def prompts(rows: int) -> torch.Tensor:  # [rows, 8] long
    return torch.randint(3, 90, (rows, 8), generator=torch.Generator().manual_seed(rows))


def run(way: str, target, draft, ids: torch.Tensor, seed: int, **kw) -> tuple:
    """One seeded sampled call with default tree arguments on ``way``; its tokens as nested tuples."""
    args = dict(do_sample=True, max_new_tokens=40, attention_mask=torch.ones_like(ids), **kw)
    generator = torch.Generator().manual_seed(seed)
    if way == "speculative":
        out = speculative(target).generate(ids, draft_model=draft, generator=generator, **args)
    elif way == "generator":
        out = SpeculativeGenerator(target, draft, generator=generator).generate(ids, **args)
    elif way == "custom_generate":
        out = target.generate(ids, custom_generate=speculative_generate, draft_model=draft, generator=generator,
                              **args)
    else:  # torch.manual_seed, no generator object
        torch.manual_seed(seed)
        out = target.generate(ids, custom_generate=speculative_generate, draft_model=draft, **args)
    return tuple(map(tuple, out.tolist()))


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("way", ["speculative", "generator", "custom_generate", "manual_seed"])
def test_a_seeded_sampled_call_under_auto_repeats(cpu_like_machine, pair, way, rows):
    target, draft = pair
    ids = prompts(rows)
    outputs = {run(way, target, draft, ids, seed=7) for _ in range(REPEATS)}
    assert len(outputs) == 1, f"{len(outputs)} distinct outputs in {REPEATS} repeats"


def test_greedy_calls_between_sampled_ones_change_nothing(cpu_like_machine, pair):
    """Greedy calls refresh the pair's live latency model (their trees follow it); a sampled call plans
    from the calibration as measured, so what ran before it does not matter."""
    target, draft = pair
    ids = prompts(3)
    first = run("custom_generate", target, draft, ids, seed=11)
    for _ in range(3):
        target.generate(ids, custom_generate=speculative_generate, draft_model=draft, do_sample=False,
                        max_new_tokens=40, attention_mask=torch.ones_like(ids))
    assert run("custom_generate", target, draft, ids, seed=11) == first


def test_other_seeds_give_other_outputs(cpu_like_machine, pair):
    """Control: the repeats are not one fixed output whatever the seed (sampling happens)."""
    target, draft = pair
    ids = prompts(3)
    assert len({run("custom_generate", target, draft, ids, seed=s) for s in range(4)}) > 1


def test_the_calls_trees_follow_the_machine(cpu_like_machine, pair):
    """The tree is still the measured policy's: on this CPU-like machine the sampled call's trees are
    smaller than the 63-node budget and vary from step to step (an "auto" tree, not a fixed one)."""
    target, draft = pair
    ids = prompts(1)
    out = target.generate(ids, custom_generate=speculative_generate, draft_model=draft, do_sample=True,
                          generator=torch.Generator().manual_seed(3), max_new_tokens=40,
                          return_dict_in_generate=True)
    sizes = [step.tree_size for step in out.stats.steps]
    assert max(sizes) < 63 and len(set(sizes)) > 1, sizes
