"""`opttree distill --kind eagle3` (opttree.distill.eagle3): a head trained in the EAGLE-3 layout
itself. On a tiny random Llama target: the folder is the layout's (keys, config, d2t as offsets, t2d),
loads with opttree.load_draft and as draft_model=<folder>, decodes greedy-equal to plain generate(),
exports to the last bit; the training forward is the drafter's (pairing at t + 1, pre-norm h2 fed
back); training lowers the loss on its data. Negative controls: features paired at t, the normed h2
fed back, d2t written as absolute ids, a learning rate of 0."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

import opttree
from eagle_folders import target_for
from opttree import speculative
from opttree.distill.eagle3 import unroll
from opttree.distill.eagle3.head import new_eagle3_head
from opttree.distill.eagle3.train import Eagle3TrainConfig, taps_records, train_eagle3
from opttree.distill.eagle3.vocab import draft_vocabulary
from opttree.distill.data.features import features_of
from opttree.distill.train.head_data import make_batch
from opttree.distill.train.head_loss import kept_index, shifted
from opttree.distill.train.shared import split_records
from opttree.drafters.head.eagle import EagleHead, default_taps
from opttree.tree import DraftTree

VD = 64
CFG = Eagle3TrainConfig(draft_vocab_size=VD, unroll=3, epochs=100.0, max_steps=60, batch_tokens=256, max_len=32,
                        lr=3e-3, warmup_steps=5, eval_every=0, val_fraction=0.2, save_dtype="float32")
LAYOUT_KEYS = {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} | {
    f"midlayer.{k}.weight" for k in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                     "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "hidden_norm",
                                     "input_layernorm", "post_attention_layernorm")}


def answers(target, n=20, seed=0):
    """The target's own greedy continuations of random prompts (what distill trains on)."""
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(3, 90, (n, 6), generator=g)
    with torch.no_grad():
        return list(target.generate(prompts, max_new_tokens=34, do_sample=False))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    target = target_for("llama")
    taps = default_taps(target.config.num_hidden_layers)
    records = [features_of(target, ids, 16, layers=taps) for ids in answers(target)]
    out = tmp_path_factory.mktemp("eagle3") / "head"
    result = train_eagle3(target, records, out, CFG)
    return target, records, out, result


def loss_on(head, records):
    """The training loss (all passes) of ``head`` over ``records``' pieces, eval mode."""
    pieces = taps_records(records, head.c.taps, CFG.max_len)
    with torch.no_grad():
        loss, _ = unroll.batch_loss(head.eval(), unroll.paired(make_batch(pieces)), CFG.unroll, kept_index(head))
    return float(loss)


def test_the_folder_is_the_eagle3_layout(trained):
    target, records, out, _ = trained
    state = load_file(str(out / "model.safetensors"))
    config = json.loads((out / "config.json").read_text())
    assert set(state) == LAYOUT_KEYS  # no embedding: the target's is read
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["num_hidden_layers"] == 1
    assert config["norm_before_residual"] is False and config["draft_vocab_size"] == VD and config["vocab_size"] == 96
    assert "eagle_config" not in config  # the default taps (2, L//2, L-3): the loader's own default
    h = target.config.hidden_size
    assert state["fc.weight"].shape == (h, 3 * h) and state["midlayer.self_attn.q_proj.weight"].shape[1] == 2 * h
    assert state["lm_head.weight"].shape == (VD, h)
    # d2t is an offset onto the most frequent tokens of the training texts; t2d marks them
    train_records, _ = split_records(records, CFG.val_fraction, 0)
    used = draft_vocabulary(train_records, 96, VD)
    assert state["d2t"].dtype == torch.int64 and torch.equal(torch.arange(VD) + state["d2t"], used)
    assert state["t2d"].dtype == torch.bool and int(state["t2d"].sum()) == VD and bool(state["t2d"][used].all())
    head = opttree.load_draft(out, target)
    assert isinstance(head, EagleHead) and head.c.taps == default_taps(8) and torch.equal(head.token_ids, used)


def test_d2t_written_as_absolute_ids_is_caught(trained, tmp_path):
    """Negative control: the same folder with d2t = the kept ids themselves is refused by the loader."""
    from safetensors.torch import save_file

    target, _, out, _ = trained
    state = load_file(str(out / "model.safetensors"))
    state["d2t"] = torch.arange(VD) + state["d2t"]
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text((out / "config.json").read_text())
    save_file(state, str(tmp_path / "bad" / "model.safetensors"))
    with pytest.raises(ValueError, match="'d2t' must map each draft id"):
        opttree.load_draft(tmp_path / "bad", target)


@pytest.mark.parametrize("seed", [0, 1])
def test_the_folder_decodes_greedy_equal_to_plain(trained, seed):
    target, _, out, _ = trained
    ids = torch.randint(3, 90, (1, 9), generator=torch.Generator().manual_seed(seed))
    ref = target.generate(ids, max_new_tokens=16, do_sample=False)
    got = speculative(target).generate(ids, max_new_tokens=16, do_sample=False, draft_model=str(out), nodes=10,
                                       threshold=0.0)
    assert torch.equal(got, ref)
    with_head = speculative(target).generate(ids, max_new_tokens=16, do_sample=False,
                                             draft_model=opttree.load_draft(out, target), nodes=10, threshold=0.0)
    assert torch.equal(with_head, ref)


def test_export_round_trips_to_the_last_bit(trained, tmp_path):
    from opttree.distill.eagle3.train import save_eagle3

    target, _, out, _ = trained
    again = opttree.export_draft(opttree.load_draft(out, target), tmp_path / "again", layout="eagle3")
    assert (again / "config.json").read_text() == (out / "config.json").read_text()
    a, b = load_file(str(out / "model.safetensors")), load_file(str(again / "model.safetensors"))
    assert set(a) == set(b) and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)
    # saved in float16: exported in float16 again, every value as it was (a copy, not a float32 file twice the size)
    half = save_eagle3(opttree.load_draft(out, target), tmp_path / "half", "float16")
    c = load_file(str(opttree.export_draft(opttree.load_draft(half, target), tmp_path / "h2") / "model.safetensors"))
    d = load_file(str(half / "model.safetensors"))
    assert d["fc.weight"].dtype == torch.float16
    assert all(c[k].dtype == d[k].dtype and torch.equal(c[k], d[k]) for k in d)


def _drafter_pair(head, target, ids, child):
    """The drafter's logits for the root's children of ``ids`` [1, T] and for the children of ``child``."""
    drafter = head.for_target(target)
    with torch.no_grad():
        drafter.add_features(drafter.features_from(target(ids[:, :-1], output_hidden_states=True).hidden_states))
        q1 = drafter.root_probs(ids[0])
        pool = DraftTree(torch.tensor([child]), torch.tensor([-1]), torch.ones(1))
        q2 = drafter.expand(pool, torch.tensor([0]))[0]
    return q1, q2


def _training_pair(head, target, ids, child):
    """The same two q from the training passes over the text ``ids`` + [child] (features in float32)."""
    text = torch.cat([ids[0], torch.tensor([child])])
    with torch.no_grad():
        states = target(text[None], output_hidden_states=True).hidden_states
        record = features_of(target, text, 16, layers=head.c.taps)
        record["hidden"] = torch.cat([states[i][0] for i in head.c.taps], -1)  # float32, as the drafter reads
        g0, g1 = unroll.unrolled(head, unroll.paired(make_batch([record])), 2)
    m = len(ids[0]) - 1  # entry m - 1: token ids[-1]; pass 1 entry m: token child, reading pass 0's entry m - 1
    return (torch.softmax(head.full_logits(g0[0, m - 1]), -1), torch.softmax(head.full_logits(g1[0, m]), -1))


def test_the_training_forward_is_the_drafters_and_wrong_feeding_is_caught(trained, monkeypatch):
    target, _, out, _ = trained
    head = opttree.load_draft(out, target)
    ids = torch.randint(3, 90, (1, 10), generator=torch.Generator().manual_seed(3))
    child = int(head.token_ids[3])
    for a, b in zip(_drafter_pair(head, target, ids, child), _training_pair(head, target, ids, child)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    # negative control: the features of t paired with token t (not t + 1) draft other q
    monkeypatch.setattr(unroll, "paired", lambda batch: unroll.Paired(
        batch.features[:, 1:], batch.tokens[:, 1:], batch.valid[:, 1:], batch.topk_ids[:, 1:],
        batch.topk_logits[:, 1:], batch.answer[:, 1:]))
    wrong = _training_pair(head, target, ids, child)
    assert not torch.allclose(_drafter_pair(head, target, ids, child)[0], wrong[0], rtol=1e-2, atol=1e-4)
    monkeypatch.undo()
    # negative control: deeper passes fed the normed h2 (not the pre-norm one) draft other q at depth 2
    monkeypatch.setattr(unroll, "shifted", lambda g: shifted(head.norm(g)))
    right, wrong = _drafter_pair(head, target, ids, child), _training_pair(head, target, ids, child)
    torch.testing.assert_close(right[0], wrong[0], rtol=1e-4, atol=1e-6)  # depth 1 does not read it
    assert not torch.allclose(right[1], wrong[1], rtol=1e-2, atol=1e-4)


def test_training_lowers_the_loss_on_its_data(trained):
    target, records, out, result = trained
    start = new_eagle3_head(target, opttree.load_draft(out, target).token_ids)
    before, after = loss_on(start, records), loss_on(opttree.load_draft(out, target), records)
    assert after < 0.7 * before, (before, after)
    assert result.steps == CFG.max_steps and len(result.val_agreement) == CFG.unroll
    assert json.loads((out / "training.json").read_text())["steps"] == CFG.max_steps


def test_a_learning_rate_of_zero_leaves_the_loss_where_it_started(trained, tmp_path):
    """Control of the check above: without learning, the same measure does not drop."""
    from dataclasses import replace

    target, records, _, _ = trained
    out = tmp_path / "still"
    train_eagle3(target, records, out, replace(CFG, lr=0.0, max_steps=3))
    head = opttree.load_draft(out, target)
    assert loss_on(head, records) == pytest.approx(loss_on(new_eagle3_head(target, head.token_ids), records), rel=1e-5)


def test_the_command_trains_from_the_cached_answers(tmp_path):
    """`opttree distill --kind eagle3` after its data step: the taps' features go to their own folder."""
    from opttree.distill.cli import build_parser
    from opttree.distill.eagle3.run import FEATURES_FOLDER, run_eagle3

    assert "eagle3" in build_parser().format_help()
    target = target_for("llama")
    records = [{"input_ids": ids} for ids in answers(target, n=8)]
    args = build_parser().parse_args(["--kind", "eagle3", "--out", str(tmp_path / "out"), "--kept-tokens", "48",
                                      "--unroll", "2", "--batch-tokens", "128", "--eval-every", "0", "--epochs", "1"])
    assert run_eagle3(target, None, records, tmp_path / "cache", args) == 0
    assert (tmp_path / "cache" / FEATURES_FOLDER).is_dir() and not (tmp_path / "cache" / "features").exists()
    assert opttree.load_draft(tmp_path / "out", target).c.draft_vocab_size == 48
