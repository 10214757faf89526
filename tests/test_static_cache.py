"""A StaticCache (``cache_implementation="static"``, or an empty one passed in) is honoured: the
verification forward's mask spans its every slot, the accepted path is moved in place and its count
set, and greedy output equals plain's (plain with a static cache and without). A static cache too
small for the tree gets the room before its first forward; one already allocated is refused by name,
as is a filled one."""

import pytest
import torch
from transformers import StaticCache

from models import FAMILIES, partly_agreeing, peaked, tiny_model
from opttree import SpeculativeGenerator, speculative_generate
from opttree.hf import kv_cache
from opttree.hf.tree_cache import CacheNeed, check_cache

PROMPT = torch.tensor([[5, 17, 33, 2, 41, 8, 19, 60, 11]])


def no_eos(model):
    """Every run goes the whole length (a random model may emit its EOS at once)."""
    model.generation_config.eos_token_id = None
    return model


def supports_static(model) -> bool:
    try:
        model.generate(PROMPT, max_new_tokens=2, do_sample=False, cache_implementation="static")
    except Exception:  # noqa: BLE001 - a family whose plain generate() has no static cache
        return False
    return True


@pytest.mark.parametrize("family", FAMILIES)
def test_static_cache_output_equals_plain_greedy(family):
    target = peaked(no_eos(tiny_model(family)), 30.0)  # sharp: the target drafting itself is accepted deep
    if not supports_static(target):
        pytest.skip(f"{family}: plain generate() has no static cache")
    plain = target.generate(PROMPT, max_new_tokens=24, do_sample=False)
    assert torch.equal(target.generate(PROMPT, max_new_tokens=24, do_sample=False, cache_implementation="static"), plain)
    for draft in (partly_agreeing(target), target):  # the target itself: every tree's best path accepted
        out = target.generate(PROMPT, max_new_tokens=24, do_sample=False, cache_implementation="static",
                              custom_generate=speculative_generate, draft_model=draft, nodes=8, threshold=0.0,
                              return_dict_in_generate=True)
        assert torch.equal(out.sequences, plain)
    assert out.stats.mean_accepted_tokens > 2.0  # paths were accepted: slots really moved


@pytest.mark.parametrize("name", ["sliding_window", "hybrid"])
def test_transformers_older_names_for_a_static_cache_are_honoured_too(name):
    """transformers builds a StaticCache for them (it warns they are deprecated); the contract does not refuse them."""
    from opttree import speculative

    target = no_eos(tiny_model("llama"))
    plain = target.generate(PROMPT, max_new_tokens=20, do_sample=False)
    model = speculative(no_eos(tiny_model("llama")))
    out = model.generate(PROMPT, max_new_tokens=20, do_sample=False, cache_implementation=name,
                         draft_model=partly_agreeing(model), nodes=8, threshold=0.0, return_dict_in_generate=True)
    assert torch.equal(out.sequences, plain)
    assert out.stats.mean_accepted_tokens > 1.0


def test_every_way_in_honours_it_and_the_cache_grows_only_before_its_first_forward():
    from opttree import speculative

    target = no_eos(tiny_model("llama"))
    draft = partly_agreeing(target)
    plain = target.generate(PROMPT, max_new_tokens=20, do_sample=False)
    gen = SpeculativeGenerator(target, draft, nodes=8, threshold=0.0)
    assert torch.equal(gen.generate(PROMPT, max_new_tokens=20, do_sample=False, cache_implementation="static"), plain)
    model = speculative(no_eos(tiny_model("llama")))
    assert torch.equal(model.generate(PROMPT, max_new_tokens=20, do_sample=False, cache_implementation="static",
                                      draft_model=partly_agreeing(model), nodes=8, threshold=0.0), plain)
    cache = StaticCache(config=target.config, max_cache_len=PROMPT.shape[1] + 20)  # no room for a tree
    out = target.generate(PROMPT, max_new_tokens=20, do_sample=False, past_key_values=cache,
                          custom_generate=speculative_generate, draft_model=draft, nodes=8, threshold=0.0)
    assert torch.equal(out, plain)
    assert kv_cache.capacity(cache) > PROMPT.shape[1] + 20  # given the room before its first forward


def test_a_static_cache_that_cannot_hold_the_call_is_refused_by_name():
    target = tiny_model("llama")
    small = StaticCache(config=target.config, max_cache_len=12)
    with torch.no_grad():
        target(PROMPT[:, :3], past_key_values=small, use_cache=True)  # allocated (and filled)
    need = CacheNeed(room=40, plain=12, rows=1)
    with pytest.raises(NotImplementedError, match="already holds 3 tokens"):
        check_cache(small, need)
    for layer in small.layers:
        layer.cumulative_length.fill_(0)  # empty again, but allocated at 12 slots
    with pytest.raises(ValueError, match="max_cache_len=40"):
        check_cache(small, need)
    check_cache(small, CacheNeed(room=12, plain=11, rows=1))  # room enough: accepted


def test_a_static_cache_too_small_for_plain_is_refused_as_plain_fails_and_its_fix_works():
    """Plain generate() fails on a StaticCache that cannot hold the call's tokens; opttree refuses it
    before any forward (before: it was grown in silence), naming a size that works."""
    target = no_eos(tiny_model("llama"))
    plain = target.generate(PROMPT, max_new_tokens=20, do_sample=False)
    with pytest.raises(IndexError):
        target.generate(PROMPT, max_new_tokens=20, do_sample=False, past_key_values=StaticCache(config=target.config,
                                                                                                max_cache_len=12))
    kw = dict(max_new_tokens=20, do_sample=False, custom_generate=speculative_generate, draft_model=partly_agreeing(target),
              nodes=8, threshold=0.0)
    with pytest.raises(ValueError, match=r"holds 12 slots.*plain generate\(\) fails on it too.*max_cache_len=(\d+)") as refused:
        target.generate(PROMPT, past_key_values=StaticCache(config=target.config, max_cache_len=12), **kw)
    size = int(refused.value.args[0].rsplit("max_cache_len=", 1)[1].rstrip(")"))
    assert torch.equal(target.generate(PROMPT, past_key_values=StaticCache(config=target.config, max_cache_len=size),
                                       **kw), plain)


@pytest.mark.parametrize("reuse", ["reset", "plain generate()"])
def test_a_given_static_cache_is_left_usable_as_plain_leaves_it(reuse):
    """opttree decodes under inference mode; a StaticCache passed in comes back with ordinary tensors
    (before: reset() and a later plain generate() raised "Inplace update to inference tensor")."""
    target = no_eos(tiny_model("llama"))
    plain = target.generate(PROMPT, max_new_tokens=20, do_sample=False)
    cache = StaticCache(config=target.config, max_cache_len=64)
    out = target.generate(PROMPT, max_new_tokens=20, do_sample=False, past_key_values=cache,
                          custom_generate=speculative_generate, draft_model=partly_agreeing(target), nodes=8,
                          threshold=0.0)
    assert torch.equal(out, plain)
    assert kv_cache.cache_length(cache) == out.shape[1] - 1  # what plain's holds: the sequence but its last token
    assert not any(layer.keys.is_inference() or layer.cumulative_length.is_inference() for layer in cache.layers)
    cache.reset()
    if reuse == "plain generate()":
        assert torch.equal(target.generate(PROMPT, max_new_tokens=20, do_sample=False, past_key_values=cache), plain)


def test_keeping_a_path_moves_it_in_place_and_sets_the_count():
    """Slots 0-4 committed; a tree wrote 5-9; keeping [6, 8] puts them at 5, 6 and the next forward
    writes from 7. Negative control: without setting the count the next write lands at 10."""
    target = tiny_model("llama")
    cache = StaticCache(config=target.config, max_cache_len=32)
    with torch.no_grad():
        target(torch.arange(3, 13)[None], past_key_values=cache, use_cache=True)
    keys = cache.layers[0].keys.clone()
    kv_cache.keep_slots(cache, 5, [6, 8])
    assert kv_cache.cache_length(cache) == 7
    assert torch.equal(cache.layers[0].keys[..., 5:7, :], keys[..., [6, 8], :])
    assert torch.equal(cache.layers[0].keys[..., :5, :], keys[..., :5, :])
    with torch.no_grad():
        target(torch.tensor([[40]]), past_key_values=cache, use_cache=True)
    assert kv_cache.cache_length(cache) == 8 and not torch.equal(cache.layers[0].keys[..., 7, :], keys[..., 7, :])


def test_a_stale_count_is_caught(monkeypatch):
    """Negative control for the whole decode: a static cache whose count is not set after a step
    writes the next tree after the stale slots, and the output leaves plain's."""
    target = no_eos(tiny_model("llama"))
    draft = partly_agreeing(target)
    plain = target.generate(PROMPT, max_new_tokens=20, do_sample=False)
    monkeypatch.setattr(kv_cache, "_set_static_length", lambda cache, length: None)
    try:
        out = target.generate(PROMPT, max_new_tokens=20, do_sample=False, cache_implementation="static",
                              custom_generate=speculative_generate, draft_model=draft, nodes=8, threshold=0.0)
    except IndexError:  # the stale count runs the writes off the cache's end
        return
    assert not torch.equal(out, plain)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("hidden", ["left padding", "a pad id inside"])
def test_one_prompt_with_hidden_tokens_in_a_static_cache(family, hidden):
    """One prompt whose mask hides tokens (left padding, or the pad id generate() masks itself) in a
    static cache: the rows' masks span the cache's slots (before: a raw size error from the attention)."""
    from models import windowed_model

    target = no_eos(peaked(windowed_model("gemma3", 8) if family == "gemma3" else tiny_model(family), 30.0))
    ids = torch.randint(3, 90, (1, 12), generator=torch.Generator().manual_seed(5))
    kw = dict(max_new_tokens=24, do_sample=False, cache_implementation="static")
    if hidden == "left padding":
        ids[0, :3] = target.generation_config.pad_token_id
        kw["attention_mask"] = (torch.arange(12) >= 3).long()[None]
    else:
        ids[0, [2, 9]] = target.generation_config.pad_token_id
    plain = target.generate(ids, **kw)
    for draft in (target, partly_agreeing(target)):
        out = target.generate(ids, custom_generate=speculative_generate, draft_model=draft, nodes=8, threshold=0.0,
                              **kw)
        assert torch.equal(out, plain)
