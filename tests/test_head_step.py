"""One head step (drafters/head/graph.py): the eager drafter and the compiled one run the same
``head_step`` on the same fixed buffers, compiling a switch, so at the same width their q is
BIT-equal (not merely close), for opttree's own head and an EAGLE-3 head: the root, tree layers of
widths 4, 2 and 1 (which the compiled drafter does not pad), a commit and the next step's catch-up.
A padded width runs the GEMMs on more rows, where a CPU may pick another kernel: there the q agree
to rounding (tests/test_compiled_draft.py). Greedy output equals plain generate() either way.
Negative control: a drafter one position off is caught by the same comparison."""

import pytest
import torch

import opttree
from eagle_folders import target_for, write_eagle3
from models import peaked, tiny_model
from opttree import speculative_generate
from opttree.distill.train.head import new_head
from opttree.drafters.head.drafter import FeatureHeadDrafter
from opttree.drafters.head.graph import HeadSteps
from opttree.tree import DraftTree
from test_compiled_draft import forced
from test_feature_head import OffByOne, prompt, randomised
from test_house import PACKAGE, long_functions


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield


def feature_pair(layers: int):
    target = peaked(tiny_model("llama", seed=0), scale=30.0)
    return target, randomised(new_head(target, num_layers=layers)[0], seed=3)


def eagle3_pair(tmp_path):
    target = target_for("llama")
    return target, opttree.load_draft(write_eagle3(tmp_path / "head", target), target)


def pairs(kind, tmp_path):
    return eagle3_pair(tmp_path) if kind == "eagle3" else feature_pair(int(kind[-1]))


def fed(drafter, target, ids):
    """``drafter`` given the target's features of ``ids`` [1, T] but the last; -> the root's q [V]."""
    with torch.no_grad():
        states = target(ids[:, :-1], output_hidden_states=True).hidden_states
    drafter.add_features(drafter.features_from(states))
    return drafter.root_probs(ids[0])


def qs(drafter, target, ids) -> list[torch.Tensor]:
    """Every q the drafter gives over two steps: root, three tree layers (widths 4, 2, 1), a commit of
    a path and the next step's catch-up root (2 tokens) and first layer (width 2)."""
    out = [fed(drafter, target, ids)]
    pool = DraftTree(torch.tensor([5, 6, 7, 8, 9, 10, 11, 12]), torch.tensor([-1, -1, -1, -1, 0, 0, 1, 4]),
                     torch.ones(8))
    for frontier in ([0, 1, 2, 3], [4, 5], [7]):
        out.append(drafter.expand(pool, torch.tensor(frontier)))
    drafter.commit([0])
    sequence = torch.cat([ids[0], pool.tokens[[0]], torch.tensor([40])])
    with torch.no_grad():
        states = target(sequence[None, :-1], output_hidden_states=True).hidden_states
    drafter.add_features(drafter.features_from(states)[-2:])
    out.append(drafter.root_probs(sequence))
    out.append(drafter.expand(pool, torch.tensor([0, 1])))
    return out


@pytest.mark.parametrize("kind", ["feature1", "feature2", "eagle3"])
def test_the_eager_and_the_compiled_drafter_give_bit_equal_q(kind, tmp_path):
    target, head = pairs(kind, tmp_path)
    ids = prompt(2)
    eager = head.for_target(target)
    compiled = head.for_target(target).compiled(forced(), 64)
    assert not eager.steps.compiles and compiled.steps.compiles
    assert eager.buffers.slots == compiled.buffers.slots  # the same buffers' size: the same attention
    for i, (a, b) in enumerate(zip(qs(eager, target, ids), qs(compiled, target, ids))):
        assert torch.equal(a, b), (i, (a - b).abs().max())


def test_a_drafter_one_position_off_is_caught_by_the_bit_comparison():
    """Negative control: the comparison above sees a tree node's position."""
    target, head = feature_pair(1)
    ids = prompt(2)
    right = qs(head.for_target(target), target, ids)
    compiled = head.for_target(target).compiled(forced(), 64)
    wrong = qs(OffByOne(head, None, compiled.steps, compiled.buffers.slots), target, ids)
    assert torch.equal(right[0], wrong[0])  # the root has no tree position
    assert not any(torch.equal(a, b) for a, b in zip(right[1:4], wrong[1:4]))


@pytest.mark.parametrize("kind", ["feature1", "eagle3"])
def test_every_forward_of_either_drafter_is_the_one_step(kind, tmp_path, monkeypatch):
    """The eager drafter's forwards go through HeadSteps too (none compiled), the compiled one's
    all but the prefill compiled; both count the same draft forwards."""
    calls = []
    real = HeadSteps.__call__

    def spy(self, eager, *args):
        calls.append(self.compiles and not eager)
        return real(self, eager, *args)

    monkeypatch.setattr(HeadSteps, "__call__", spy)
    target, head = pairs(kind, tmp_path)
    ids = prompt(2)
    eager = head.for_target(target)
    qs(eager, target, ids)
    assert len(calls) == eager.forwards == 6 and not any(calls)
    calls.clear()
    compiled = head.for_target(target).compiled(forced(), 64)
    qs(compiled, target, ids)
    assert len(calls) == compiled.forwards == 6 and calls == [False] + [True] * 5


@pytest.mark.parametrize("kind", ["feature1", "eagle3"])
@pytest.mark.parametrize("compiled", [False, True])
def test_greedy_with_either_drafter_equals_plain(kind, compiled, tmp_path):
    target, head = pairs(kind, tmp_path)
    target.generation_config.eos_token_id = None
    ids = prompt(0)
    ref = target.generate(ids, max_new_tokens=16, do_sample=False)
    more = {"compile_config": forced()} if compiled else {}
    out = target.generate(ids, max_new_tokens=16, do_sample=False, custom_generate=speculative_generate,
                          draft_model=head, nodes=10, **more)
    assert torch.equal(out, ref)


def test_a_fresh_or_bound_drafter_keeps_its_step():
    target, head = feature_pair(1)
    compiled = head.for_target(target).compiled(forced(), 64)
    for drafter in (compiled.fresh(), compiled.bind(target, None), compiled.compiled(forced(), 64)):
        assert drafter.steps is compiled.steps and drafter.modules() == []
    assert type(head.for_target(target)) is FeatureHeadDrafter and head.for_target(target).modules() == [head]


def test_no_function_of_the_heads_is_longer_than_a_screen():
    assert long_functions(PACKAGE / "drafters" / "head", 60) == []
    assert long_functions(PACKAGE / "drafters" / "head", 20)  # control: the measure sees the heads' functions
