"""EAGLE heads with scaled RoPE (linear, llama3, yarn) draft with the rotary frequencies and cos/sin
scaling that transformers' own ``LlamaRotaryEmbedding`` computes for a ``LlamaConfig`` of the HEAD's
config.json fields (the reference here is transformers' module, independent of opttree's code); the
q equal a reference forward rotated by it, greedy stays plain, export writes the settings back and
the round trip is exact. Negative controls: the scaling ignored (plain theta) gives other cos/sin at
the low-frequency dimensions; 'dynamic' and 'longrope' (their frequencies depend on the run's
length) are refused naming the type."""

from __future__ import annotations

import json

import pytest
import torch
import transformers as tf

import opttree
from eagle_folders import THETA, reference_q, target_for, write_eagle1, write_eagle3
from opttree import speculative
from opttree.drafters.head.layer import rotary
from test_eagle_heads import _q_pair, drafted_q, depth2_q, prompt, state_of

MAX_POSITIONS = 512  # the head's max_position_embeddings (yarn and llama3 read the original one below it)
SCALINGS = {
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64},
    "linear": {"type": "linear", "factor": 2.0},  # the legacy key, as older config.json files spell it
    "yarn": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64},  # 512 / 64
}


def write(folder, target, kind, writer=write_eagle3, key="rope_scaling"):
    return writer(folder, target, **{key: dict(SCALINGS[kind])}, max_position_embeddings=MAX_POSITIONS)


def transformers_cos_sin(folder, positions):
    """cos, sin [n, d] of transformers' LlamaRotaryEmbedding for a LlamaConfig of the folder's fields."""
    raw = json.loads((folder / "config.json").read_text())
    fields = {k: raw[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "rope_theta",
                                  "rope_scaling", "rope_parameters", "max_position_embeddings") if k in raw}
    embedding = tf.models.llama.modeling_llama.LlamaRotaryEmbedding(tf.LlamaConfig(**fields))
    with torch.no_grad():
        cos, sin = embedding(torch.zeros(1, dtype=torch.float32), positions[None])
    return cos[0], sin[0]


def head_cos_sin(head, positions):
    cos, sin = head.decoder_layers()[0].cos_sin(positions[None])
    return cos[0, 0], sin[0, 0]


@pytest.mark.parametrize("kind", list(SCALINGS))
def test_the_heads_cos_sin_are_transformers_for_its_own_config(kind, tmp_path):
    target = target_for("llama")
    folder = write(tmp_path / kind, target, kind)
    head = opttree.load_draft(folder, target)
    positions = torch.arange(301)
    cos, sin = head_cos_sin(head, positions)
    ref_cos, ref_sin = transformers_cos_sin(folder, positions)
    assert torch.equal(cos, ref_cos) and torch.equal(sin, ref_sin)  # to the bit
    assert head.c.rope_theta == THETA and len(head.c.rope_frequencies) == head.c.head_dim // 2
    assert (head.c.rope_attention_scaling > 1.0) == (kind == "yarn")  # yarn's cos/sin scaling is read


def test_the_scaling_ignored_differs_at_the_low_frequency_dimensions(tmp_path):
    """Negative control: the default RoPE of the same theta matches at the highest frequency and not at
    the lowest, where llama3 slows the rotation by its factor."""
    target = target_for("llama")
    folder = write(tmp_path / "llama3", target, "llama3")
    head = opttree.load_draft(folder, target)
    positions = torch.arange(301)
    ref_cos, ref_sin = transformers_cos_sin(folder, positions)
    cos, sin = (t[0, 0] for t in rotary(positions[None], head.c.head_dim, head.c.rope_theta))
    half = head.c.head_dim // 2
    assert torch.equal(cos[:, 0], ref_cos[:, 0])  # wavelength 2π: untouched by llama3
    assert not torch.allclose(cos[:, half - 1], ref_cos[:, half - 1], atol=1e-3)
    assert not torch.allclose(sin[:, half - 1], ref_sin[:, half - 1], atol=1e-3)


@pytest.mark.parametrize("kind", list(SCALINGS))
@pytest.mark.parametrize("layout", ["eagle3", "eagle1"])
def test_q_equal_a_reference_rotated_by_transformers(kind, layout, tmp_path):
    target = target_for("llama")
    folder = write(tmp_path / kind, target, kind, write_eagle3 if layout == "eagle3" else write_eagle1)
    head = opttree.load_draft(folder, target)
    rope = lambda positions: transformers_cos_sin(folder, positions)  # noqa: E731
    ids = prompt(0, 30)  # positions to 29: the dimensions scaled (wavelength over 16) turn visibly
    q1_ref, q2_ref, best = reference_q(layout, state_of(folder), target, ids, rope=rope)
    drafter, q1 = drafted_q(head, target, ids)
    torch.testing.assert_close(q1, q1_ref, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(depth2_q(drafter, best), q2_ref, rtol=1e-4, atol=1e-6)
    plain, _, _ = reference_q(layout, state_of(folder), target, ids)  # control: the default RoPE's q
    assert not torch.allclose(q1, plain, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("key", ["rope_scaling", "rope_parameters"])
def test_greedy_with_a_llama3_folder_equals_plain(key, tmp_path):
    target = target_for("llama")
    folder = write(tmp_path / "llama3", target, "llama3", key=key)
    for seed in range(2):
        ids = prompt(seed)
        ref = target.generate(ids, max_new_tokens=24, do_sample=False)
        out = speculative(target).generate(ids, max_new_tokens=24, do_sample=False, draft_model=str(folder),
                                           nodes=10, threshold=0.0)
        assert torch.equal(out, ref), seed


@pytest.mark.parametrize("kind", list(SCALINGS))
def test_export_writes_the_rope_settings_back_and_round_trips_to_the_bit(kind, tmp_path):
    target = target_for("llama")
    folder = write(tmp_path / kind, target, kind)
    head = opttree.load_draft(folder, target)
    out = opttree.export_draft(head, tmp_path / "out", layout="eagle3")
    written, read = (json.loads((f / "config.json").read_text()) for f in (out, folder))
    for key in ("rope_scaling", "rope_theta", "max_position_embeddings"):
        assert written[key] == read[key], key
    again = opttree.load_draft(out, target)
    assert again.c.rope_frequencies == head.c.rope_frequencies
    for seed in range(2):
        for a, b in zip(_q_pair(head, target, prompt(seed, 20)), _q_pair(again, target, prompt(seed, 20))):
            assert torch.equal(a, b), kind


def test_a_default_head_keeps_its_rope_and_exports_no_scaling(tmp_path):
    target = target_for("llama")
    head = opttree.load_draft(write_eagle3(tmp_path / "head", target, rope_parameters={"rope_type": "default"}),
                              target)
    assert head.c.rope_frequencies == () and head.c.rope_settings == ""
    config = json.loads((opttree.export_draft(head, tmp_path / "out") / "config.json").read_text())
    assert "rope_scaling" not in config and "rope_parameters" not in config


@pytest.mark.parametrize("scaling", [{"rope_type": "dynamic", "factor": 2.0},
                                     {"type": "dynamic", "factor": 2.0},
                                     {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8,
                                      "original_max_position_embeddings": 64}])
def test_a_run_time_rope_type_is_refused_naming_it(scaling, tmp_path):
    target = target_for("llama")
    folder = write_eagle3(tmp_path / "head", target, rope_scaling=scaling)
    kind = scaling.get("rope_type", scaling.get("type"))
    with pytest.raises(ValueError, match=f"RoPE of type '{kind}' is not supported"):
        opttree.load_draft(folder, target)


def test_invalid_scaled_settings_are_refused_naming_the_file(tmp_path):
    target = target_for("llama")
    folder = write_eagle3(tmp_path / "head", target, rope_scaling={"rope_type": "llama3", "factor": 8.0})
    with pytest.raises(ValueError, match="config.json: its 'llama3' RoPE settings are incomplete or invalid"):
        opttree.load_draft(folder, target)


def test_the_compiled_step_drafts_a_yarn_heads_eager_q(tmp_path):
    """The fixed-shape step (compiled) rotates as the eager head does (frequencies and yarn's scaling)."""
    from opttree.tree import DraftTree
    from test_compiled_draft import forced

    target = target_for("llama")
    head = opttree.load_draft(write(tmp_path / "yarn", target, "yarn"), target)
    ids = prompt(2, 20)
    eager, root = drafted_q(head, target, ids)
    fixed = head.for_target(target).compiled(forced(), 64)
    with torch.no_grad():
        fixed.add_features(fixed.features_from(target(ids[:, :-1], output_hidden_states=True).hidden_states))
    torch.testing.assert_close(fixed.root_probs(ids[0]), root, rtol=1e-4, atol=1e-6)
    pool = DraftTree(torch.tensor([5, 6, 7]), torch.tensor([-1, -1, 0]), torch.ones(3))
    for frontier in ([0, 1], [2]):
        torch.testing.assert_close(fixed.expand(pool, torch.tensor(frontier)),
                                   eager.expand(pool, torch.tensor(frontier)), rtol=1e-4, atol=1e-6)
