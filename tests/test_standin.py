"""The cost stand-in as a plain Hugging Face folder (bench/standin.py) and its EAGLE-3 head inflated to
match (bench/inflate_head.py): the folder reloads with from_pretrained as an ordinary Llama (no
quantization_config, the carried width kept) and writes the source's greedy tokens; the inflated head,
written as an EAGLE-3 folder with its taps named, drafts against the stand-in the q the source head
drafts against the source (within float rounding: the stand-in's states differ from the source's by
rounding, its norms rescaled, and fc sums over zero-padded inputs in another order). Negative
controls: the head read at the engines' default taps for the stand-in's depth, or at taps one off,
drafts other q. Refused in one line: a head whose taps the stand-in lacks, a target that is not the
head's target inflated, a folder that is not new."""

from __future__ import annotations

import json

import pytest
import torch
import transformers as tf

import opttree
from eagle_folders import target_for, write_eagle3, write_speculators
from models import VOCAB
from test_eagle_heads import _q_pair, prompt
from test_inflate import source_model
from opttree.bench.inflate import INFLATED_FROM, Shape, inflate, layer_places
from opttree.bench.inflate_head import inflate_eagle3_head, tap_places, write_inflated_head
from opttree.bench.standin import main, write_inflated
from opttree.hf.width import CARRIED_WIDTH

IDS = "eagle_aux_hidden_state_layer_ids"
WIDE = Shape(384, 400, 12, 4, 5)  # from source_model's 96 wide, 3 layers
HEAD_WIDE = Shape(64, 96, 8, 4, 12)  # from target_for's 32 wide, 8 layers: the default taps move to (2, 6, 9)
HEAD_SAME_DEPTH = Shape(64, 96, 8, 4, 8)  # as "1b" from SmolLM2: wider, the same depth (taps = the defaults)


# -- the stand-in's folder ---------------------------------------------------------------------------

def test_the_written_stand_in_reloads_as_a_plain_llama_that_writes_the_source_s_tokens(tmp_path):
    small = source_model("llama")
    small.config.quantization_config = {"quant_method": "gguf"}  # as SmolLM2 loaded from its GGUF file
    folder = write_inflated(small, None, WIDE, tmp_path / "standin")
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config and config["architectures"] == ["LlamaForCausalLM"]
    assert config[CARRIED_WIDTH] == 96 and config[INFLATED_FROM]["num_hidden_layers"] == 3
    assert config["hidden_size"] == 384 and config["num_hidden_layers"] == 5
    assert (folder / "model.safetensors").is_file() and not list(folder.glob("*.bin"))
    big = tf.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa").eval()
    assert type(big) is tf.LlamaForCausalLM and getattr(big.config, "quantization_config", None) is None
    assert big.config.to_dict()[CARRIED_WIDTH] == 96  # survives the round trip (vLLM ignores the field)
    tokens = torch.randint(0, VOCAB, (1, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(big(tokens).logits, small(tokens).logits, rtol=1e-5, atol=2e-5)
    prompt_ids = tokens[:, :6]
    plain = small.generate(prompt_ids, max_new_tokens=24, do_sample=False)
    assert torch.equal(big.generate(prompt_ids, max_new_tokens=24, do_sample=False), plain)
    with torch.no_grad():  # control: a stand-in whose added layer computes something writes other logits
        for p in big.model.layers[4].parameters():
            p.normal_(0, 0.5)
        assert not torch.allclose(big(tokens).logits, small(tokens).logits, rtol=1e-4, atol=1e-4)


def test_the_stand_in_is_written_in_the_dtype_asked(tmp_path):
    from safetensors import safe_open

    folder = write_inflated(source_model("llama"), None, WIDE, tmp_path / "bf16", dtype=torch.bfloat16)
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}
    assert json.loads((folder / "config.json").read_text())["dtype"] == "bfloat16"


def test_a_folder_that_is_not_new_and_a_size_that_cannot_hold_the_source_are_refused_before_writing(tmp_path):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "x").write_text("mine")
    with pytest.raises(ValueError, match=r"taken is not empty \(it holds x\)"):
        write_inflated(source_model("llama"), None, WIDE, taken)
    with pytest.raises(ValueError, match="hidden_size 64 < 96"):
        write_inflated(source_model("llama"), None, Shape(64, 300, 12, 4, 5), tmp_path / "new")
    assert not (tmp_path / "new").exists() and (taken / "x").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]  # no partial folder left behind


@pytest.mark.parametrize("argv, words", [
    (["--size", "13b", "--out", "OUT"], "size '13b': name one of 1b, 7b"),
    (["--size", "1b", "--out", "OUT", "--head", "h"], "--head and --head-out go together"),
    (["--size", "1b", "--out", "OUT", "--target", "no/such/folder/x"], "no such folder"),
])
def test_the_command_line_refuses_in_one_line_before_any_model_loads(argv, words, tmp_path, capsys, monkeypatch):
    import opttree.bench.models as models

    monkeypatch.setattr(models, "load_target", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(SystemExit) as exit_:
        main([str(tmp_path / a) if a == "OUT" else a for a in argv])
    assert exit_.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert words in error and not (tmp_path / "OUT").exists()


def test_the_command_line_writes_the_stand_in_and_its_head(tmp_path, monkeypatch, capsys):
    import opttree.bench.models as models

    target = target_for("llama")
    head = write_eagle3(tmp_path / "head", target)
    monkeypatch.setattr(models, "check_target_spec", lambda spec: None)
    monkeypatch.setattr(models, "load_target", lambda spec, dtype, device: (target, None))
    size = "hidden_size=64,intermediate_size=96,num_attention_heads=8,num_key_value_heads=4,num_hidden_layers=12"
    assert main(["--target", "tiny", "--size", size, "--out", str(tmp_path / "big"), "--dtype", "float32",
                 "--head", str(head), "--head-out", str(tmp_path / "big-head")]) == 0
    assert capsys.readouterr().out.count("wrote ") == 2
    big = tf.AutoModelForCausalLM.from_pretrained(tmp_path / "big").eval()
    inflated = opttree.load_draft(tmp_path / "big-head", big)
    assert inflated.c.taps == (2, 4, 5) and inflated.c.target_layers == 12
    torch.testing.assert_close(_q_pair(inflated, big, prompt(0))[0],
                               _q_pair(opttree.load_draft(head, target), target, prompt(0))[0], rtol=1e-5, atol=1e-6)


# -- the inflated EAGLE-3 head ----------------------------------------------------------------------

def test_each_source_layer_s_input_state_is_where_tap_places_says():
    """The map the head's taps follow is the one inflate() places layers by: the inflated state at the
    mapped index carries the source's state entering layer t."""
    small = source_model("llama")
    big = inflate(small, WIDE)
    assert layer_places(3, 5) == (0, 1, 2)
    tokens = torch.randint(0, VOCAB, (1, 10), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = small(tokens, output_hidden_states=True).hidden_states
        got = big(tokens, output_hidden_states=True).hidden_states
    for t, place in enumerate(tap_places((0, 1, 2), 3, 5)):  # HF's entry L is after the final norm: not a tap
        torch.testing.assert_close(got[place][..., :96], want[t], rtol=1e-5, atol=1e-5)
        assert got[place][..., 96:].abs().max() == 0
    assert tap_places((3,), 3, 5) == (3,)  # vLLM's id L: the state after the last source layer
    torch.testing.assert_close(got[3], got[4])  # entering the zero layers, the stream stays as it was
    assert not torch.allclose(got[2][..., :96], want[1], rtol=1e-3, atol=1e-3)  # control: a neighbour differs


HEADS = {"eagle3": lambda f, t: write_eagle3(f, t), "speculators": lambda f, t: write_speculators(f, t)}


@pytest.mark.parametrize("shape", [HEAD_WIDE, HEAD_SAME_DEPTH], ids=["deeper", "same-depth"])
@pytest.mark.parametrize("kind", list(HEADS))
def test_the_inflated_head_drafts_the_source_head_s_q(kind, shape, tmp_path):
    target = target_for("llama")
    source_folder = HEADS[kind](tmp_path / "head", target)
    big = inflate(target, shape)
    folder = write_inflated_head(source_folder, target, big, tmp_path / "inflated")
    config = json.loads((folder / "config.json").read_text())
    assert config[IDS] == [2, 4, 5] and config["eagle_config"][IDS] == [1, 3, 4]  # named even where the default
    assert config["target_hidden_size"] == 64 and config["hidden_size"] == 32 and config["opttree"] == {
        "target_num_hidden_layers": shape.num_hidden_layers}
    source_head, head = opttree.load_draft(source_folder, target), opttree.load_draft(folder, big)
    assert head.c.taps == (2, 4, 5) and head.c.own_embedding and head.c.target_hidden_size == 64
    for seed in range(3):
        ids = prompt(seed)
        for got, want in zip(_q_pair(head, big, ids), _q_pair(source_head, target, ids)):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    with torch.no_grad():  # the head alone, on the source's states zero-padded: only fc's sums may differ
        states = target(prompt(0), output_hidden_states=True).hidden_states
        padded = [torch.nn.functional.pad(s, (0, 32)) for s in states]
        torch.testing.assert_close(head.target_features(padded), source_head.target_features(states),
                                   rtol=1e-6, atol=1e-7)  # bit-equal here (2026-11, AMX Xeon), not promised
    if shape is HEAD_WIDE:  # negative control: the folder without its ids is read at the default (2, 6, 9)
        del config[IDS], config["eagle_config"]
        (folder / "config.json").write_text(json.dumps(config))
        default = opttree.load_draft(folder, big)
        assert default.c.taps == (2, 6, 9)
        assert not torch.allclose(_q_pair(default, big, prompt(0))[0], _q_pair(source_head, target, prompt(0))[0],
                                  rtol=1e-3, atol=1e-4)


def test_taps_one_off_draft_other_q(tmp_path):
    """Negative control for the map: the inflated head read one layer off drafts other q."""
    target = target_for("llama")
    source_head = opttree.load_draft(write_eagle3(tmp_path / "head", target), target)
    big = inflate(target, HEAD_WIDE)
    folder = write_inflated_head(source_head, target, big, tmp_path / "inflated")
    config = json.loads((folder / "config.json").read_text())
    config[IDS], config["eagle_config"][IDS] = [3, 5, 6], [2, 4, 5]
    (folder / "config.json").write_text(json.dumps(config))
    shifted = opttree.load_draft(folder, big)
    assert not torch.allclose(_q_pair(shifted, big, prompt(0))[0], _q_pair(source_head, target, prompt(0))[0],
                              rtol=1e-3, atol=1e-4)


def test_the_inflated_pair_decodes_as_the_source_pair(tmp_path):
    """Through opttree: the stand-in with the inflated head writes the source's plain greedy tokens with
    the same accepted lengths as the source with its head; the head is left as it was."""
    from opttree import speculative_generate

    target = target_for("llama")
    source_head = opttree.load_draft(write_eagle3(tmp_path / "head", target, vd=VOCAB), target)
    before = {k: v.clone() for k, v in source_head.state_dict().items()}
    big = inflate(target, HEAD_WIDE)
    head = inflate_eagle3_head(source_head, target, big)
    assert all(torch.equal(v, source_head.state_dict()[k]) for k, v in before.items())
    ids = prompt(0)
    runs = {}
    for name, (model, draft) in {"source": (target, source_head), "inflated": (big, head)}.items():
        out = model.generate(ids, custom_generate=speculative_generate, draft_model=draft, nodes=6,
                             max_new_tokens=20, do_sample=False, return_dict_in_generate=True)
        runs[name] = (out.sequences.tolist(), out.stats.accept_lengths)
    assert runs["inflated"] == runs["source"]
    assert runs["source"][0] == target.generate(ids, max_new_tokens=20, do_sample=False).tolist()


def test_a_head_whose_taps_the_stand_in_lacks_is_refused_by_name(tmp_path):
    target = target_for("llama")  # 8 layers; the head reads (2, 4, 5)
    folder = write_eagle3(tmp_path / "head", target)
    shallow = inflate(target_for("llama", layers=4), Shape(64, 96, 8, 4, 5))  # 5 layers: no layer 5
    with pytest.raises(ValueError, match=r"tap 5 \(the state entering layer 5 of its 8-layer target\) does not exist "
                                         r"in the inflated target, which has 5 layers") as error:
        write_inflated_head(folder, target, shallow, tmp_path / "out")
    assert "\n" not in str(error.value) and not (tmp_path / "out").exists()


STAND_INS = {  # case: the target passed as the stand-in of target_for("llama")
    "not-inflated": lambda: target_for("llama"),
    "another-shape": lambda: inflate(target_for("llama", hidden=48), HEAD_WIDE),
    "another-model-of-its-shape": lambda: inflate(target_for("llama", seed=1), HEAD_WIDE),
    "eagle1": lambda: inflate(target_for("llama"), HEAD_WIDE),
}


@pytest.mark.parametrize("case, words", [
    ("not-inflated", "no 'opttree_inflated_from': it is no cost stand-in"),
    ("another-shape", "inflated from a model of shape .*'hidden_size': 48.*, not from the head's target"),
    ("another-model-of-its-shape", "embedding is not the head's target's"),
    ("eagle1", "takes an EAGLE-3 head"),
])
def test_a_target_or_head_that_does_not_pair_is_refused_in_one_line(case, words, tmp_path):
    from eagle_folders import write_eagle1

    target = target_for("llama")
    folder = (write_eagle1 if case == "eagle1" else write_eagle3)(tmp_path / "head", target)
    other = STAND_INS[case]()
    with pytest.raises(ValueError, match=words) as error:
        write_inflated_head(folder, target, other, tmp_path / "out")
    assert "\n" not in str(error.value)


# -- the real target ----------------------------------------------------------------------------------

@pytest.mark.real_model
@pytest.mark.slow
def test_real_smollm2_s_stand_in_folder_reloads_with_its_tokenizer_and_writes_smollm2_s_text(tmp_path):
    """SmolLM2 from its GGUF file, inflated (a small stand-in: 12 query heads over SmolLM2's 3 key/value
    heads, 31 layers) and written in float32: from_pretrained loads it as a plain Llama with SmolLM2's
    tokenizer, and its greedy output equals SmolLM2's on the project's prompts."""
    from test_real_model import own_prompts
    from threads import real_model_threads
    from opttree.smollm2 import fetch_smollm2, load_smollm2

    threads = torch.get_num_threads()
    torch.set_num_threads(real_model_threads())
    try:
        target, tokenizer = load_smollm2(fetch_smollm2())  # the GGUF folder given: read as given
        assert getattr(target.config, "quantization_config", None) is not None  # the GGUF's (control)
        folder = write_inflated(target, tokenizer, Shape(588, 1540, 12, 3, 31), tmp_path / "smollm2-standin")
        assert "quantization_config" not in json.loads((folder / "config.json").read_text())
        big = tf.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa").eval()
        again = tf.AutoTokenizer.from_pretrained(folder)
        assert big.config.to_dict()[CARRIED_WIDTH] == 576
        for text in own_prompts()[:3]:
            chat = [{"role": "user", "content": text}]
            ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt",
                                                return_dict=True)
            reread = again.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)
            assert torch.equal(reread["input_ids"], ids["input_ids"])
            plain = target.generate(**ids, max_new_tokens=24, do_sample=False)
            assert torch.equal(big.generate(**ids, max_new_tokens=24, do_sample=False), plain)
    finally:
        torch.set_num_threads(threads)
