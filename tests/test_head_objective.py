"""Issue 34's objective options for a feature head: trained output rows (full or low-rank, their own
learning rate, saved as format /2, old heads still loading, lossless in decoding), HASS's top-K
term, EAGLE-scaled noise, and the recipe keys that set them."""

import json

import pytest
import torch

from models import peaked, tiny_model
from opttree import load_draft, speculative_generate
from opttree.distill.data.features import features_of
from opttree.distill.train.head import new_head, widened, with_trained_rows
from opttree.distill.train.head_loss import kept_index, noised, pass_loss, topk_loss, unrolled
from opttree.distill.train.head_train import HeadTrainConfig, head_optimizer, make_batch, train_head, train_step
from opttree.distill.train.shared import soft_hard_loss
from opttree.loading.head_file import HEAD_FORMAT, HEAD_FORMAT_ROWS, save_head
from test_feature_head import oracle_head, randomised


def target():
    return peaked(tiny_model("llama", seed=0), scale=30.0)


def texts(n=12, length=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 90, (length,), generator=g) for _ in range(n)]


@pytest.mark.parametrize("rank", [0, 4])
def test_trained_rows_start_as_the_targets_rows(rank):
    t = target()
    plain, _ = new_head(t, token_ids=torch.arange(20, 90), init_layer=1)
    rows, _ = new_head(t, token_ids=torch.arange(20, 90), init_layer=1, out_rank=rank)
    rows.load_state_dict(plain.state_dict(), strict=False)
    g = torch.randn(5, t.config.hidden_size)
    torch.testing.assert_close(rows.reduced_logits(g), plain.reduced_logits(g))
    assert len(rows.delta_parameters()) == (1 if rank == 0 else 2) and plain.delta_parameters() == []
    with torch.no_grad():  # once trained, the rows differ (a control: the correction is read)
        rows.delta_parameters()[0].normal_()
    assert not torch.allclose(rows.reduced_logits(g), plain.reduced_logits(g))


def test_drafting_reads_the_rows_as_they_are_now_not_a_stale_copy():
    t = target()
    head, _ = new_head(t, out_rank=0)
    g = torch.randn(3, t.config.hidden_size)
    with torch.inference_mode():
        before = head.reduced_logits(g)
        assert head.output_rows() is head.output_rows()  # summed once while nothing changes
    with torch.no_grad():
        head.out_delta.add_(1.0)  # an optimizer step changes it in place
    with torch.inference_mode():
        after = head.reduced_logits(g)
    torch.testing.assert_close(after, before + g.sum(-1, keepdim=True))


def test_the_rows_learn_at_their_own_rate_and_the_rest_at_lr():
    t = target()
    head, _ = new_head(t, init_layer=1, out_rank=0)
    cfg = HeadTrainConfig(num_kept_tokens=64, unroll=2, batch_tokens=64, lr=1e-2, out_rank=0, out_lr_scale=0.1, bf16=False)
    optim = head_optimizer(head, cfg)
    assert [g["lr_scale"] for g in optim.param_groups] == [1.0, 0.1]
    assert optim.param_groups[1]["params"] == [head.out_delta]
    batch = make_batch([features_of(t, x, topk=4) for x in texts(2)])
    before = head.out_delta.detach().clone()
    train_step(head, optim, batch, cfg, kept_index(head), 1e-2)
    assert [g["lr"] for g in optim.param_groups] == [1e-2, pytest.approx(1e-3)]
    assert not torch.equal(head.out_delta, before)  # trained
    frozen, _ = new_head(t, init_layer=1)  # negative control: no rows to train, one group
    assert len(head_optimizer(frozen, cfg).param_groups) == 1


def test_a_head_with_trained_rows_saves_as_format_2_loads_and_stays_lossless(tmp_path):
    t = target()
    head, meta = new_head(t, token_ids=torch.arange(30, 96), out_rank=0)
    head = randomised(head, seed=4)
    save_head(head, meta, tmp_path / "rows", dtype=torch.float32)
    saved = json.loads((tmp_path / "rows" / "opttree_draft.json").read_text())
    assert saved["format"] == HEAD_FORMAT_ROWS and saved["config"]["out_rank"] == 0
    loaded = load_draft(tmp_path / "rows", t)
    torch.testing.assert_close(loaded.out_delta, head.out_delta)
    g = torch.randn(4, t.config.hidden_size)
    torch.testing.assert_close(loaded.reduced_logits(g), head.reduced_logits(g))
    ids = torch.randint(3, 90, (1, 9), generator=torch.Generator().manual_seed(3))
    ref = t.generate(ids, max_new_tokens=14, do_sample=False)
    for draft in (loaded, load_draft(tmp_path / "rows", t, dtype=torch.bfloat16)):
        out = t.generate(ids, max_new_tokens=14, do_sample=False, custom_generate=speculative_generate,
                         draft_model=draft, nodes=6)
        assert torch.equal(out, ref)


def test_the_format_tag_must_match_the_rows_and_old_heads_still_load(tmp_path):
    t = target()
    head, meta = new_head(t, token_ids=torch.arange(30, 96))
    save_head(randomised(head), meta, tmp_path / "old", dtype=torch.float32)
    saved = json.loads((tmp_path / "old" / "opttree_draft.json").read_text())
    assert saved["format"] == HEAD_FORMAT and "out_rank" not in saved["config"]  # /1 as before
    assert load_draft(tmp_path / "old", t).c.out_rank is None
    rows, meta = new_head(t, token_ids=torch.arange(30, 96), out_rank=2)
    save_head(rows, meta, tmp_path / "rows")
    path = tmp_path / "rows" / "opttree_draft.json"
    bad = json.loads(path.read_text())
    bad["format"] = HEAD_FORMAT  # a /1 tag over trained rows: an older release would drop them
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="does not match its config"):
        load_draft(tmp_path / "rows", t)


def test_an_oracle_head_given_rows_to_train_is_still_the_oracle():
    t = tiny_model("llama", seed=0, layers=1)
    oracle = oracle_head(t)
    _, meta = new_head(t, init_layer=0)
    head, meta = with_trained_rows(oracle, meta, 8)
    assert meta.config["out_rank"] == 8
    g = torch.randn(3, t.config.hidden_size)
    torch.testing.assert_close(head.reduced_logits(g), oracle.reduced_logits(g))
    with pytest.raises(ValueError, match="cannot become"):
        with_trained_rows(head, meta, 0)
    assert with_trained_rows(head, meta, 8)[0] is head


def test_widening_keeps_the_trained_rows_of_the_old_tokens():
    t = target()
    head, _ = new_head(t, token_ids=torch.arange(10, 60), out_rank=0)
    head = randomised(head, seed=1)
    wide = widened(head, t, torch.tensor([5, 70]))
    g = torch.randn(3, t.config.hidden_size)
    old, new = head.full_logits(g), wide.full_logits(g)
    torch.testing.assert_close(new[:, head.token_ids], old[:, head.token_ids])
    assert wide.out_delta[wide.token_ids == 70].abs().sum() == 0  # a new token: the target's own row


def test_topk_term_by_hand():
    full_to_kept = torch.tensor([0, 1, -1, 2])  # id 2 is not kept
    logits = torch.tensor([[1.0, 0.0, 2.0]])  # over kept ids 0, 1, 3
    ids = torch.tensor([[3, 2, 0]])
    top = torch.tensor([[2.0, 1.0, 0.0]])
    p = torch.softmax(top, -1)[0]
    log_q = torch.log_softmax(logits, -1)[0]
    want = -(p[0] * log_q[2] + p[2] * log_q[0])  # id 2 adds nothing
    torch.testing.assert_close(topk_loss(logits, ids, top, full_to_kept, 3), want)
    want2 = -(p[0] * log_q[2])  # k = 2: id 3 and the unkept id 2
    torch.testing.assert_close(topk_loss(logits, ids, top, full_to_kept, 2), want2)


def test_topk_weight_and_reg_weight_enter_the_loss_only_when_set():
    t = target()
    head, _ = new_head(t, init_layer=1)
    batch = make_batch([features_of(t, x, topk=8) for x in texts(2)])
    g = unrolled(head, batch, 1, 0.0)[0]
    fk = kept_index(head)
    base, _ = pass_loss(head, g, batch, 0, fk, 0.0, soft_weight=1.0)
    where = batch.valid
    soft = soft_hard_loss(head.reduced_logits(g[where]), batch.topk_ids[where], batch.topk_logits[where],
                          batch.topk_ids[where][:, 0], fk, soft_weight=1.0)
    torch.testing.assert_close(base, soft)  # reg 0, top-K 0: the distribution's CE alone
    with_topk, _ = pass_loss(head, g, batch, 0, fk, 0.0, soft_weight=1.0, topk_weight=0.5, topk_k=4)
    extra = topk_loss(head.reduced_logits(g[where]), batch.topk_ids[where], batch.topk_logits[where], fk, 4)
    torch.testing.assert_close(with_topk, soft + 0.5 * extra)
    shuffled = make_batch([features_of(t, x, topk=8) for x in texts(2)])
    shuffled.features = torch.randn_like(shuffled.features)  # the regression target only
    assert pass_loss(head, g, shuffled, 0, fk, 0.0, soft_weight=1.0)[0] == base  # reg 0 never reads it
    assert pass_loss(head, g, shuffled, 0, fk, 0.1, soft_weight=1.0)[0] != base


def test_noise_kinds():
    x = torch.ones(2, 8, 4) * 3.0
    valid = torch.ones(2, 8, dtype=torch.bool)
    valid[1, 4:] = False  # the second text is 4 long
    assert noised(x, valid, 0.0) is x
    rms = noised(x, valid, 0.1, "rms") - x
    assert rms.abs().max() <= 0.3 + 1e-6 and rms.abs().max() > 0.1  # ± 0.1 × RMS 3
    torch.manual_seed(0)
    eagle = noised(x, valid, 0.2, "eagle") - x  # (U - 0.5) × 0.2 × 512 / L
    assert eagle[0].abs().max() <= 0.2 * 512 / 8 / 2 + 1e-5 and eagle[0].abs().max() > 0.2 * 512 / 8 / 4
    assert eagle[1].abs().max() > 0.2 * 512 / 8 / 2  # a shorter text gets wider noise, as in EAGLE
    with pytest.raises(ValueError, match="noise_kind"):
        noised(x, valid, 0.1, "gauss")


def test_a_recipe_sets_the_objective_and_a_round_trains_it(tmp_path):
    from opttree.distill.recipes.recipe import parse_recipe

    recipe = parse_recipe({"source": [{"name": "a", "kind": "teacher", "count": 1}],
                           "stage": [{"name": "s", "out_rank": 0, "out_lr_scale": 0.05, "topk_weight": 1.0,
                                      "topk_k": 8, "reg_weight": 0.0, "soft_weight": 1.0, "noise": 0.0,
                                      "noise_kind": "eagle", "epochs": 30}]}, tmp_path)
    cfg = recipe.train_config(recipe.stages[0])
    assert (cfg.out_rank, cfg.out_lr_scale, cfg.topk_weight, cfg.topk_k, cfg.reg_weight, cfg.noise_kind) == \
        (0, 0.05, 1.0, 8, 0.0, "eagle")
    t = target()
    data = [features_of(t, x, topk=8) for x in texts(12)]
    cfg = HeadTrainConfig(num_kept_tokens=64, unroll=2, epochs=2, batch_tokens=128, max_len=32, lr=3e-3,
                          warmup_steps=2, eval_every=10, val_fraction=0.25, reg_weight=0.0, soft_weight=1.0,
                          topk_weight=1.0, noise=0.2, noise_kind="eagle", out_rank=0, bf16=False)
    result = train_head(t, data, tmp_path / "head", cfg)
    loaded = load_draft(tmp_path / "head", t)
    assert result.steps > 0 and loaded.c.out_rank == 0 and loaded.out_delta.abs().sum() > 0
