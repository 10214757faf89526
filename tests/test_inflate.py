"""inflate(): a Llama-family model made wider and deeper computes what its source computes (logits
within rounding, greedy output equal), drafts made for the source work against it unchanged, and
what cannot be inflated is refused by name before anything is allocated."""

import pytest
import torch
import transformers as tf

from models import VOCAB, peaked
from opttree.bench.inflate import INFLATED_FROM, SIZES, Shape, inflate, parameter_bytes, parse_size, inflated_config
from opttree.hf.width import CARRIED_WIDTH, carried_width


def source_model(family: str, seed: int = 0, hidden: int = 96, heads: int = 6, kv: int = 2, layers: int = 3,
                 bias: bool = False):
    torch.manual_seed(seed)
    common = dict(vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                  num_key_value_heads=kv, intermediate_size=2 * hidden + 8, max_position_embeddings=256,
                  rms_norm_eps=1e-5)
    if family == "llama":
        config = tf.LlamaConfig(**common, attention_bias=bias, mlp_bias=bias)
    elif family == "mistral":
        config = tf.MistralConfig(**common, sliding_window=None)
    else:
        config = tf.Qwen2Config(**common)
    config._attn_implementation = "sdpa"
    model = tf.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # norms away from 1 and biases away from 0, so a wrong rescaling or placement shows
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            elif name.endswith("bias"):
                p.normal_(0, 0.5)
    model.generation_config.pad_token_id = 0
    return model


BIG = Shape(hidden_size=512, intermediate_size=600, num_attention_heads=32, num_key_value_heads=8, num_hidden_layers=5)
CASES = [("llama", dict(), BIG),
         ("llama", dict(bias=True, heads=4, kv=4), Shape(256, 300, 8, 8, 4)),  # biases; one query head per group
         ("qwen2", dict(), Shape(384, 400, 12, 4, 3)),  # query/key/value biases; wider, same depth
         ("qwen2", dict(), Shape(384, 400, 12, 4, 5)),  # deeper: its config's layer_types must grow with it
         ("mistral", dict(), Shape(384, 400, 12, 4, 6))]
CASE_IDS = ["llama", "llama-bias", "qwen2", "qwen2-deeper", "mistral-deeper"]


@pytest.mark.parametrize("family, kwargs, shape", CASES, ids=CASE_IDS)
def test_the_inflated_model_computes_what_its_source_computes(family, kwargs, shape):
    small = source_model(family, **kwargs)
    big = inflate(small, shape)
    assert big.config.hidden_size == shape.hidden_size and len(big.model.layers) == shape.num_hidden_layers
    assert sum(p.numel() for p in big.parameters()) > 3 * sum(p.numel() for p in small.parameters())
    tokens = torch.randint(0, VOCAB, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want, got = small(tokens).logits, big(tokens).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-5)
    hidden = big(tokens, output_hidden_states=True).hidden_states
    assert hidden[-1][..., small.config.hidden_size:].abs().max() == 0  # the new entries stay zero
    prompt = tokens[:1, :6]
    plain = small.generate(prompt, max_new_tokens=24, do_sample=False)
    assert torch.equal(big.generate(prompt, max_new_tokens=24, do_sample=False), plain)


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral"])
def test_a_deeper_inflated_target_gives_plain_s_greedy_tokens_through_opttree(family):
    """More layers than the source (qwen2's config carries one layer type per layer: before, its
    source's list was copied and transformers refused the config). Through opttree, with the source as
    the draft, the inflated target writes the source's plain greedy tokens. Control: an added layer
    that computed something (random weights instead of zeros) would change the logits."""
    from opttree import speculative_generate

    small = peaked(source_model(family, seed=4), 3.0)
    big = inflate(small, Shape(192, 240, 12, 4, 5))
    assert len(big.model.layers) == big.config.num_hidden_layers == 5
    if family == "qwen2":
        assert big.config.layer_types == ["full_attention"] * 5 and small.config.layer_types == ["full_attention"] * 3
    prompt = torch.tensor([[3, 17, 42, 8, 9, 33]])
    plain = small.generate(prompt, max_new_tokens=20, do_sample=False)
    out = big.generate(prompt, custom_generate=speculative_generate, draft_model=small, nodes=6, max_new_tokens=20,
                       do_sample=False, return_dict_in_generate=True)
    assert out.sequences.tolist() == plain.tolist()
    assert max(out.stats.accept_lengths) > 1  # the draft is accepted beyond the root: the tree did the work
    with torch.no_grad():
        for p in big.model.layers[-1].parameters():
            p.normal_(0, 0.5)
        assert not torch.allclose(big(prompt).logits, small(prompt).logits, rtol=1e-4, atol=1e-4)


def test_an_added_layer_of_another_kind_is_refused_by_name():
    """check_layer_types: the config derives the new depth's layer types by its family's rule; where
    that rule would make an added layer slide, inflate() refuses (it takes full attention only)."""
    from opttree.bench.inflate import check_layer_types

    source = tf.Qwen2Config(num_hidden_layers=3)
    check_layer_types(source, tf.Qwen2Config(num_hidden_layers=5))  # full attention throughout: fine
    sliding = tf.Qwen2Config(num_hidden_layers=5, use_sliding_window=True, sliding_window=16, max_window_layers=3)
    assert sliding.layer_types[3:] == ["sliding_attention"] * 2
    with pytest.raises(ValueError, match="cannot give this qwen2 model 5 layers: .*sliding_attention"):
        check_layer_types(source, sliding)
    check_layer_types(tf.LlamaConfig(num_hidden_layers=3), tf.LlamaConfig(num_hidden_layers=5))  # no layer_types


def test_a_wrong_rescaling_would_show():
    """Negative control: the same inflation with the norms NOT rescaled changes the logits."""
    import opttree.bench.inflate as inflate_module

    small = source_model("llama")
    big = inflate(small, BIG)
    with torch.no_grad():
        for name, p in big.named_parameters():
            if name.endswith("norm.weight"):
                p.mul_(1.01)
    tokens = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(2))
    assert not torch.allclose(big(tokens).logits, small(tokens).logits, rtol=1e-4, atol=1e-4)
    assert inflate_module.math.sqrt(96 / 512) != 1


def test_the_source_is_left_as_it_is_and_the_shape_is_recorded():
    small = source_model("llama")
    before = {k: v.clone() for k, v in small.state_dict().items()}
    big = inflate(small, BIG)
    assert all(torch.equal(v, small.state_dict()[k]) for k, v in before.items())
    assert getattr(big.config, INFLATED_FROM)["hidden_size"] == 96
    assert getattr(big.config, CARRIED_WIDTH) == 96 and carried_width(big.config) == 96  # a field any target may carry
    assert carried_width(small.config) == 96 and not hasattr(small.config, CARRIED_WIDTH)
    assert big.config.rms_norm_eps == pytest.approx(1e-5 * 96 / 512)
    assert big.generation_config.pad_token_id == 0


def test_inflation_builds_in_the_dtype_asked():
    big = inflate(source_model("llama"), BIG, dtype=torch.bfloat16)
    assert {p.dtype for p in big.parameters()} == {torch.bfloat16}


def test_named_sizes_and_explicit_shapes():
    assert parse_size("7b") == SIZES["7b"] and parse_size(BIG) is BIG
    text = "hidden_size=512,intermediate_size=600,num_attention_heads=32,num_key_value_heads=8,num_hidden_layers=5"
    assert parse_size(text) == BIG
    with pytest.raises(ValueError, match="1b, 7b, or give every field"):
        parse_size("13b")
    with pytest.raises(ValueError, match="give every field"):
        parse_size("hidden_size=512")


@pytest.mark.parametrize("shape, words", [
    (Shape(64, 600, 32, 8, 5), "hidden_size 64 < 96"),  # smaller than the source
    (Shape(512, 600, 32, 8, 2), "num_hidden_layers 2 < 3"),
    (Shape(512, 600, 32, 16, 5), "2 per group; the source's groups hold 3: give at least 48"),
    (Shape(512, 600, 32, 6, 5), "must be a multiple of num_key_value_heads 6"),
    (Shape(500, 600, 32, 8, 5), "hidden_size 500 must be a multiple of num_attention_heads 32"),
])
def test_a_shape_that_cannot_hold_the_source_is_refused_by_name(shape, words):
    with pytest.raises(ValueError, match=words):
        inflate(source_model("llama"), shape)


@pytest.mark.parametrize("family", ["gpt2", "gemma", "phi"])
def test_a_model_that_is_not_llama_shaped_is_refused_by_name(family):
    from models import tiny_model

    with pytest.raises(ValueError, match="Llama-family"):
        inflate(tiny_model(family), BIG)


def test_a_sliding_window_model_is_refused_by_name():
    config = tf.MistralConfig(vocab_size=VOCAB, hidden_size=96, num_hidden_layers=2, num_attention_heads=6,
                              num_key_value_heads=2, intermediate_size=200, sliding_window=16)
    with pytest.raises(ValueError, match="full attention only"):
        inflate(tf.AutoModelForCausalLM.from_config(config), BIG)


def test_a_size_that_does_not_fit_is_refused_before_anything_is_allocated(monkeypatch):
    import opttree.bench.inflate as inflate_module

    small = source_model("llama")
    need = parameter_bytes(inflated_config(small.config, BIG), torch.float32, type(small))
    monkeypatch.setattr(inflate_module, "free_bytes", lambda device: need - 1)
    made = []
    monkeypatch.setattr(torch.nn.Module, "to_empty", lambda self, **kw: made.append(self))
    with pytest.raises(MemoryError, match=f"needs {need / 2**30:.1f} GiB .* pick a smaller size, bfloat16"):
        inflate(small, BIG)
    assert made == []
    monkeypatch.undo()
    assert need == 4 * sum(p.numel() for p in inflate(small, BIG).parameters())  # the bytes it names are the weights'


@pytest.mark.parametrize("kind", ["head", "draft"])
def test_drafts_made_for_the_source_draft_against_the_inflated_target_as_against_the_source(kind, tmp_path):
    """A feature head (reading layers 1 and the last) and a draft model (sharing the embedding), saved
    for the source and loaded against the inflated target: the same output and the same accepted
    lengths as against the source."""
    from opttree import load_draft, speculative_generate
    from opttree.distill.train.head import new_head
    from opttree.distill.train.model import init_draft
    from opttree.loading.draft_model import save_draft
    from opttree.loading.head_file import save_head

    small = peaked(source_model("llama", seed=3), 3.0)
    big = inflate(small, BIG)
    torch.manual_seed(5)
    if kind == "head":
        draft, meta = new_head(small, init_layer=0, feature_layers=(1, -1))
        with torch.no_grad():
            draft.fuse_proj.weight.normal_(0, 0.05)
        save_head(draft, meta, tmp_path / kind, dtype=torch.float32)
    else:
        draft, meta = init_draft(small, [0, 1, 2], torch.arange(VOCAB))  # all its layers: it agrees
        save_draft(draft, meta, tmp_path / kind, dtype=torch.float32)
    prompt = torch.tensor([[3, 17, 42, 8, 9]])
    runs = {}
    for name, target in (("source", small), ("inflated", big)):
        out = target.generate(prompt, custom_generate=speculative_generate, draft_model=load_draft(tmp_path / kind, target),
                              nodes=6, max_new_tokens=20, do_sample=False, return_dict_in_generate=True)
        runs[name] = (out.sequences.tolist(), out.stats.accept_lengths)
    assert runs["inflated"][0] == small.generate(prompt, max_new_tokens=20, do_sample=False).tolist()
    assert runs["inflated"] == runs["source"]
    assert max(runs["source"][1]) > 1  # control: the draft is accepted beyond the root, so a wrong draft would show


def test_the_cpus_free_memory_counts_the_page_cache_the_kernel_gives_back(tmp_path):
    """MemAvailable, not the free pages alone: after a large read the page cache holds most of the memory,
    and a refusal by free pages would refuse a stand-in that fits (it did, at 0.4 GiB free of 22 available)."""
    from opttree.bench.inflate import free_bytes, meminfo_available

    fake = tmp_path / "meminfo"
    fake.write_text("MemTotal:       24000000 kB\nMemFree:          400000 kB\nMemAvailable:   22000000 kB\n")
    assert meminfo_available(str(fake)) == 22000000 * 1024
    assert meminfo_available(str(tmp_path / "none")) is None  # no such file: the caller falls back
    real = meminfo_available()
    if real is not None:
        assert free_bytes(torch.device("cpu")) == real
