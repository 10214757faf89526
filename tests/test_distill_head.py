"""Training a feature head: the unrolled training passes are exactly the drafting computation,
and the pipeline (features -> train -> save -> load -> draft) runs end to end on a tiny target."""

import pytest
import torch

from models import peaked, tiny_model
from opttree import speculative_generate
from opttree import load_draft
from opttree.distill.data.features import extract_features, features_of, load_features, unique_sequences
from opttree.distill.train.head import new_head
from opttree.distill.train.head_train import HeadTrainConfig, fitted_steps, make_batch, train_head, unrolled
from opttree.tree import DraftTree


def texts(n=12, length=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 90, (length,), generator=g) for _ in range(n)]


@pytest.mark.parametrize("root", [3, 10])
def test_unrolled_passes_equal_tree_drafting(root):
    target = tiny_model("llama", seed=0)
    head, _ = new_head(target, init_layer=1)
    with torch.no_grad():
        head.fc.weight.normal_(0, 0.2)  # make the feature input matter
    text = texts(1, 16)[0]
    record = features_of(target, text, topk=4)
    record["hidden"] = record["hidden"].float()
    with torch.no_grad():
        passes = unrolled(head, make_batch([record]), unroll=3, noise=0.0)  # 3 x [1, 16, H]
    # drafting: root = text[root], then the chain text[root + 1], text[root + 2]
    drafter = head.for_target(target)
    drafter.add_features(record["hidden"][:root])
    drafter.root_probs(text[: root + 1])
    chain = DraftTree(text[root + 1: root + 3], torch.tensor([-1, 0]), torch.ones(2))
    drafter.expand(chain, torch.tensor([0]))
    drafter.expand(chain, torch.tensor([1]))
    for depth, key in enumerate([-1, 0, 1]):  # pass d at position root + d is the depth-d node
        torch.testing.assert_close(drafter.predicted_feature(key), passes[depth][0, root + depth], rtol=1e-4, atol=1e-5)
    # and not some other position of that pass (the check can fail)
    assert not torch.allclose(drafter.predicted_feature(1), passes[2][0, root + 1], atol=1e-3)


def test_distill_head_end_to_end(tmp_path):
    target = peaked(tiny_model("llama", seed=0), scale=30.0)
    records = [{"input_ids": t} for t in texts(16, 40)]
    sequences = unique_sequences(records + records[:3], max_len=32)
    assert len(sequences) == 16 and all(len(s) == 32 for s in sequences)
    extract_features(target, sequences, tmp_path / "features", topk=8, shard_size=5)
    data = load_features(tmp_path / "features")
    assert len(data) == 16 and data[0]["hidden"].shape == (32, 32)
    cfg = HeadTrainConfig(num_kept_tokens=64, init_layer=-1, unroll=2, epochs=6, batch_tokens=128,
                          max_len=32, lr=3e-3, warmup_steps=2, eval_every=10, val_fraction=0.25)
    result = train_head(target, data, tmp_path / "head", cfg)
    assert result.val_agreement[0] > result.initial_agreement[0]  # it learns
    assert (tmp_path / "head" / "training.json").exists()
    head = load_draft(tmp_path / "head", target)
    ids = texts(1, 8, seed=5)[0][None]
    ref = target.generate(ids, max_new_tokens=20, do_sample=False)
    out = target.generate(ids, max_new_tokens=20, do_sample=False, custom_generate=speculative_generate,
                          draft_model=head, nodes=6, return_dict_in_generate=True)
    assert torch.equal(out.sequences, ref)


def test_answer_positions_are_found_and_scored():
    from opttree.distill.train.head_data import answer_start, chunks

    marker = [7, 8]
    ids = torch.tensor([1, 7, 8, 4, 5, 7, 8, 20, 21, 22])  # the answer starts after the LAST marker
    assert answer_start(ids, marker) == 7
    assert answer_start(ids, []) == 0 and answer_start(torch.tensor([1, 2, 3]), marker) == 0
    record = {"input_ids": ids, "hidden": torch.zeros(10, 4), "topk_ids": torch.zeros(10, 2, dtype=torch.long),
              "topk_logits": torch.zeros(10, 2)}
    pieces = chunks([record], max_len=4, marker=marker)  # positions 0-3, 4-7, 8-9
    # position 6 is the first whose label (the next token, 20) is an answer token
    assert [p["answer_from"] for p in pieces] == [6, 2, 0]  # the first piece has none
    batch = make_batch(pieces)
    assert batch.answer.tolist() == [[False] * 4, [False, False, True, True], [True, True, False, False]]
    assert (batch.answer <= batch.valid).all()
    # answers only: cut from the end (0-1, 2-5, 6-9); the pieces without answer positions dropped
    tail = chunks([record], max_len=4, marker=marker, answers_only=True)
    assert [p["input_ids"].tolist() for p in tail] == [[8, 20, 21, 22]]
    assert [p["answer_from"] for p in tail] == [0]
    tail = chunks([record], max_len=5, marker=[8, 20], answers_only=True)  # answer from 8: 0-4, 5-9
    assert [(p["input_ids"].tolist(), p["answer_from"]) for p in tail] == [([7, 8, 20, 21, 22], 2)]


def test_answers_only_scores_exactly_the_answer_positions():
    from opttree.distill.train.head_train import chunks, kept_index, pass_loss

    target = peaked(tiny_model("llama", seed=0), scale=30.0)
    head, _ = new_head(target, init_layer=1)
    text = texts(2, 40)
    marker = text[0][20:22].tolist()  # the first text's answer starts at 22; the second has no marker
    batch = make_batch(chunks([features_of(target, t, topk=4) for t in text], 64, marker))
    g = unrolled(head, batch, unroll=2, noise=0.0)
    full_to_kept = kept_index(head)
    for depth in (0, 1):
        _, every = pass_loss(head, g[depth], batch, depth, full_to_kept, 0.0)
        _, answers = pass_loss(head, g[depth], batch, depth, full_to_kept, 0.0, answers_only=True)
        assert len(every) == 2 * (40 - depth)
        assert len(answers) == (40 - 21) + (40 - depth)  # from position 21 (predicts token 22) on


def test_widened_head_keeps_its_predictions_for_the_old_tokens():
    from opttree.distill.train.head import widened

    target = tiny_model("llama", seed=0)
    head, _ = new_head(target, torch.arange(10, 60), init_layer=1)
    with torch.no_grad():
        head.out_bias.normal_()
    wide = widened(head, target, torch.tensor([5, 70, 12, 5, 90]))  # 12 is kept already; 5 twice
    assert wide.token_ids.tolist() == [5] + list(range(10, 60)) + [70, 90]
    g = torch.randn(3, target.config.hidden_size)
    old, new = head.full_logits(g), wide.full_logits(g)
    torch.testing.assert_close(new[:, head.token_ids], old[:, head.token_ids])
    assert (new[:, [5, 70, 90]] > torch.finfo(torch.float32).min).all()  # now reachable
    low = torch.quantile(head.out_bias.detach(), 0.05)
    torch.testing.assert_close(wide.out_bias[wide.token_ids == 70], low[None])


def test_fitted_steps_shortens_the_schedule_only_when_it_would_overrun():
    # 100 steps took 60 s: 10 minutes hold 1,000 steps
    assert fitted_steps(100, 60.0, planned=800, max_minutes=10) == 800
    assert fitted_steps(100, 60.0, planned=5000, max_minutes=10) == 1000
    assert fitted_steps(200, 60.0, planned=5000, max_minutes=10, current=1000) == 2000  # faster now: longer
    assert fitted_steps(100, 600.0, planned=5000, max_minutes=1) == 101  # already over: end right away


def test_a_time_limit_ends_the_schedule_not_just_the_loop(tmp_path, caplog):
    target = peaked(tiny_model("llama", seed=0), scale=30.0)
    data = [features_of(target, t, topk=4) for t in texts(8, 24)]
    cfg = HeadTrainConfig(num_kept_tokens=64, unroll=1, epochs=400, batch_tokens=48, max_len=24,
                          warmup_steps=2, eval_every=3, val_fraction=0.25, max_minutes=0.05)
    with caplog.at_level("INFO", logger="opttree.distill.train.head_train"):
        result = train_head(target, data, tmp_path / "head", cfg)
    assert "the schedule now ends at step" in caplog.text
    assert 5 <= result.steps < 400 * 3


@pytest.mark.gpu
def test_head_trains_on_cuda_and_loads_on_cpu(tmp_path):
    target = peaked(tiny_model("llama", seed=0), scale=30.0).to("cuda:0")
    data = [features_of(target, t, topk=8) for t in texts(12, 32)]
    cfg = HeadTrainConfig(num_kept_tokens=64, unroll=2, epochs=4, batch_tokens=128, max_len=32, lr=3e-3,
                          warmup_steps=2, eval_every=10, val_fraction=0.25)
    result = train_head(target, data, tmp_path / "head", cfg)
    assert result.val_agreement[0] > result.initial_agreement[0]
    cpu_target = target.to("cpu")
    head = load_draft(tmp_path / "head", cpu_target)
    ids = texts(1, 8, seed=5)[0][None]
    ref = cpu_target.generate(ids, max_new_tokens=16, do_sample=False)
    out = cpu_target.generate(ids, max_new_tokens=16, do_sample=False, custom_generate=speculative_generate,
                              draft_model=head, nodes=6)
    assert torch.equal(out, ref)
