"""Sliding-window and chunked attention past the window: each layer type gets its own tree mask, read
from the model's config the way transformers reads it, and the cache keeps every slot while opttree
decodes. Greedy output equals plain generate()'s (and its logits plain's within float32 rounding) for
families whose windows come from ``layer_types``, from ``sliding_window`` alone and from
``attention_chunk_size``, on sequences 3-6 times the window; sampling keeps the target's law.
Negative controls: the same decode with the windows left out of the masks leaves plain's logits."""

from collections import Counter

import pytest
import torch
import transformers as tf
from transformers import DynamicCache, StaticCache
from transformers.cache_utils import DynamicSlidingWindowLayer, StaticSlidingWindowLayer
from transformers.masking_utils import create_masks_for_generate

from models import WINDOWED_FAMILIES, partly_agreeing, peaked, windowed_model
from opttree import SpeculativeGenerator, speculative, speculative_generate
from opttree.tree import layout as layout_module
from opttree.tree.layout import CHUNKED, FULL, SLIDING, MaskLayout, Window  # noqa: F401

WINDOW = 8
PROMPT = torch.randint(3, 90, (1, 8), generator=torch.Generator().manual_seed(0))
NEW = 40  # 48 tokens: six windows


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def sharp(family: str, seed: int = 0):
    """A target sharp enough that drafts of it agree deep into the tree (Cohere2 scales its logits by 1/16)."""
    return peaked(windowed_model(family, WINDOW, seed=seed), 480.0 if family == "cohere2" else 30.0)


def spec(target, draft, ids=PROMPT, **kw):
    return target.generate(ids, max_new_tokens=NEW, do_sample=False, custom_generate=speculative_generate,
                           draft_model=draft, nodes=kw.pop("nodes", 8), threshold=kw.pop("threshold", 0.0),
                           output_logits=True, return_dict_in_generate=True, **kw)


def logit_gap(out, plain) -> float:
    """The largest difference of a new token's logits from plain's, relative to plain's largest logit."""
    scale = max(float(b.abs().max()) for b in plain.logits)
    return max(float((a - b).abs().max()) for a, b in zip(out.logits, plain.logits)) / scale


TOLERANCE = 1e-5  # float32: a tree forward's logits against one token's, relative (measured: below 3e-6)


# ---------------------------------------------------------------------------------------------
# the masks against transformers' own


@pytest.mark.parametrize("family", WINDOWED_FAMILIES)
def test_each_layer_types_mask_is_transformers_own(family):
    """A causal stretch of 3 windows: what each layer type sees under opttree's layout equals the mask
    transformers makes for generate() (create_masks_for_generate), type by type."""
    model = windowed_model(family, WINDOW)
    config = model.config.get_text_config()
    config._attn_implementation = "eager"  # additive masks to compare
    q = 3 * WINDOW
    embeds = torch.zeros(1, q, 4)
    try:
        theirs = create_masks_for_generate(config, embeds, None, None, torch.arange(q)[None])
    except TypeError:  # transformers 5.18 passes its chunked mask a keyword it does not take: each type's own
        from transformers.masking_utils import LAYER_PATTERN_TO_MASK_FUNCTION_MAPPING as BY_TYPE

        theirs = {kind: BY_TYPE[kind](config, embeds, None, None, torch.arange(q)[None])
                  for kind in set(config.layer_types)}
    index = torch.arange(q)[None]
    ours = MaskLayout.of(model.config).masks(torch.ones(1, q, q, dtype=torch.bool).tril(), index, index, torch.float32)
    if isinstance(theirs, dict):
        ours = ours if isinstance(ours, dict) else {kind: ours for kind in theirs}
        assert set(ours) == set(theirs)
        for kind in theirs:
            assert torch.equal(ours[kind] == 0, theirs[kind] == 0), kind
    else:
        assert torch.equal(ours == 0, theirs == 0)
    assert MaskLayout.of(model.config).windowed
    assert not bool((torch.cat([m.flatten() for m in (theirs.values() if isinstance(theirs, dict) else [theirs])])
                     == 0).all())  # control: the window hides something


def test_a_node_sees_its_ancestors_only_inside_the_window():
    """A chain of 10 nodes under a window of 4: the deepest sees itself and its 3 nearest ancestors,
    not the root; on a chunked layer of 4 it sees its chunk's."""
    visible = torch.ones(1, 11, 11, dtype=torch.bool).tril()  # the root and a chain
    index = torch.arange(20, 31)[None]  # past_len 20
    sliding = MaskLayout(((SLIDING, Window(SLIDING, 4)),)).masks(visible, index, index, torch.float32)[0, 0]
    assert (sliding[10] == 0).nonzero().flatten().tolist() == [7, 8, 9, 10]
    chunked = MaskLayout(((CHUNKED, Window(CHUNKED, 4)),)).masks(visible, index, index, torch.float32)[0, 0]
    assert (chunked[10] == 0).nonzero().flatten().tolist() == [8, 9, 10]  # indices 28, 29, 30: chunk 7
    both = MaskLayout(((FULL, None), (SLIDING, Window(SLIDING, 4)))).masks(visible, index, index, torch.float32)
    assert set(both) == {FULL, SLIDING} and bool((both[FULL][0, 0][10] == 0).all())


def test_layer_types_opttree_cannot_mask_are_refused_by_name():
    config = tf.Qwen2Config(num_hidden_layers=2, layer_types=["full_attention", "linear_attention"])
    with pytest.raises(NotImplementedError, match="'linear_attention'.*without draft_model="):
        MaskLayout.of(config)


# ---------------------------------------------------------------------------------------------
# greedy decoding past the window


@pytest.mark.parametrize("family", WINDOWED_FAMILIES)
def test_greedy_equals_plain_past_the_window(family):
    target = sharp(family)
    plain = target.generate(PROMPT, max_new_tokens=NEW, do_sample=False, output_logits=True,
                            return_dict_in_generate=True)
    for draft in (target, windowed_model(family, WINDOW, seed=1)):  # every path accepted; a random draft
        out = spec(target, draft)
        assert torch.equal(out.sequences, plain.sequences), family
        assert logit_gap(out, plain) < TOLERANCE, family
    assert spec(target, target).stats.mean_accepted_tokens > 2.0  # deep trees, across the window's edge


@pytest.mark.parametrize("family", WINDOWED_FAMILIES)
def test_negative_control_the_window_left_out_of_the_masks_leaves_plain(family, monkeypatch):
    target = sharp(family)
    plain = target.generate(PROMPT, max_new_tokens=NEW, do_sample=False, output_logits=True,
                            return_dict_in_generate=True)
    monkeypatch.setattr(layout_module.Window, "allows",  # every held key visible, whatever the window
                        lambda self, queries, keys: torch.ones(queries.shape[0], queries.shape[1], keys.shape[1],
                                                               dtype=torch.bool))
    out = spec(target, target)
    assert logit_gap(out, plain) > 10 * TOLERANCE, family  # Cohere2's window moves its logits least: 5e-4


@pytest.mark.parametrize("family", ["gemma3", "mistral", "llama4"])
def test_every_way_in_and_a_static_cache(family):
    target = peaked(windowed_model(family, WINDOW), 30.0)
    draft = partly_agreeing(target)
    plain = target.generate(PROMPT, max_new_tokens=NEW, do_sample=False)
    gen = SpeculativeGenerator(target, draft, nodes=8, threshold=0.0)
    assert torch.equal(gen.generate(PROMPT, max_new_tokens=NEW, do_sample=False), plain)
    model = speculative(peaked(windowed_model(family, WINDOW), 30.0))
    for implementation in (None, "static", "sliding_window", "hybrid"):
        out = model.generate(PROMPT, max_new_tokens=NEW, do_sample=False, draft_model=draft, nodes=8, threshold=0.0,
                             cache_implementation=implementation)
        assert torch.equal(out, plain), implementation
    out = target.generate(PROMPT, max_new_tokens=NEW, do_sample=False, custom_generate=speculative_generate,
                          draft_model=target, nodes=8, threshold=0.0, cache_implementation="static",
                          return_dict_in_generate=True)
    assert torch.equal(out.sequences, plain) and out.stats.mean_accepted_tokens > 2.0


@pytest.mark.parametrize("family", ["mistral", "gemma3", "llama4"])
def test_a_left_padded_batch_with_a_windowed_draft(family):
    target = peaked(windowed_model(family, WINDOW), 30.0)
    draft = windowed_model(family, WINDOW, seed=1)
    ids = torch.randint(3, 90, (3, 11), generator=torch.Generator().manual_seed(4))
    mask = torch.ones_like(ids)
    mask[0, :3], mask[2, :6] = 0, 0
    ids[mask == 0] = 0
    plain = target.generate(ids, attention_mask=mask, max_new_tokens=30, do_sample=False)
    for d in (target, draft):
        out = target.generate(ids, attention_mask=mask, max_new_tokens=30, do_sample=False,
                              custom_generate=speculative_generate, draft_model=d, nodes=8, threshold=0.0)
        assert torch.equal(out, plain), family


def test_auto_calibrates_a_small_window_as_the_model_runs():
    """nodes="auto" times verification forwards past a 16-token window (before: a raw sdpa size error)."""
    target = peaked(windowed_model("mistral", 16), 30.0)
    plain = target.generate(PROMPT, max_new_tokens=NEW, do_sample=False)
    out = target.generate(PROMPT, max_new_tokens=NEW, do_sample=False, custom_generate=speculative_generate,
                          draft_model=partly_agreeing(target))
    assert torch.equal(out, plain)


def test_one_new_token_under_a_small_window():
    """max_new_tokens=1 with a window of 8 and a tree of 60 nodes (before: refused, naming a fix that could not help)."""
    target = peaked(windowed_model("mistral", WINDOW), 30.0)
    plain = target.generate(PROMPT, max_new_tokens=1, do_sample=False)
    out = target.generate(PROMPT, max_new_tokens=1, do_sample=False, custom_generate=speculative_generate,
                          draft_model=target, nodes=60)
    assert torch.equal(out, plain)


# ---------------------------------------------------------------------------------------------
# the cache comes back as plain leaves it


@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_a_given_cache_comes_back_with_its_sliding_layers_as_plain_leaves_them(kind):
    target = peaked(windowed_model("gemma3", WINDOW), 30.0)

    def new():
        if kind == "dynamic":
            return DynamicCache(config=target.config)
        return StaticCache(config=target.config, max_cache_len=PROMPT.shape[1] + NEW + 16)

    theirs, ours = new(), new()
    plain = target.generate(PROMPT, max_new_tokens=NEW, do_sample=False, past_key_values=theirs)
    out = target.generate(PROMPT, max_new_tokens=NEW, do_sample=False, past_key_values=ours,
                          custom_generate=speculative_generate, draft_model=target, nodes=8, threshold=0.0)
    assert torch.equal(out, plain)
    sliding = DynamicSlidingWindowLayer if kind == "dynamic" else StaticSlidingWindowLayer
    assert [type(layer) for layer in ours.layers] == [type(layer) for layer in theirs.layers]
    assert any(type(layer) is sliding for layer in ours.layers)
    assert ours.get_seq_length() == theirs.get_seq_length() == out.shape[1] - 1
    length = out.shape[1] - 1
    for mine, plains in zip(ours.layers, theirs.layers):
        assert mine.keys.shape == plains.keys.shape
        held = mine.keys.shape[-2] if type(mine) is sliding else length  # a static layer's slots past its count: stale
        torch.testing.assert_close(mine.keys[..., :held, :], plains.keys[..., :held, :], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(mine.values[..., :held, :], plains.values[..., :held, :], rtol=1e-4, atol=1e-5)
        assert not mine.keys.is_inference() and not mine.values.is_inference()
    ours.reset()  # its tensors are ordinary ones
    again = target.generate(PROMPT, max_new_tokens=NEW, do_sample=False, past_key_values=ours)
    assert torch.equal(again, plain)


# ---------------------------------------------------------------------------------------------
# sampling keeps the target's law past the window


VOCAB = 12


def windowed_lm(window: int | None):
    torch.manual_seed(0)
    config = tf.MistralConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                              num_key_value_heads=1, intermediate_size=32, max_position_embeddings=64,
                              sliding_window=window)
    config._attn_implementation = "sdpa"
    model = tf.MistralForCausalLM(config).eval()
    with torch.no_grad():  # a peaked law, 0.22 in total variation from the windowless model's
        model.get_output_embeddings().weight.mul_(30.0)
    return model


def two_token_law(model, prompt: list[int]) -> dict[tuple[int, int], float]:
    with torch.no_grad():
        first = torch.softmax(model(torch.tensor([prompt])).logits[0, -1].double(), -1)
        law = {}
        for a in range(VOCAB):
            second = torch.softmax(model(torch.tensor([prompt + [a]])).logits[0, -1].double(), -1)
            for b in range(VOCAB):
                law[(a, b)] = float(first[a] * second[b])
    return law


def test_sampled_output_has_the_target_law_past_the_window():
    """Two tokens sampled after a 5-token prompt under a 2-token window, with a sampled tree of depth 2
    drafted by a windowless copy; chi-square against the law of plain forwards. Negative control: the
    same counts against the windowless model's law fail."""
    from test_sampling import chi_square

    target, draft = windowed_lm(2), windowed_lm(None)
    prompt = [3, 7, 1, 9, 5]
    law, wrong = two_token_law(target, prompt), two_token_law(draft, prompt)
    g = torch.Generator().manual_seed(0)
    counts, n = Counter(), 600
    for _ in range(n):
        out = target.generate(torch.tensor([prompt]), max_new_tokens=2, do_sample=True, top_k=0,
                              custom_generate=speculative_generate, draft_model=draft, nodes=6, max_depth=2,
                              threshold=0.0, strategy="sampled", verifier="traversal", generator=g)
        counts[tuple(out[0, len(prompt):].tolist())] += 1
    stat, critical = chi_square(counts, law, n)
    assert stat < critical, (stat, critical)
    stat, critical = chi_square(counts, wrong, n)
    assert stat > critical, (stat, critical)


# ---------------------------------------------------------------------------------------------
# one row's cache keeps the window, not the sequence


def test_one_rows_cache_holds_the_window_and_the_deepest_path_not_the_sequence():
    """48 tokens under a window of 8: before each verification forward every sliding layer holds at most
    window - 1 + (max_depth + 1) committed slots (the deepest path a rewind may drop), the full layers
    all of them; the output is plain's."""
    from opttree.hf import kv_cache

    target = sharp("gemma3")
    held = []

    def record(module, args, kwargs):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        if kwargs.get("input_ids") is not None and kwargs["input_ids"].shape[1] > 1 and cache.get_seq_length():
            held.append([(type(layer).__name__, layer.held() if type(layer) is kv_cache.WindowLayer
                          else layer.get_seq_length()) for layer in cache.layers])

    import copy

    draft = copy.deepcopy(target)  # the hook counts the target's forwards only
    hook = target.register_forward_pre_hook(record, with_kwargs=True)
    try:
        out = spec(target, draft, max_depth=6)
    finally:
        hook.remove()
    plain = target.generate(PROMPT, max_new_tokens=NEW, do_sample=False)
    assert torch.equal(out.sequences, plain)
    windows = [n for step in held for kind, n in step if kind == "WindowLayer"]
    fulls = [n for step in held for kind, n in step if kind != "WindowLayer"]
    assert windows and max(windows) <= WINDOW - 1 + 7 and max(fulls) > WINDOW - 1 + 7  # control: the sequence grew


def test_keeping_a_path_in_a_window_layer_moves_it_by_its_offset():
    """A WindowLayer holding slots 12-19 of the sequence (offset 12): keeping [16, 18] behind slot 15 puts
    them at 15, 16 (its 3, 4), drops the rest and trims to its last `keep`."""
    from opttree.hf import kv_cache

    cache = DynamicCache()
    cache.layers = [kv_cache.WindowLayer(window=4, keep=3)]
    keys = torch.arange(20, dtype=torch.float32).view(1, 1, 20, 1)  # value = sequence slot
    cache.update(keys[..., :12, :], keys[..., :12, :].clone(), 0)
    cache.layers[0].trim()
    assert cache.layers[0].offset == 9 and cache.get_seq_length() == 12
    cache.update(keys[..., 12:, :], keys[..., 12:, :].clone(), 0)  # a step's 8 tree slots: 12-19
    kv_cache.keep_slots(cache, 13, [16, 18])
    layer = cache.layers[0]
    assert cache.get_seq_length() == 15 and layer.offset == 12
    assert layer.keys[0, 0, :, 0].tolist() == [12, 16, 18]
    assert kv_cache.window_offsets(cache) == {4: 12}
