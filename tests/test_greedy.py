"""Greedy speculative output equals the target's own greedy generate(), token for token."""

import pytest
import torch
from transformers import StoppingCriteria, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

from models import FAMILIES, peaked, tiny_model
from opttree import speculative_generate


def prompt(seed=0, length=7):
    return torch.randint(3, 90, (1, length), generator=torch.Generator().manual_seed(seed))


def spec(target, draft, ids, **kw):
    tree = {k: kw.pop(k) for k in ("nodes", "threshold", "max_depth") if k in kw}
    return target.generate(ids, do_sample=False, custom_generate=speculative_generate, draft_model=draft,
                           return_dict_in_generate=True, **tree, **kw)


def pairs(family):
    target = peaked(tiny_model(family, seed=0), scale=30.0)
    agreeing = target  # the draft IS the target: every draft token is right
    unrelated = tiny_model(family, seed=1)  # a random draft: almost nothing is accepted
    return target, {"agree": agreeing, "unrelated": unrelated}


@pytest.mark.parametrize("family", FAMILIES)
def test_equal_to_greedy_generate_for_every_family(family):
    target, drafts = pairs(family)
    for seed in range(2):
        ids = prompt(seed)
        ref = target.generate(ids, max_new_tokens=24, do_sample=False)
        for name, draft in drafts.items():
            out = spec(target, draft, ids, max_new_tokens=24, nodes=8, threshold=0.1, max_depth=5)
            assert torch.equal(out.sequences, ref), (family, name, seed)
            assert out.stats.new_tokens == ref.shape[1] - ids.shape[1]
    # the agreeing draft really is accepted, the unrelated one really is not
    assert spec(target, target, prompt(0), max_new_tokens=24, nodes=8, threshold=0.1, max_depth=5).stats.mean_accepted_tokens > 2


@pytest.mark.parametrize("nodes,threshold,max_depth", [
    (1, 0.0, 1), (1, 0.0, 10), (5, 0.5, 3), (60, 0.5, 10), (60, 0.0, 10), (20, 3.0, 10), (3, 0.0, 2),
])
def test_tree_settings_never_change_the_output(nodes, threshold, max_depth):
    target, drafts = pairs("llama")
    ids = prompt(3)
    ref = target.generate(ids, max_new_tokens=30, do_sample=False)
    for draft in drafts.values():
        out = spec(target, draft, ids, max_new_tokens=30, nodes=nodes, threshold=threshold, max_depth=max_depth)
        assert torch.equal(out.sequences, ref)
        assert max(out.stats.tree_sizes) <= nodes
        assert all(step.tree_depth <= max_depth for step in out.stats.steps)


@pytest.mark.parametrize("max_new_tokens", [1, 2, 3, 7])
def test_max_new_tokens_hit_exactly(max_new_tokens):
    target, drafts = pairs("qwen2")
    ids = prompt(1)
    ref = target.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
    for draft in drafts.values():
        out = spec(target, draft, ids, max_new_tokens=max_new_tokens, nodes=10, threshold=0.0, max_depth=8)
        assert out.sequences.shape[1] == ids.shape[1] + max_new_tokens
        assert torch.equal(out.sequences, ref)


@pytest.mark.parametrize("family", ["llama", "qwen3", "phi3"])
def test_eos_landing_mid_path(family):
    target, _ = pairs(family)
    ids = prompt(2)
    free = target.generate(ids, max_new_tokens=20, do_sample=False)[0, ids.shape[1]:].tolist()
    candidates = [t for i, t in enumerate(free) if i >= 3 and t not in free[:i]]  # first seen mid-output
    landed_mid_path = 0
    for eos in candidates[:4]:
        ref = target.generate(ids, max_new_tokens=20, do_sample=False, eos_token_id=eos)
        out = spec(target, target, ids, max_new_tokens=20, eos_token_id=eos, nodes=10, threshold=0.0, max_depth=10)
        assert torch.equal(out.sequences, ref)
        assert out.sequences[0, -1].item() == eos
        # EOS came inside a step whose accepted path went on beyond it
        landed_mid_path += any(step.emitted < step.accepted + 1 for step in out.stats.steps)
    assert landed_mid_path


class StopAfter(StoppingCriteria):
    def __init__(self, token):
        self.token = token

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, -1] == self.token


def test_stopping_criteria():
    target, drafts = pairs("mistral")
    ids = prompt(4)
    free = target.generate(ids, max_new_tokens=20, do_sample=False)[0, ids.shape[1]:].tolist()
    stop = free[9]
    ref = target.generate(ids, max_new_tokens=20, do_sample=False, stopping_criteria=StoppingCriteriaList([StopAfter(stop)]))
    for draft in drafts.values():
        out = spec(target, draft, ids, max_new_tokens=20, stopping_criteria=StoppingCriteriaList([StopAfter(stop)]),
                   nodes=10, threshold=0.0, max_depth=10)
        assert torch.equal(out.sequences, ref)


def test_logits_processors_apply_per_node():
    target, drafts = pairs("llama")
    ids = prompt(5)
    kw = dict(max_new_tokens=25, repetition_penalty=1.5, no_repeat_ngram_size=2)
    ref = target.generate(ids, do_sample=False, **kw)
    for draft in drafts.values():
        assert torch.equal(spec(target, draft, ids, nodes=10, threshold=0.0, **kw).sequences, ref)


class Collect(BaseStreamer):
    def __init__(self):
        self.chunks = []
        self.ended = False

    def put(self, value):
        self.chunks.append(value.reshape(-1).tolist())

    def end(self):
        self.ended = True


def test_streamer_receives_exactly_the_returned_tokens():
    from opttree import speculative

    target, _ = pairs("llama")
    model = speculative(target)
    ids = prompt(6)
    streamer = Collect()
    out = model.generate(ids, max_new_tokens=17, do_sample=False, draft_model=target, nodes=10, threshold=0.0,
                         streamer=streamer)
    assert streamer.ended
    assert streamer.chunks[0] == ids[0].tolist()
    assert sum(streamer.chunks[1:], []) == out[0, ids.shape[1]:].tolist()
    assert max(len(c) for c in streamer.chunks[1:]) > 1  # several tokens per step arrived at once


def test_scores_and_logits_match_plain_generate():
    target, _ = pairs("qwen2")
    ids = prompt(7)
    kw = dict(max_new_tokens=9, output_scores=True, output_logits=True, return_dict_in_generate=True,
              repetition_penalty=1.2)
    ref = target.generate(ids, do_sample=False, **kw)
    out = target.generate(ids, do_sample=False, custom_generate=speculative_generate, draft_model=target,
                          nodes=6, threshold=0.0, **kw)
    assert len(out.scores) == len(ref.scores) == 9
    for a, b in zip(out.scores, ref.scores):
        assert torch.allclose(a, b, atol=1e-4)
    for a, b in zip(out.logits, ref.logits):
        assert torch.allclose(a, b, atol=1e-4)
