"""An EAGLE-3 head's ``eagle_aux_hidden_state_layer_ids`` read where and as vLLM reads them (the
top level first, then ``eagle_config``; id k the state entering layer k, transformers'
``output_hidden_states[k]``; tapped low to high), checked against the reference forward of
tests/eagle_folders.py fed from the named layers; what vLLM would not tap as the head's fc reads it
is refused in one line naming the field, the id and the target's layer count. An export writes ids
that vLLM and SGLang (which reads ``eagle_config`` alone and adds 1) read as the same layers, and
records the target's layer count, which the loader checks. Negative controls: the reference fed
from the default taps disagrees with the drafter; the export without its record loads on a target of
another depth (the record is what refuses it). Rule and sources: DESIGN.md, "EAGLE heads"."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import opttree
from eagle_folders import reference_q, target_for, write_eagle3, write_speculators
from test_eagle_heads import _q_pair, assert_drafts_the_reference, depth2_q, drafted_q, prompt, state_of

IDS = "eagle_aux_hidden_state_layer_ids"
TAPS = [1, 3, 6]  # on the 8-layer target: not the default (2, 4, 5), none shared with it but none at its ends
SGLANG_FORM = [t - 1 for t in TAPS]  # what SGLang reads (+1) as TAPS: a reader of the wrong list taps (0, 2, 5)


def vllm_reads(config: dict) -> list | None:
    """vLLM 0.32's gpu_model_runner._get_eagle3_aux_layers_from_config (None: its default)."""
    return config.get(IDS) or (config.get("eagle_config") or {}).get(IDS) or None


def sglang_reads(config: dict) -> list | None:
    """SGLang 0.5.23: eagle_config's list alone (spec_aux_hidden_state.py), +1 for a Llama target
    (models/llama.py set_eagle3_layers_to_capture); None: its default."""
    ids = (config.get("eagle_config") or {}).get(IDS)
    return None if ids is None else [i + 1 for i in ids]


CASES = {  # name: (writer, expected taps)
    "top": (lambda f, t: write_eagle3(f, t, **{IDS: TAPS}), TAPS),
    "nested": (lambda f, t: write_eagle3(f, t, eagle_config={IDS: TAPS}), TAPS),
    "top-before-nested": (lambda f, t: write_eagle3(f, t, **{IDS: TAPS}, eagle_config={IDS: SGLANG_FORM}), TAPS),
    "empty-top-then-nested": (lambda f, t: write_eagle3(f, t, **{IDS: []}, eagle_config={IDS: TAPS}), TAPS),
    "unsorted-low-to-high": (lambda f, t: write_eagle3(f, t, **{IDS: [6, 1, 3]}), TAPS),
    "speculators-top": (lambda f, t: write_speculators(f, t, **{IDS: TAPS}), TAPS),
    # vLLM builds a speculators config from transformer_layer_config and the lifted top-level ids
    "speculators-outer-eagle_config-unread": (lambda f, t: write_speculators(f, t, eagle_config={IDS: TAPS}),
                                              [2, 4, 5]),
}


def reference(folder, target, ids, taps):
    sd = state_of(folder)
    speculators = "embed_tokens.weight" in sd
    return reference_q("eagle3", sd, target, ids, embed=sd.get("embed_tokens.weight"),
                       norm_before_residual=speculators, taps=taps)


@pytest.mark.parametrize("name", list(CASES))
def test_the_named_layers_are_the_ones_drafted_from(name, tmp_path):
    target = target_for("llama")
    writer, taps = CASES[name]
    folder = writer(tmp_path / name, target)
    head = opttree.load_draft(folder, target)
    assert head.c.taps == tuple(taps)
    q1 = assert_drafts_the_reference(head, target, lambda ids: reference(folder, target, ids, taps))
    other = [2, 4, 5] if taps == TAPS else TAPS  # negative control: the reference on the other layers
    assert not torch.allclose(q1, reference(folder, target, prompt(1), other)[0], rtol=1e-4, atol=1e-6)


def test_greedy_with_top_level_ids_stays_plain(tmp_path):
    target = target_for("llama")
    folder = write_eagle3(tmp_path / "head", target, **{IDS: TAPS})
    ids = prompt(0)
    out = opttree.speculative(target).generate(ids, max_new_tokens=12, do_sample=False, draft_model=str(folder),
                                               nodes=8)
    assert torch.equal(out, target.generate(ids, max_new_tokens=12, do_sample=False))


REFUSED = {  # config.json fields on the 8-layer target: the one-line refusal
    "out-of-range-top": ({IDS: [1, 3, 99]}, r"eagle_aux_hidden_state_layer_ids \[1, 3, 99\]: id 99 is outside this "
                                            r"target's 8 layers"),
    "out-of-range-nested": ({"eagle_config": {IDS: [1, 3, 99]}},
                            r"eagle_config\.eagle_aux_hidden_state_layer_ids \[1, 3, 99\]: id 99 is outside this "
                            r"target's 8 layers"),
    "negative": ({IDS: [-1, 3, 5]}, r"\[-1, 3, 5\]: id -1 is outside this target's 8 layers"),
    "the-last-output": ({IDS: [1, 3, 8]}, r"\[1, 3, 8\]: id 8 is the target's last layer's output before the final "
                                          r"norm \(this target has 8 layers\); opttree does not support it yet"),
    "twice": ({IDS: [3, 3, 5]}, r"\[3, 3, 5\] names layer 3 twice \(the target has 8 layers\): vLLM taps each layer "
                                r"once"),
    "not-an-int": ({IDS: [1, 3, "5"]}, r"\[1, 3, '5'\]: '5' is not a layer id"),
    "a-bool": ({IDS: [1, True, 5]}, r"True is not a layer id"),
    "four-for-an-fc-of-three": ({IDS: [1, 3, 5, 6]}, r"\[1, 3, 5, 6\] names 4 layers \(the target has 8\), but vLLM "
                                                     r"builds the head's fc for 3 states"),
    "not-a-list": ({IDS: "1,3,5"}, r"eagle_aux_hidden_state_layer_ids must be a list of layer ids, got '1,3,5'"),
    "eagle_config-not-an-object": ({"eagle_config": [1, 3, 5]}, r"'eagle_config' must be a JSON object"),
    "a-bad-record": ({"opttree": {"target_num_hidden_layers": "8"}},
                     r"opttree\.target_num_hidden_layers must be a positive integer, got '8'"),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_ids_vllm_would_not_tap_are_refused_in_one_line(name, tmp_path):
    fields, message = REFUSED[name]
    target = target_for("llama")
    folder = write_eagle3(tmp_path / name, target, **fields)
    with pytest.raises(ValueError, match=message) as caught:
        opttree.load_draft(folder, target)
    assert "\n" not in str(caught.value) and "config.json" in str(caught.value)


def test_a_speculators_top_level_id_out_of_range_is_refused_naming_it(tmp_path):
    target = target_for("llama")
    folder = write_speculators(tmp_path / "head", target, **{IDS: [1, 3, 40]})
    with pytest.raises(ValueError, match=r"eagle_aux_hidden_state_layer_ids \[1, 3, 40\]: id 40 is outside this "
                                         r"target's 8 layers"):
        opttree.load_draft(folder, target)


def _in_bfloat16(folder):
    """The folder's weights rewritten in bfloat16 (its config saying so), as published heads often are."""
    state = load_file(str(folder / "model.safetensors"))
    state = {k: v.bfloat16() if v.is_floating_point() else v for k, v in state.items()}
    save_file(state, str(folder / "model.safetensors"))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(config, torch_dtype="bfloat16")))
    return folder


def test_export_then_load_keeps_the_ids_and_the_dtype(tmp_path):
    target = target_for("llama")
    folder = _in_bfloat16(write_eagle3(tmp_path / "head", target, **{IDS: [6, 1, 3]}))
    head = opttree.load_draft(folder, target, dtype=torch.bfloat16)
    out = opttree.export_draft(head, tmp_path / "out")
    config = json.loads((out / "config.json").read_text())
    assert vllm_reads(config) == TAPS and sglang_reads(config) == TAPS  # both engines tap the same layers
    assert config[IDS] == TAPS and config["eagle_config"][IDS] == SGLANG_FORM
    assert config["opttree"] == {"target_num_hidden_layers": 8}
    assert {v.dtype for v in load_file(str(out / "model.safetensors")).values() if v.is_floating_point()} == \
        {torch.bfloat16}
    again = opttree.load_draft(out, target, dtype=torch.bfloat16)
    assert again.c.taps == tuple(TAPS) and again.dtype == torch.bfloat16
    for a, b in zip(_q_pair(head, target, prompt(0)), _q_pair(again, target, prompt(0))):
        assert torch.equal(a, b)


def test_an_exported_folder_drafts_from_the_named_layers(tmp_path):
    target = target_for("llama")
    source = write_eagle3(tmp_path / "head", target, eagle_config={IDS: TAPS})
    out = opttree.export_draft(opttree.load_draft(source, target), tmp_path / "out")
    ids = prompt(1)
    q1_ref, q2_ref, best = reference(out, target, ids, TAPS)
    drafter, q1 = drafted_q(opttree.load_draft(out, target), target, ids)
    torch.testing.assert_close(q1, q1_ref, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(depth2_q(drafter, best), q2_ref, rtol=1e-4, atol=1e-6)


def test_the_default_taps_are_written_as_no_ids_which_both_engines_default(tmp_path):
    target = target_for("llama")
    out = opttree.export_draft(opttree.load_draft(write_eagle3(tmp_path / "head", target), target), tmp_path / "out")
    config = json.loads((out / "config.json").read_text())
    assert vllm_reads(config) is None and sglang_reads(config) is None
    assert IDS not in config and "eagle_config" not in config


@pytest.mark.parametrize("fields", [{IDS: TAPS}, {}], ids=["explicit-ids", "default-taps"])
def test_the_layer_count_record_refuses_a_target_of_another_depth(fields, tmp_path):
    """Same width and vocabulary, 9 layers: the explicit ids fit it and the default taps (2, 4, 6) too,
    so without the record the folder loads (the negative control) and drafts from other states."""
    target, deeper = target_for("llama"), target_for("llama", layers=9)
    out = opttree.export_draft(opttree.load_draft(write_eagle3(tmp_path / "head", target, **fields), target),
                               tmp_path / "out")
    with pytest.raises(ValueError, match=r"exported for a target of 8 layers \(opttree.target_num_hidden_layers\), "
                                         r"but this target has 9: pass the target it was exported for") as caught:
        opttree.load_draft(out, deeper)
    assert "\n" not in str(caught.value)
    config = json.loads((out / "config.json").read_text())
    del config["opttree"]
    (out / "config.json").write_text(json.dumps(config))
    assert opttree.load_draft(out, deeper).c.target_layers == 9
