"""Published EAGLE heads (EAGLE-3 in both key spellings and architecture names, the speculators
layout, EAGLE-1/2) load through opttree.load_draft and draft_model=<folder>, draft the q of a reference
forward written from the published description (tests/eagle_folders.py), stay lossless, and every
folder that does not fit is refused by name. Negative controls: the reference with layer ids one off,
the q/k/v halves swapped, d2t read as absolute ids, EAGLE-1's feature before the final norm: each
must disagree with the drafter."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

import opttree
from eagle_folders import (reference_q, target_for, write_eagle1, write_eagle3, write_speculators)
from opttree import speculative
from opttree.drafters.head.eagle import EagleHead
from opttree.tree import DraftTree


def prompt(seed=0, length=9):
    return torch.randint(3, 90, (1, length), generator=torch.Generator().manual_seed(seed))


def state_of(folder):
    if (folder / "model.safetensors").is_file():
        return load_file(str(folder / "model.safetensors"))
    return torch.load(folder / "pytorch_model.bin", weights_only=True)


def drafted_q(head, target, ids):
    """The drafter's q for the root's children [V], and for the children of the reference's best one."""
    drafter = head.for_target(target)
    with torch.no_grad():
        states = target(ids[:, :-1], output_hidden_states=True).hidden_states
    drafter.add_features(drafter.features_from(states))
    return drafter, drafter.root_probs(ids[0])


def depth2_q(drafter, best):
    pool = DraftTree(torch.tensor([best]), torch.tensor([-1]), torch.ones(1))
    return drafter.expand(pool, torch.tensor([0]))[0]


def assert_drafts_the_reference(head, target, reference, seeds=(0, 1)) -> torch.Tensor:
    """The head's q at depth 1 and 2 equal ``reference(ids)``'s ``(q1, q2, best)`` on each seed's prompt; -> the
    last depth-1 q."""
    for seed in seeds:
        ids = prompt(seed)
        q1_ref, q2_ref, best = reference(ids)
        drafter, q1 = drafted_q(head, target, ids)
        torch.testing.assert_close(q1, q1_ref, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(depth2_q(drafter, best), q2_ref, rtol=1e-4, atol=1e-6)
    return q1


WRITERS = {
    "eagle3-midlayer": lambda f, t: write_eagle3(f, t),
    "eagle3-layers0": lambda f, t: write_eagle3(f, t, spelling="layers.0.", architecture="Eagle3LlamaForCausalLM"),
    "eagle3-full-vocab-bin": lambda f, t: write_eagle3(f, t, vd=96, pickled=True),
    "eagle3-norm-before-residual": lambda f, t: write_eagle3(f, t, norm_before_residual=True),
    "speculators": lambda f, t: write_speculators(f, t),
    "eagle1": lambda f, t: write_eagle1(f, t),
    "eagle1-no-bias-bin": lambda f, t: write_eagle1(f, t, bias=False, pickled=True),
}


def reference_for(name, folder, target, ids, broken=None):
    kind = "eagle1" if name.startswith("eagle1") else "eagle3"
    sd = state_of(folder)
    embed = sd.get("embed_tokens.weight")
    before = name in ("speculators", "eagle3-norm-before-residual")  # speculators: vLLM's default true
    return reference_q(kind, sd, target, ids, broken, embed=embed, norm_before_residual=before)


@pytest.mark.parametrize("name", list(WRITERS))
def test_depth_one_and_two_q_equal_the_reference_forward(name, tmp_path):
    target = target_for("llama")
    folder = WRITERS[name](tmp_path / name, target)
    head = opttree.load_draft(folder, target)
    assert isinstance(head, EagleHead) and head.dtype == torch.float32  # no dtype: float32
    assert_drafts_the_reference(head, target, lambda ids: reference_for(name, folder, target, ids))


@pytest.mark.parametrize("name, broken", [("eagle3-midlayer", "taps+1"), ("eagle3-midlayer", "swap"),
                                          ("eagle3-midlayer", "d2t-absolute"), ("eagle1", "pre-norm")])
def test_each_negative_control_disagrees_with_the_drafter(name, broken, tmp_path):
    """The reference with one rule broken drafts other q: the comparison above would catch a drafter
    that broke it."""
    target = target_for("llama")
    folder = WRITERS[name](tmp_path / name, target)
    head = opttree.load_draft(folder, target)
    ids = prompt(0)
    q1_ref, q2_ref, best = reference_for(name, folder, target, ids, broken)
    drafter, q1 = drafted_q(head, target, ids)
    assert not torch.allclose(q1, q1_ref, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mistral"])
@pytest.mark.parametrize("name", ["eagle3-midlayer", "speculators", "eagle1"])
def test_greedy_with_a_folder_equals_plain(family, name, tmp_path):
    target = target_for(family)
    folder = WRITERS[name](tmp_path / name, target)
    for seed in range(2):
        ids = prompt(seed)
        ref = target.generate(ids, max_new_tokens=16, do_sample=False)
        out = speculative(target).generate(ids, max_new_tokens=16, do_sample=False, draft_model=str(folder),
                                           nodes=10, threshold=0.0, return_dict_in_generate=True)
        assert torch.equal(out.sequences, ref), (family, name, seed)


def test_the_checked_bar_the_stats_tree_holds_the_references_nodes_and_p_hat(tmp_path):
    """load_draft, then draft_model=<folder str>, nodes=10, threshold=0.0: in stats.steps[0].tree the
    depth-1 nodes are the reference's top tokens with p̂ = their q, the depth-2 nodes under the best
    one its top children with p̂ = q1 * q2 (1e-4); the output is plain greedy's."""
    target = target_for("llama")
    folder = write_eagle3(tmp_path / "head", target)
    opttree.load_draft(folder, target)
    ids = prompt(3)
    q1, q2, best = reference_for("eagle3-midlayer", folder, target, ids)
    out = speculative(target).generate(ids, max_new_tokens=12, do_sample=False, draft_model=str(folder), nodes=10,
                                       threshold=0.0, return_dict_in_generate=True)
    assert torch.equal(out.sequences, target.generate(ids, max_new_tokens=12, do_sample=False))
    tree = out.stats.steps[0].tree
    first = (tree.parents == -1).nonzero().flatten()
    tokens, p_hat = tree.tokens[first], tree.path_probs[first]
    assert torch.equal(tokens, q1.topk(len(first)).indices)
    torch.testing.assert_close(p_hat, q1[tokens], rtol=0, atol=1e-4)
    assert int(tokens[0]) == best
    under = (tree.parents == int(first[0])).nonzero().flatten()
    assert len(under) >= 1
    children = tree.tokens[under]
    assert torch.equal(children, q2.topk(len(under)).indices)
    torch.testing.assert_close(tree.path_probs[under], q1[best] * q2[children], rtol=0, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# refused by name


def test_a_target_that_does_not_fit_is_refused_by_name(tmp_path):
    folder = write_eagle3(tmp_path / "head", target_for("llama"))
    with pytest.raises(ValueError, match="hidden size 32 and vocabulary 96; this target has 48 and 96"):
        opttree.load_draft(folder, target_for("llama", hidden=48))
    with pytest.raises(ValueError, match="the target has 6 layers: the default taps 2, L//2, L-3 \\[2, 3, 3\\]"):
        opttree.load_draft(folder, target_for("llama", layers=6))
    head = opttree.load_draft(folder, target_for("llama"))
    with pytest.raises(ValueError, match="loaded for a target with hidden size 32, vocabulary 96 and 8 layers"):
        speculative(target_for("llama", layers=9)).generate(prompt(), max_new_tokens=2, draft_model=head)
    ids = [40, 41, 42]  # explicit ids outside the target
    write_eagle3(tmp_path / "ids", target_for("llama"), eagle_config={"eagle_aux_hidden_state_layer_ids": ids})
    with pytest.raises(ValueError, match="eagle_config.eagle_aux_hidden_state_layer_ids \\[40, 41, 42\\]: id 40 is "
                                         "outside this target's 8 layers"):
        opttree.load_draft(tmp_path / "ids", target_for("llama"))


def test_an_unknown_architecture_is_refused_by_name(tmp_path):
    folder = write_eagle3(tmp_path / "head", target_for("llama"), architecture="MedusaModel")
    with pytest.raises(ValueError, match="\\['MedusaModel'\\] is no draft head's architecture.*LlamaForCausalLMEagle3"):
        opttree.load_draft(folder, target_for("llama"))
    with pytest.raises(ValueError, match="MedusaModel"):
        speculative(target_for("llama")).generate(prompt(), max_new_tokens=2, draft_model=str(folder))


def _rewrite(folder, change):
    state = state_of(folder)
    change(state)
    from safetensors.torch import save_file

    save_file(state, str(folder / "model.safetensors"))


def test_a_missing_or_misshapen_key_is_refused_naming_it_and_both_shapes(tmp_path):
    target = target_for("llama")
    folder = write_eagle3(tmp_path / "missing", target)
    _rewrite(folder, lambda s: s.pop("midlayer.hidden_norm.weight"))
    with pytest.raises(ValueError, match="lack 'midlayer.hidden_norm.weight'"):
        opttree.load_draft(folder, target)
    folder = write_eagle3(tmp_path / "shape", target)
    _rewrite(folder, lambda s: s.update({"fc.weight": torch.zeros(32, 64)}))
    with pytest.raises(ValueError, match="'fc.weight' has shape \\[32, 64\\], but the head its config.json describes "
                                         "needs \\[32, 96\\]"):
        opttree.load_draft(folder, target)
    folder = write_eagle3(tmp_path / "d2t", target)
    _rewrite(folder, lambda s: s.update({"d2t": s["d2t"] + 100}))
    with pytest.raises(ValueError, match="'d2t' must map each draft id j to a distinct target id j \\+ d2t\\[j\\]"):
        opttree.load_draft(folder, target)
    folder = write_eagle3(tmp_path / "lost-d2t", target)
    _rewrite(folder, lambda s: s.pop("d2t"))
    with pytest.raises(ValueError, match="lack 'd2t'"):
        opttree.load_draft(folder, target)


class Gadget:
    """Not a tensor: torch.load(weights_only=True) refuses to build it."""


def test_a_pickle_that_weights_only_refuses_is_refused_by_name(tmp_path):
    target = target_for("llama")
    folder = write_eagle3(tmp_path / "head", target, pickled=True)
    state = torch.load(folder / "pytorch_model.bin", weights_only=True)
    state["extra"] = Gadget()
    torch.save(state, folder / "pytorch_model.bin")
    with pytest.raises(ValueError, match="pytorch_model.bin is a pickle that builds .*Gadget, not only tensors: "
                                         "unpickling it could run code, and opttree never does") as error:
        opttree.load_draft(folder, target)
    assert "weights_only" not in str(error.value)  # never torch's advice to pass weights_only=False


def test_the_heads_own_attention_shape_eps_and_rope_are_read_not_the_targets(tmp_path):
    """Negative control of the loader: the same weights with the target's rms_norm_eps and rope_theta
    written into config.json draft other q (the reference uses the head's own)."""
    import json

    target = target_for("llama")
    folder = write_eagle3(tmp_path / "head", target)
    ids = prompt(0)
    q1_ref, _, _ = reference_for("eagle3-midlayer", folder, target, ids)
    config = json.loads((folder / "config.json").read_text())
    for key, value in (("rms_norm_eps", target.config.rms_norm_eps), ("rope_theta", 10000.0)):
        wrong = dict(config, **{key: value})
        (folder / "config.json").write_text(json.dumps(wrong))
        _, q1 = drafted_q(opttree.load_draft(folder, target), target, ids)
        assert not torch.allclose(q1, q1_ref, rtol=1e-4, atol=1e-6), key
    (folder / "config.json").write_text(json.dumps(config))
    _, q1 = drafted_q(opttree.load_draft(folder, target), target, ids)
    torch.testing.assert_close(q1, q1_ref, rtol=1e-4, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# at tree speed: fixed shapes, batch rows, sampling, auto


def test_the_compiled_step_drafts_the_eager_q_and_greedy_stays_plain(tmp_path):
    from test_compiled_draft import forced

    target = target_for("llama")
    folder = write_eagle3(tmp_path / "head", target)
    head = opttree.load_draft(folder, target)
    ids = prompt(2)
    eager, root = drafted_q(head, target, ids)
    fixed = head.for_target(target).compiled(forced(), 64)
    with torch.no_grad():
        fixed.add_features(fixed.features_from(target(ids[:, :-1], output_hidden_states=True).hidden_states))
    torch.testing.assert_close(fixed.root_probs(ids[0]), root, rtol=1e-4, atol=1e-6)
    pool = DraftTree(torch.tensor([5, 6, 7, 8, 9]), torch.tensor([-1, -1, 0, 0, 2]), torch.ones(5))
    for frontier in ([0, 1], [2, 3], [4]):
        torch.testing.assert_close(fixed.expand(pool, torch.tensor(frontier)),
                                   eager.expand(pool, torch.tensor(frontier)), rtol=1e-4, atol=1e-6)
    ref = target.generate(ids, max_new_tokens=16, do_sample=False)
    out = speculative(target).generate(ids, max_new_tokens=16, do_sample=False, draft_model=str(folder), nodes=10,
                                       compile_config=forced())
    assert torch.equal(out, ref)


def test_a_batch_of_padded_rows_equals_each_rows_plain_greedy(tmp_path):
    target = target_for("llama")
    folder = write_eagle3(tmp_path / "head", target)
    rows = [prompt(0, 9)[0], prompt(1, 5)[0], prompt(2, 1)[0]]  # a one-token prompt: no feature yet
    width = max(len(r) for r in rows)
    ids = torch.stack([torch.cat([torch.zeros(width - len(r), dtype=torch.long), r]) for r in rows])
    mask = torch.stack([torch.cat([torch.zeros(width - len(r)), torch.ones(len(r))]) for r in rows]).long()
    out = speculative(target).generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False,
                                       draft_model=str(folder), nodes=8)
    for b, r in enumerate(rows):
        ref = target.generate(r[None], max_new_tokens=12, do_sample=False)
        assert torch.equal(out[b, width:], ref[0, len(r):]), b


def test_nodes_auto_drafts_with_an_eagle_folder(tmp_path):
    target = target_for("llama")
    folder = write_eagle3(tmp_path / "head", target)
    ids = prompt(0)
    out = speculative(target).generate(ids, max_new_tokens=12, do_sample=False, draft_model=str(folder), nodes="auto")
    assert torch.equal(out, target.generate(ids, max_new_tokens=12, do_sample=False))


def test_sampling_with_an_eagle_head_has_the_targets_two_token_law(tmp_path):
    """The end-to-end check of tests/test_sampling.py (chi-square against the exact two-token law of a
    12-token LM) with an EAGLE-3 head drafting through to_probs."""
    from collections import Counter

    import transformers as tf
    from transformers import MaxLengthCriteria, StoppingCriteriaList

    from opttree import TreeConfig
    from opttree.drafters.head.drafter import FeatureHeadDrafter
    from opttree.hf import kv_cache
    from opttree.loop.generation import DecodeSettings, speculative_decode
    from opttree.verify.sampling import draft_to_probs
    from test_sampling import chi_square, lm_law, processors

    config = tf.LlamaConfig(vocab_size=12, hidden_size=16, num_hidden_layers=7, num_attention_heads=2,
                            num_key_value_heads=1, intermediate_size=32, max_position_embeddings=64)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    target = tf.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        target.get_output_embeddings().weight.mul_(4.0)
    import eagle_folders
    monkey = pytest.MonkeyPatch()
    monkey.setattr(eagle_folders, "VOCAB", 12)
    folder = write_eagle3(tmp_path / "head", target, vd=8)
    monkey.undo()
    head = opttree.load_draft(folder, target)
    procs = processors("t0.7")
    start = [3, 7, 1]
    law = {}
    for a in range(12):
        pa = float(lm_law(target, procs, start)[a])
        law_b = lm_law(target, procs, start + [a])
        for b in range(12):
            law[(a, b)] = pa * float(law_b[b])
    settings_config = TreeConfig(nodes=6, max_depth=3, threshold=0.0, strategy="opt", verifier="match")
    stop = StoppingCriteriaList([MaxLengthCriteria(max_length=len(start) + 2)])
    g = torch.Generator().manual_seed(0)
    counts, n = Counter(), 600
    with torch.inference_mode():
        for _ in range(n):
            drafter = FeatureHeadDrafter(head, to_probs=draft_to_probs(procs))
            settings = DecodeSettings(settings_config, procs, stop, max_length=len(start) + 2, context_length=64,
                                      do_sample=True, generator=g)
            result = speculative_decode(target, drafter, torch.tensor([start]), kv_cache.new_cache(target), settings)
            counts[tuple(result.sequences[0, len(start):].tolist())] += 1
    stat, critical = chi_square(counts, law, n)
    assert stat < critical, (stat, critical)


# ---------------------------------------------------------------------------------------------
# export


def _q_pair(head, target, ids):
    drafter, q1 = drafted_q(head, target, ids)
    return q1, depth2_q(drafter, int(q1.argmax()))


@pytest.mark.parametrize("name", list(WRITERS))
def test_export_then_load_drafts_the_same_q_to_the_last_bit(name, tmp_path):
    import json

    target = target_for("llama")
    head = opttree.load_draft(WRITERS[name](tmp_path / name, target), target)
    layout = "eagle1" if name.startswith("eagle1") else "eagle3"
    out = opttree.export_draft(head, tmp_path / "out", layout=layout)
    again = opttree.load_draft(out, target)
    for seed in range(2):
        ids = prompt(seed)
        for a, b in zip(_q_pair(head, target, ids), _q_pair(again, target, ids)):
            assert torch.equal(a, b), name
    with torch.no_grad():  # negative control: an export through float16 (a lossy one) is caught
        for parameter in again.parameters():
            parameter.copy_(parameter.half().float())
    assert not torch.equal(_q_pair(head, target, prompt(0))[0], _q_pair(again, target, prompt(0))[0])
    keys = set(load_file(str(out / "model.safetensors")))
    config = json.loads((out / "config.json").read_text())
    if layout == "eagle3":
        assert {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} <= keys
        assert any(k.startswith("midlayer.") for k in keys) and not any(k.startswith("layers.") for k in keys)
        assert config["architectures"] == ["LlamaForCausalLMEagle3"]
        assert config["norm_before_residual"] is (name in ("speculators", "eagle3-norm-before-residual"))
        assert "eagle_config" not in config  # the default taps: no ids written
        assert ("embed_tokens.weight" in keys) == (name == "speculators")


def test_export_writes_layer_ids_only_where_they_differ_from_the_default(tmp_path):
    import json

    target = target_for("llama")
    ids = [1, 3, 6]
    folder = write_eagle3(tmp_path / "head", target, eagle_config={"eagle_aux_hidden_state_layer_ids": ids})
    out = opttree.export_draft(opttree.load_draft(folder, target), tmp_path / "out")
    config = json.loads((out / "config.json").read_text())
    assert config["eagle_aux_hidden_state_layer_ids"] == ids  # vLLM reads the top level first
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 2, 5]  # SGLang adds 1
    assert opttree.load_draft(out, target).c.taps == tuple(ids)


def test_an_exported_folder_passes_the_reference(tmp_path):
    target = target_for("llama")
    out = opttree.export_draft(opttree.load_draft(write_eagle3(tmp_path / "head", target), target), tmp_path / "out")
    ids = prompt(1)
    q1_ref, q2_ref, best = reference_for("eagle3-midlayer", out, target, ids)
    drafter, q1 = drafted_q(opttree.load_draft(out, target), target, ids)
    torch.testing.assert_close(q1, q1_ref, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(depth2_q(drafter, best), q2_ref, rtol=1e-4, atol=1e-6)


def test_opttrees_own_head_is_refused_naming_what_has_no_eagle_form(tmp_path):
    from opttree.distill.train.head import new_head

    target = target_for("llama")
    head = new_head(target, out_rank=64)[0]
    with pytest.raises(ValueError, match="no EAGLE form.*entry mixes the embedding.*trained correction of the "
                                         "target's output rows \\(rank 64\\)"):
        opttree.export_draft(head, tmp_path / "out")
    eagle1 = opttree.load_draft(write_eagle1(tmp_path / "e1", target), target)
    with pytest.raises(ValueError, match="this is an eagle1 head: it exports as layout='eagle1'"):
        opttree.export_draft(eagle1, tmp_path / "out")
    with pytest.raises(ValueError, match="layout='medusa': export writes 'eagle3' or 'eagle1'"):
        opttree.export_draft(eagle1, tmp_path / "out", layout="medusa")


def test_the_export_command_writes_the_folder(tmp_path, capsys):
    from opttree import cli

    target = target_for("llama")
    target.save_pretrained(tmp_path / "target")
    folder = write_eagle3(tmp_path / "head", target)
    assert cli.main(["export", str(folder), str(tmp_path / "out"), "--target", str(tmp_path / "target")]) == 0
    assert "wrote" in capsys.readouterr().out
    assert (tmp_path / "out" / "model.safetensors").is_file()
    head = opttree.load_draft(tmp_path / "out", target)
    assert torch.equal(_q_pair(head, target, prompt(0))[0],
                       _q_pair(opttree.load_draft(folder, target), target, prompt(0))[0])


@pytest.mark.parametrize("name", ["eagle3-midlayer", "speculators", "eagle1"])
def test_bench_with_an_eagle_folder_runs_and_stays_lossless(name, tmp_path, monkeypatch):
    """`opttree bench --draft <folder>` for every layout: the folder is loaded as a head (not by
    from_pretrained), opttree decodes the questions, and exit code 0 says every answer equals plain's."""
    import json

    from opttree.bench import cli as bench_cli, models as bench_models
    from test_bench import QUESTIONS, CharTokenizer

    target = target_for("llama")
    folder = WRITERS[name](tmp_path / name, target)
    monkeypatch.setattr(bench_models, "load_target", lambda spec, dtype, device: (target, CharTokenizer()))
    loaded = []
    real = bench_models.load_draft_model
    monkeypatch.setattr(bench_models, "load_draft_model",
                        lambda spec, t, dtype, device: loaded.append(real(spec, t, dtype, device)) or loaded[-1])
    path = tmp_path / "q.jsonl"
    path.write_text("\n".join(json.dumps(q) for q in QUESTIONS) + "\n")
    code = bench_cli.main(["--questions", str(path), "--draft", str(folder), "--quick", "--max-new-tokens", "8",
                           "--no-progress", "--methods", "plain,opttree", "--out", str(tmp_path / "out"),
                           "--device", "cpu"])
    assert code == 0
    assert isinstance(loaded[0], EagleHead)
    assert bench_models.is_eagle_head(folder) and not bench_models.is_eagle_head(tmp_path / "out")
    target.save_pretrained(tmp_path / "model")  # a draft model's folder (a plain LlamaForCausalLM) is no head
    assert not bench_models.is_eagle_head(tmp_path / "model")


def test_a_hub_name_resolves_to_its_cached_snapshot_offline(tmp_path):
    """draft_model="org/name" and load_draft("org/name") through huggingface_hub's snapshot_download with
    HF_HUB_OFFLINE=1 and a cache laid out as the Hub's (refs/main -> snapshots/<commit>/): nothing
    reaches the network. Negative control: a name the cache lacks is refused, naming the fix."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--acme--tiny-eagle3"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    write_eagle3(repo / "snapshots" / commit, target_for("llama"))
    code = """
import torch, opttree
from eagle_folders import target_for
target = target_for("llama")
head = opttree.load_draft("acme/tiny-eagle3", target)
ids = torch.tensor([[5, 9, 14, 3, 27, 8]])
out = opttree.speculative(target).generate(ids, max_new_tokens=8, do_sample=False, draft_model="acme/tiny-eagle3", nodes=6)
print(type(head).__name__, torch.equal(out, target.generate(ids, max_new_tokens=8, do_sample=False)))
try:
    opttree.load_draft("acme/not-cached", target)
except ValueError as error:
    print("refused:", error)
"""
    tests = str(Path(__file__).parent)
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp_path / "hub"),
               PYTHONPATH=os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert lines[0] == "Eagle3Head True"
    assert "'acme/not-cached': the Hub repository is not in the local cache" in lines[1] and "hf download" in lines[1]


@pytest.mark.parametrize("name", ["eagle3-layers0", "speculators", "eagle1"])
def test_a_folder_string_through_every_way_in(name, tmp_path):
    """draft_model=<folder str> on generate(custom_generate=...), speculative(target) and
    SpeculativeGenerator, greedy and sampled (a seed gives the same output twice), and a MixedDrafter
    of the loaded head with prompt lookup."""
    from opttree import MixedDrafter, SpeculativeGenerator, speculative_generate

    target = target_for("qwen2")
    folder = str(WRITERS[name](tmp_path / name, target))
    ids = prompt(4)
    ref = target.generate(ids, max_new_tokens=12, do_sample=False)
    assert torch.equal(target.generate(ids, max_new_tokens=12, do_sample=False, custom_generate=speculative_generate,
                                       draft_model=folder, nodes=6), ref)
    assert torch.equal(SpeculativeGenerator(target, folder, nodes=6).generate(ids, max_new_tokens=12,
                                                                            do_sample=False), ref)
    mixed = MixedDrafter(opttree.load_draft(folder, target), weight=0.5)
    assert torch.equal(speculative(target).generate(ids, max_new_tokens=12, do_sample=False, draft_model=mixed,
                                                    nodes=6), ref)
    runs = [speculative(target).generate(ids, max_new_tokens=12, do_sample=True, temperature=0.8, draft_model=folder,
                                         nodes=6, generator=torch.Generator().manual_seed(7)) for _ in range(2)]
    assert torch.equal(runs[0], runs[1])
