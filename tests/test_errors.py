"""Bad input gets a clear error that names the fix."""

import pytest
import torch
import transformers as tf

from models import tiny_model
from opttree import SpeculativeGenerator, TreeConfig, speculative_generate


def ids(n=6, batch=1):
    return torch.randint(3, 90, (batch, n), generator=torch.Generator().manual_seed(0))


def run(target, draft, inputs, **kw):
    return target.generate(inputs, max_new_tokens=5, do_sample=False, custom_generate=speculative_generate,
                           draft_model=draft, **kw)


@pytest.mark.parametrize("kw,match", [
    (dict(nodes=0), "nodes must be an integer >= 1"),
    (dict(nodes=2.5), "nodes must be an integer >= 1"),
    (dict(threshold=-0.1), "threshold must be a finite number >= 0"),
    (dict(threshold=float("nan")), "threshold must be a finite number >= 0"),
    (dict(max_depth=0), "max_depth must be an integer >= 1"),
    (dict(strategy="nope"), "strategy must be one of"),
    (dict(verifier="nope"), "verifier must be one of"),
])
def test_invalid_tree_settings(kw, match):
    with pytest.raises(ValueError, match=match):
        TreeConfig(**kw)
    target = tiny_model("llama")
    with pytest.raises(ValueError, match=match):
        run(target, target, ids(), **kw)


def test_vocabulary_mismatch():
    target = tiny_model("llama")
    config = target.config.__class__(**{**target.config.to_dict(), "vocab_size": 120})
    draft = tf.AutoModelForCausalLM.from_config(config)
    with pytest.raises(ValueError, match="vocabularies differ.*target's tokenizer"):
        run(target, draft, ids())
    with pytest.raises(ValueError, match="vocabularies differ"):
        SpeculativeGenerator(target, draft)


def test_tokenizer_mismatch():
    target = tiny_model("llama")

    class Tok:
        def __init__(self, vocab):
            self.vocab = vocab

        def get_vocab(self):
            return self.vocab

    with pytest.raises(ValueError, match="different ids"):
        SpeculativeGenerator(target, target, tokenizer=Tok({"a": 0}), draft_tokenizer=Tok({"a": 1}))


@pytest.mark.parametrize("impl", ["flash_attention_2", "flex_attention"])
def test_attention_backend_that_ignores_tree_masks(impl):
    target = tiny_model("llama")
    draft = tiny_model("llama", seed=1)
    draft.config._attn_implementation = impl  # as if loaded with attn_implementation=impl
    with pytest.raises(ValueError, match="attn_implementation='sdpa'"):
        run(target, draft, ids())
    with pytest.raises(ValueError, match="the target model uses"):
        run(draft, target, ids())


def test_batches_refuse_right_padding_and_streamers_and_honour_holes():
    """Batches themselves: test_batch.py (every drafter, "auto", scores). Each refusal names the fix. A
    token the mask hides inside a prompt is hidden as plain hides it (test_batch.py: the pad id)."""
    target = tiny_model("llama")
    batch = ids(batch=2)
    mask = torch.ones_like(batch)
    mask[0, :2] = 0  # row 0 left-padded
    with pytest.raises(ValueError, match="padding_side = 'left'"):
        run(target, target, batch, attention_mask=mask.flip(1))  # right padding
    hole = torch.tensor([[1, 1, 0, 1, 1, 1]])
    assert torch.equal(run(target, target, ids(), attention_mask=hole),
                       target.generate(ids(), attention_mask=hole, max_new_tokens=5, do_sample=False))
    from transformers import TextStreamer

    from opttree import SpeculativeGenerator

    with pytest.raises(ValueError, match="stream one prompt per generate"):
        SpeculativeGenerator(target, target, nodes=4).generate(batch, attention_mask=mask, max_new_tokens=4,
                                                               streamer=TextStreamer(None))


def test_a_row_with_no_token_is_refused_as_empty_not_as_right_padding():
    """A batch row whose attention_mask is all zeros has no token: plain generate() runs it on what its
    attention implementation makes of a query that sees no key, and sdpa and eager give it different
    scores for the same weights (checked below), so there is no one output to reproduce. It is refused as an
    empty row, naming the fix (not with the padding_side hint, which cannot fix it); a row with one
    token left is run and equals plain (the control: the refusal is the empty row's alone)."""
    target = tiny_model("llama")
    batch = ids(batch=2)
    mask = torch.ones_like(batch)
    mask[1] = 0
    words = r"hides every token of row 1: .*drop it from the batch, or give it at least one unmasked token"
    with pytest.raises(ValueError, match=words) as error:
        run(target, target, batch, attention_mask=mask, nodes=4)
    assert "padding_side" not in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(ValueError, match=r"hides every token of rows 0, 1: .*drop them from the batch"):
        run(target, target, batch, attention_mask=torch.zeros_like(batch), nodes=4)
    logits = {}  # plain's scores for the first new token: the prompt's forward, its last column
    for attn in ("sdpa", "eager"):
        target.config._attn_implementation = attn
        with torch.no_grad():
            logits[attn] = target(batch, attention_mask=mask).logits[:, -1]
    target.config._attn_implementation = "sdpa"
    apart = (logits["sdpa"] - logits["eager"]).abs().amax(dim=-1)
    assert apart[1] > 1e-2 and apart[0] < 1e-5  # the empty row's depend on the kernel; a full row's only round
    mask[1, -1] = 1  # one token left: a left-padded row like any other
    assert torch.equal(run(target, target, batch, attention_mask=mask, nodes=4),
                       target.generate(batch, attention_mask=mask, max_new_tokens=5, do_sample=False))


def test_prompt_longer_than_the_context():
    target = tiny_model("gpt2")  # learned positions: n_positions = 256
    with pytest.raises(ValueError, match="context holds 256.*shorten the prompt"):
        run(target, target, ids(300))


def test_missing_draft_model():
    target = tiny_model("llama")
    with pytest.raises(ValueError, match="needs draft_model="):
        target.generate(ids(), max_new_tokens=3, custom_generate=speculative_generate)


def test_tree_arguments_without_a_draft():
    from opttree import speculative

    model = speculative(tiny_model("llama"))
    with pytest.raises(ValueError, match="need draft_model="):
        model.generate(ids(), max_new_tokens=3, nodes=10)


def test_a_static_cache_with_a_batch_is_refused_by_name():
    """A static cache is honoured for one prompt (tests/test_static_cache.py); a batch's rows share a cache
    that grows and compacts, so a static one is refused there, naming the fix."""
    target = tiny_model("llama")
    with pytest.raises(NotImplementedError, match="StaticCache with a batch"):
        run(target, target, ids(batch=2), cache_implementation="static")


def test_a_draft_on_the_meta_device_is_refused_up_front_and_its_fix_works():
    """A draft built under torch.device("meta") has no weights (before: "Cannot copy out of meta tensor"
    from the tree builder, mid-draft). Refused before any forward, by every way in; the fix it names
    (to_empty, then load weights) works."""
    from test_contract import counted_forwards, ways

    target = tiny_model("llama")
    target.generation_config.eos_token_id = None
    with torch.device("meta"):
        draft = tiny_model("llama", seed=1)
    for way, call in ways(target, draft).items():
        with counted_forwards(target) as forwards, pytest.raises(ValueError, match=r"draft model's weights are on "
                                                                 r"the meta device.*to_empty"):
            call(input_ids=ids(), max_new_tokens=4, do_sample=False, nodes=4)
        assert forwards == [], way
    draft.to_empty(device="cpu")
    draft.load_state_dict(tiny_model("llama", seed=1).state_dict())
    plain = target.generate(ids(), max_new_tokens=5, do_sample=False)
    assert torch.equal(run(target, draft, ids(), nodes=4), plain)


def test_a_target_on_the_meta_device_is_refused_by_name():
    with torch.device("meta"):
        target = tiny_model("llama")
    with pytest.raises(ValueError, match="target model's weights are on the meta device"):
        run(target, "prompt_lookup", ids())


def test_the_output_is_long_as_plain_s_whatever_the_prompt_s_dtype():
    target = tiny_model("llama")
    prompt = ids().to(torch.int32)
    plain = target.generate(prompt, max_new_tokens=5, do_sample=False)
    out = run(target, target, prompt, nodes=4)
    assert out.dtype == plain.dtype == torch.long and out.device == plain.device
    assert torch.equal(out, plain)
