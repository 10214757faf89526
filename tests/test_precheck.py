"""One pre-check sequence for every way in (issue 59): each of the four ways into generate() with a draft
calls integration.precheck.precheck exactly once, and refuses the same bad inputs with the same error,
before any forward. Negative control: without the draft, stock generate() takes the same inputs."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import torch
from transformers import StaticCache

from models import tiny_model
from test_contract import counted_forwards
from opttree import SpeculativeGenerator, speculative, speculative_generate
from opttree.integration import entry, precheck

HUB_FOLDER = str(Path(__file__).resolve().parents[1] / "hub")
WAYS = ("custom_generate", "draft_model", "SpeculativeGenerator", "hub")


def prompt(n=6, seed=0):
    return torch.randint(3, 90, (1, n), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def pair():
    return tiny_model("llama"), tiny_model("llama", seed=1)


def way(name, target, draft):
    """generate() with a draft through way ``name``: a call taking generate()'s keyword arguments."""
    if name == "custom_generate":
        return lambda **kw: target.generate(custom_generate=speculative_generate, draft_model=draft, **kw)
    if name == "draft_model":
        model = speculative(copy.deepcopy(target))
        return lambda **kw: model.generate(draft_model=draft, **kw)
    if name == "SpeculativeGenerator":
        return lambda **kw: SpeculativeGenerator(target, draft).generate(**kw)
    return lambda **kw: target.generate(custom_generate=HUB_FOLDER, trust_remote_code=True, draft_model=draft, **kw)


BAD = {  # name -> (generate()'s keyword arguments, what the one error says)
    "nodes=0": (dict(nodes=0), "nodes must be an integer >= 1"),
    "strategy": (dict(strategy="bogus"), "strategy must be one of"),
    "threshold": (dict(threshold=-1), "threshold must be a finite number"),
    "assistant_model": ("draft", "draft_model= and assistant_model= are two speculative methods"),
    "synced_gpus": (dict(synced_gpus=True), "synced_gpus=True: "),
    "offloaded cache": (dict(cache_implementation="offloaded_static"), "cache_implementation='offloaded_static': "),
}


@pytest.mark.parametrize("bad", sorted(BAD))
def test_every_way_in_refuses_the_same_bad_input_with_the_same_error_before_any_forward(pair, bad):
    target, draft = pair
    kw, says = BAD[bad]
    kw = dict(assistant_model=draft) if kw == "draft" else kw
    errors = {}
    for name in WAYS:
        stock = stock_setup_error(target, name, kw)
        with counted_forwards(target, draft) as calls, pytest.raises(type(stock) if stock else ValueError) as error:
            way(name, target, draft)(input_ids=prompt(), max_new_tokens=4, do_sample=False, **kw)
        assert calls == [], name
        if stock:  # transformers spoke first, as it does without a draft (the negative control below)
            assert str(error.value) == str(stock), (name, str(error.value))
            with pytest.raises(type(stock), match=re.escape(str(stock))):
                target.generate(prompt(), max_new_tokens=4, do_sample=False, **kw)
            continue
        assert says in str(error.value), (name, str(error.value))
        errors[name] = str(error.value)
    assert len(set(errors.values())) == 1, errors


def stock_setup_error(target, name, kw):
    """The error generate()'s own set-up raises on way ``name`` for ``kw`` on this machine, before opttree runs; None
    where opttree is the first to see them. The callable way gets generate()'s set-up, its cache included, before it
    calls opttree: where torch's build has no stream for this machine's backend (torch 2.14's CUDA wheels on a CPU),
    transformers cannot build an offloaded cache and raises its own error, as it does without a draft."""
    if name != "custom_generate" or "cache_implementation" not in kw:
        return None
    try:
        StaticCache(config=target.config, max_cache_len=8, offloading=True)
    except RuntimeError as error:
        return error
    return None


@pytest.mark.parametrize("name", WAYS)
def test_every_way_in_runs_the_one_precheck_once(pair, monkeypatch, name):
    target, draft = pair
    seen = []
    real = precheck.precheck

    def spy(*args, **kwargs):
        seen.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(entry, "precheck", spy)
    ref = target.generate(prompt(), max_new_tokens=5, do_sample=False)
    out = way(name, target, draft)(input_ids=prompt(), max_new_tokens=5, do_sample=False, nodes=4)
    assert torch.equal(out, ref)
    assert seen == [1]


def test_a_missing_draft_and_a_second_custom_generate_are_refused_where_they_can_be_given(pair):
    target, draft = pair
    for run in (lambda: target.generate(prompt(), max_new_tokens=3, custom_generate=speculative_generate),
                lambda: target.generate(prompt(), max_new_tokens=3, custom_generate=HUB_FOLDER, trust_remote_code=True)):
        with pytest.raises(ValueError, match="needs draft_model="):
            run()
    other = lambda *a, **k: None  # noqa: E731
    for run in (lambda: speculative(copy.deepcopy(target)).generate(prompt(), draft_model=draft, custom_generate=other),
                lambda: SpeculativeGenerator(target, draft).generate(prompt(), custom_generate=other)):
        with pytest.raises(ValueError, match="not both"):
            run()


def test_stock_generate_takes_the_same_inputs_without_a_draft(pair):
    """Negative control: the refusals are opttree's."""
    target, _ = pair
    out = target.generate(prompt(), max_new_tokens=2, do_sample=False, assistant_model=copy.deepcopy(target))
    assert out.shape == (1, 8)  # (synced_gpus=True needs a process group; offloaded caches a CUDA stream)
