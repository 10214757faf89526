"""Long runs: a thousand decoding steps in bounded memory, the context limit, exact lengths.

Memory is sampled from inside the loop by a drafter that wraps the real one: at every step the
target's cache must hold exactly the committed tokens but the root and the draft's cache at most
the committed tokens (no tree slot ever leaks), and the bytes of all live tensors other than the
two caches must stay flat from step 100 to step 1000."""

import gc
import logging

import pytest
import torch
import transformers as tf
from transformers import DynamicCache

from models import peaked
from opttree import speculative_generate
from opttree.drafters import Drafter, ModelDrafter, PromptLookupDrafter
from opttree.hf.compat import GENERATE_CACHE_NAME

VOCAB = 512  # larger than the other tests' models, so a leaked [vocab] row per token is visible


def long_model(seed: int, positions: int = 1200, family: str = "llama"):
    torch.manual_seed(seed)
    if family == "gpt2":
        config = tf.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=positions)
    else:
        config = tf.LlamaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                num_key_value_heads=2, intermediate_size=64, max_position_embeddings=positions)
    config._attn_implementation = "sdpa"
    model = tf.AutoModelForCausalLM.from_config(config).eval()
    model.generation_config.pad_token_id = 0
    return model


def storages(tensors) -> dict[int, int]:
    """data pointer -> bytes of each distinct storage behind ``tensors``; an opaque tensor (a oneDNN
    packed weight, opttree.kernels.linears) has no storage to ask: it counts by its id and its elements.
    Tensors with no data at all (FakeTensors a torch.compile elsewhere in this process left in its
    caches) hold no memory and are left out."""
    out = {}
    for t in tensors:
        if t.is_mkldnn:
            out[id(t)] = t.numel() * t.element_size()
            continue
        try:
            out[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        except RuntimeError:  # "Cannot access data pointer of Tensor (e.g. FakeTensor, FunctionalTensor)"
            continue
    return out


def cache_storages(cache) -> dict[int, int]:
    return storages([x for layer in cache.layers if getattr(layer, "is_initialized", True)
                     for x in (layer.keys, layer.values)])


def live_storages() -> dict[int, int]:
    gc.collect()
    return storages([o for o in gc.get_objects() if isinstance(o, torch.Tensor)])


class Probe(Drafter):
    """A drafter that delegates to ``inner`` and samples the memory every ``every`` steps."""

    def __init__(self, inner: ModelDrafter, target_cache: DynamicCache, every: int = 100):
        self.inner, self.target_cache, self.every = inner, target_cache, every
        self.steps = 0
        self.samples = []  # (committed tokens, tensor bytes outside both caches, bytes of both caches)

    def caches(self):
        return self.inner.caches()

    @property
    def forwards(self):
        return self.inner.forwards

    def root_probs(self, sequence):
        # the loop's invariants: the target holds all committed tokens but the root, the draft no more
        assert self.target_cache.get_seq_length() == len(sequence) - 1
        assert self.inner.cache.get_seq_length() <= len(sequence) - 1
        if self.steps % self.every == 0:
            caches = {**cache_storages(self.target_cache), **cache_storages(self.inner.cache)}
            others = {p: b for p, b in live_storages().items() if p not in caches}
            self.samples.append((len(sequence), sum(others.values()), sum(caches.values())))
        self.steps += 1
        return self.inner.root_probs(sequence)

    def expand(self, pool, frontier):
        return self.inner.expand(pool, frontier)

    def commit(self, accepted_pool_ids):
        self.inner.commit(accepted_pool_ids)


def run_probed(target, draft, ids, max_new_tokens, every=100, **kw):
    cache = DynamicCache(config=target.config)
    probe = Probe(ModelDrafter(draft), cache, every)
    out = target.generate(ids, do_sample=False, custom_generate=speculative_generate, draft_model=probe,
                          **{GENERATE_CACHE_NAME: cache}, max_new_tokens=max_new_tokens, nodes=4, threshold=0.5,
                          max_depth=2, return_dict_in_generate=True, **kw)
    return out, probe


def kv_bytes_per_token(model) -> int:
    """Bytes of keys and values one token takes in the cache, over all layers."""
    c = model.config
    return c.num_hidden_layers * 2 * c.num_key_value_heads * (c.hidden_size // c.num_attention_heads) * 4


def test_a_thousand_steps_in_bounded_memory():
    target, draft = long_model(0), long_model(1)  # an unrelated draft: about one token per step
    ids = torch.randint(3, VOCAB, (1, 16), generator=torch.Generator().manual_seed(0))
    out, probe = run_probed(target, draft, ids, max_new_tokens=1000)
    assert out.sequences.shape[1] == 16 + 1000
    assert len(out.stats.steps) >= 900  # really ~a thousand steps
    assert len(probe.samples) >= 9
    first, last = probe.samples[1], probe.samples[-1]  # from step 100 on (allocator warm)
    assert last[1] - first[1] < 256 * 1024, probe.samples  # everything but the caches: flat
    # the caches: the committed tokens plus at most one step's tree in a not yet reallocated storage
    per_token = kv_bytes_per_token(target)
    for tokens, _, cache_bytes in probe.samples:
        assert cache_bytes <= 2 * per_token * (tokens + 4 + 1)


def test_the_probe_sees_memory_that_does_grow():
    """Negative control: scores requested with output_scores are kept, a [vocab] row per token."""
    target, draft = long_model(0), long_model(1)
    ids = torch.randint(3, VOCAB, (1, 16), generator=torch.Generator().manual_seed(0))
    out, probe = run_probed(target, draft, ids, max_new_tokens=300, every=50, output_scores=True)
    assert len(out.scores) == 300
    grown = probe.samples[-1][1] - probe.samples[1][1]
    assert grown > 200 * VOCAB * 4  # ≥ 200 kept rows of float32 scores


# -- the context limit and exact lengths -----------------------------------------------------------

@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_a_prompt_near_the_context_limit_stops_there_with_a_warning(family, caplog):
    """GPT-2's learned positions end at n_positions: one token more would be an IndexError."""
    target = peaked(long_model(0, positions=64, family=family), scale=30.0)
    ids = torch.randint(3, VOCAB, (1, 58), generator=torch.Generator().manual_seed(1))
    ref = target.generate(ids, max_new_tokens=7, do_sample=False)  # the last one from position 63
    for draft in (target, long_model(1, positions=64, family=family), "prompt_lookup"):
        with caplog.at_level(logging.WARNING, logger="opttree.loop.committing"):
            caplog.clear()
            out = target.generate(ids, do_sample=False, custom_generate=speculative_generate, draft_model=draft,
                                  max_new_tokens=20, nodes=10, threshold=0.0, max_depth=10)
        assert torch.equal(out, ref)
        assert "context length (64 tokens)" in caplog.text


def test_a_draft_with_a_shorter_context_sets_the_limit(caplog):
    target, draft = peaked(long_model(0, positions=64), scale=30.0), peaked(long_model(0, positions=48), scale=30.0)
    ids = torch.randint(3, VOCAB, (1, 40), generator=torch.Generator().manual_seed(2))
    ref = target.generate(ids, max_new_tokens=9, do_sample=False)
    with caplog.at_level(logging.WARNING, logger="opttree.loop.committing"):
        out = target.generate(ids, do_sample=False, custom_generate=speculative_generate, draft_model=draft,
                              max_new_tokens=20, nodes=10, threshold=0.0)
    assert torch.equal(out, ref)
    assert "context length (48 tokens)" in caplog.text


def test_a_prompt_filling_the_context_is_refused_clearly():
    target = long_model(0, positions=64)
    with pytest.raises(ValueError, match="shorten the prompt"):
        target.generate(torch.ones(1, 64, dtype=torch.long), custom_generate=speculative_generate,
                        draft_model="prompt_lookup", max_new_tokens=3)


@pytest.mark.parametrize("limit", [dict(max_length=17 + 37), dict(max_new_tokens=41), dict(max_new_tokens=1)])
def test_max_length_and_max_new_tokens_are_exact_with_deep_trees(limit):
    target = peaked(long_model(0), scale=30.0)
    motif = torch.randint(3, VOCAB, (4,), generator=torch.Generator().manual_seed(3))
    ids = motif.repeat(5)[:17][None, :]
    ref = target.generate(ids, do_sample=False, **limit)
    length = limit.get("max_length", 17 + limit.get("max_new_tokens", 0))
    assert ref.shape[1] == length
    for draft in (target, PromptLookupDrafter(max_ngram=3)):
        out = target.generate(ids, do_sample=False, custom_generate=speculative_generate, draft_model=draft,
                              nodes=12, threshold=0.0, max_depth=10, **limit)
        assert torch.equal(out, ref)
