"""The cache contract (opttree.hf.tree_cache): every cache_implementation value and every cache object a
user can pass is honoured or refused by name, the same on every way in, before any forward; and each
refusal names a fix that works: applied, the call succeeds and equals plain generate()'s."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, StaticCache

from models import peaked, tiny_model
from opttree.hf.tree_cache import HONOURED_IMPLEMENTATIONS, implementation_refused
from test_contract import BUILT_BEFORE_THE_CALLABLE, counted_forwards, preparation_error, ways

NEW = 8


def prompt(batch=1):
    return torch.randint(3, 90, (batch, 6), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def pair():
    target = peaked(tiny_model("llama"), 30.0)
    target.generation_config.eos_token_id = None
    return target, tiny_model("llama", seed=1)


def filled(target):
    cache = DynamicCache(config=target.config)
    with torch.no_grad():
        target(prompt()[:, :3], past_key_values=cache, use_cache=True)
    return cache


class OwnCache(DynamicCache):
    """A Cache class of the user's own: opttree cannot know what its methods do."""


# (case, the refused call's arguments, what the error says, the arguments after applying the fix it names)
CASES = [
    ("offloaded", lambda t: dict(cache_implementation="offloaded"), r"drop cache_implementation=.*'static'",
     lambda t: dict(cache_implementation="static")),
    ("offloaded_static", lambda t: dict(cache_implementation="offloaded_static"), r"drop cache_implementation=",
     lambda t: dict()),
    ("offloaded DynamicCache", lambda t: dict(past_key_values=DynamicCache(config=t.config, offloading=True)),
     r"offloaded DynamicCache.*without offloading=True", lambda t: dict(past_key_values=DynamicCache(config=t.config))),
    ("offloaded StaticCache", lambda t: dict(past_key_values=StaticCache(config=t.config, max_cache_len=64,
                                                                         offloading=True)),
     r"offloaded StaticCache.*without offloading=True",
     lambda t: dict(past_key_values=StaticCache(config=t.config, max_cache_len=64))),
    ("filled", lambda t: dict(past_key_values=filled(t)), r"already holds 3 tokens: pass an empty one \(cache.reset\(\)\)",
     lambda t: dict(past_key_values=DynamicCache(config=t.config))),
    ("own class", lambda t: dict(past_key_values=OwnCache(config=t.config)),
     r"not a OwnCache: pass an empty DynamicCache", lambda t: dict(past_key_values=DynamicCache(config=t.config))),
    ("static too small", lambda t: dict(past_key_values=StaticCache(config=t.config, max_cache_len=8)),
     r"max_cache_len=(\d+)", None),  # the size is read from the message
]


@pytest.mark.parametrize("case, refused, says, fixed", CASES, ids=[c[0] for c in CASES])
def test_each_cache_refusal_is_the_same_on_every_way_in_and_its_fix_works(case, refused, says, fixed, pair):
    target, draft = pair
    try:
        refused(target)
    except RuntimeError as error:  # an offloaded cache makes a torch.Stream(): a CUDA build of torch cannot without a GPU
        if not case.startswith("offloaded"):
            raise
        pytest.skip(f"transformers cannot build this cache here without a GPU ({error}); a GPU or torch's CPU build "
                    "runs this case")
    for way, run in ways(target, draft).items():
        if way == "hub":
            continue  # the Hub folder is stock generate() with the first way's callable (test_hf_compat.py)
        arguments = refused(target)
        built = way == "custom_generate" and BUILT_BEFORE_THE_CALLABLE & set(arguments)  # (a cache named, not passed)
        stock = preparation_error(target, arguments) if built else None
        if stock is not None:  # generate() builds the cache it names before it calls opttree: where stock's
            with pytest.raises(type(stock)):  # build fails (an offloaded one, no GPU), the callable way meets it first
                run(input_ids=prompt(), max_new_tokens=NEW, do_sample=False, nodes=4, **arguments)
            continue
        with counted_forwards(target, draft) as forwards, pytest.raises((ValueError, NotImplementedError),
                                                                       match=says) as error:
            run(input_ids=prompt(), max_new_tokens=NEW, do_sample=False, nodes=4, **arguments)
        assert forwards == [], (case, way)  # refused before any forward
        if fixed is None:
            size = int(error.value.args[0].rsplit("max_cache_len=", 1)[1].split(")")[0])
            fix = dict(past_key_values=StaticCache(config=target.config, max_cache_len=size))
            plain = dict(past_key_values=StaticCache(config=target.config, max_cache_len=size))
        else:
            fix, plain = fixed(target), fixed(target)
        expected = target.generate(prompt(), max_new_tokens=NEW, do_sample=False, **plain)
        assert torch.equal(run(input_ids=prompt(), max_new_tokens=NEW, do_sample=False, nodes=4, **fix), expected), \
            (case, way)


def test_a_static_cache_with_a_batch_is_refused_and_either_fix_works(pair):
    target, draft = pair
    ids = prompt(2)
    plain = target.generate(ids, max_new_tokens=NEW, do_sample=False)
    for way, run in ways(target, draft).items():
        if way == "hub":
            continue
        with pytest.raises(NotImplementedError, match="drop cache_implementation= for the batch"):
            run(input_ids=ids, max_new_tokens=NEW, do_sample=False, nodes=4, cache_implementation="static")
        with pytest.raises(NotImplementedError, match="pass no cache for the batch"):
            run(input_ids=ids, max_new_tokens=NEW, do_sample=False, nodes=4,
                past_key_values=StaticCache(config=target.config, max_cache_len=64))
        assert torch.equal(run(input_ids=ids, max_new_tokens=NEW, do_sample=False, nodes=4), plain), way
        for row in range(2):  # one prompt per call
            one = run(input_ids=ids[row:row + 1], max_new_tokens=NEW, do_sample=False, nodes=4,
                      cache_implementation="static")
            assert torch.equal(one, plain[row:row + 1]), way


@pytest.mark.parametrize("value", ["quantized", "paged"])
def test_caches_generate_builds_elsewhere_are_refused_where_opttree_sees_the_value(value, pair):
    target, draft = pair
    for way, run in ways(target, draft).items():
        if way in ("hub", "custom_generate"):
            continue
        with pytest.raises(ValueError, match=f"cache_implementation='{value}': .*drop cache_implementation="):
            run(input_ids=prompt(), max_new_tokens=NEW, do_sample=False, cache_implementation=value)


def test_paged_on_the_third_way_never_reaches_opttree(pair, monkeypatch):
    """transformers' limit, pinned: given cache_implementation="paged", generate() hands the call to its
    continuous batching (generate_batch) before it looks at custom_generate=, so a callable it never
    calls cannot refuse it (the other ways refuse it before generate() runs). The day this changes, this
    test fails and the refusal belongs in the callable. (generate_batch is stubbed: the real one sizes a
    paged cache from the machine's free memory.)"""
    from opttree import speculative_generate

    target, _ = pair
    called, batched = [], []

    def spy(*args, **kwargs):
        called.append(1)
        return speculative_generate(*args, **kwargs)

    monkeypatch.setattr(target, "generate_batch", lambda *args, **kwargs: batched.append(1) or {}, raising=False)
    target.generate(prompt(), max_new_tokens=2, do_sample=False, custom_generate=spy, draft_model="no/such/folder",
                    cache_implementation="paged")
    assert batched == [1] and called == []


def test_the_contract_names_every_cache_implementation_transformers_has():
    from transformers.generation.configuration_utils import ALL_CACHE_IMPLEMENTATIONS

    honoured = {v for v in ALL_CACHE_IMPLEMENTATIONS if not implementation_refused(v)}
    assert honoured == {"dynamic", "static", "sliding_window", "hybrid", "hybrid_chunked"}
    assert set(HONOURED_IMPLEMENTATIONS) - {None} <= set(ALL_CACHE_IMPLEMENTATIONS)
    assert implementation_refused("paged") and implementation_refused("offloaded") and not implementation_refused(None)
