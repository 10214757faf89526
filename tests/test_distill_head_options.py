"""Feature-head options: fused target layers (``HeadConfig.feature_layers``) and more decoder
layers (``num_layers``). Shapes, training passes == drafting, save/load, old heads, growth."""

import json

import pytest
import torch

from models import peaked, tiny_model
from opttree import speculative_generate
from opttree import load_draft
from opttree.distill.data.features import features_of
from opttree.distill.train.head import grown, new_head
from opttree.loading.head_file import save_head
from opttree.distill.train.head_data import pick_layers
from opttree.distill.train.head_train import HeadTrainConfig, chunks, make_batch, train_head, unrolled
from opttree.drafters.head.feature_head import HeadConfig
from test_feature_head import randomised
from opttree.tree import DraftTree

LAYERS = (1, 2, -1)  # a 3-layer tiny target has hidden states 0..3


def texts(n=12, length=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 90, (length,), generator=g) for _ in range(n)]


def target3():
    return peaked(tiny_model("llama", seed=0, layers=3), scale=30.0)


def test_config_needs_the_last_hidden_state_last():
    with pytest.raises(ValueError, match="end with -1"):
        HeadConfig(32, 4, 2, 8, 64, 100, feature_layers=(1, 2))
    c = HeadConfig(32, 4, 2, 8, 64, 100, feature_layers=[1, -1])  # JSON gives lists
    assert c.feature_layers == (1, -1) and c.feature_width == 64


def test_fuse_shapes_and_a_new_fused_head_starts_as_the_plain_one():
    target = target3()
    head, _ = new_head(target, feature_layers=LAYERS)
    plain, _ = new_head(target)
    hidden = target(texts(1, 7)[0][None], output_hidden_states=True).hidden_states  # 4 x [1, 7, 32]
    fused = head.target_features(hidden)
    assert fused.shape == (1, 7, 32)
    torch.testing.assert_close(fused, hidden[-1])  # the projection starts at zero
    assert plain.target_features(hidden) is hidden[-1]
    with torch.no_grad():
        head.fuse_proj.weight.normal_(0, 0.1)
    assert not torch.allclose(head.target_features(hidden), hidden[-1])  # the lower layers now matter
    wide = torch.cat([hidden[i] for i in LAYERS], -1)
    torch.testing.assert_close(head.fuse(wide), head.target_features(hidden))


@pytest.mark.parametrize("num_layers,layers", [(2, (-1,)), (1, LAYERS), (2, LAYERS)])
def test_unrolled_passes_equal_tree_drafting(num_layers, layers):
    target = target3()
    head = randomised(new_head(target, num_layers=num_layers, feature_layers=layers)[0], seed=1)
    root = 6
    text = texts(1, 16)[0]
    record = features_of(target, text, topk=4, layers=layers)
    assert record["hidden"].shape == (16, 32 * len(layers))
    record["hidden"] = record["hidden"].float()
    with torch.no_grad():
        passes = unrolled(head, make_batch([record]), unroll=3, noise=0.0)  # 3 x [1, 16, H]
        fed = head.fuse(record["hidden"][:root])  # what the loop hands the drafter: [root, H]
    drafter = head.for_target(target)
    drafter.add_features(fed)
    drafter.root_probs(text[: root + 1])
    assert drafter.buffers.keys.shape[1] == num_layers * head.c.num_kv_heads and drafter.cached == root + 1
    chain = DraftTree(text[root + 1: root + 3], torch.tensor([-1, 0]), torch.ones(2))
    drafter.expand(chain, torch.tensor([0]))
    drafter.expand(chain, torch.tensor([1]))
    for depth, key in enumerate([-1, 0, 1]):
        torch.testing.assert_close(drafter.predicted_feature(key), passes[depth][0, root + depth], rtol=1e-4, atol=1e-5)
    assert not torch.allclose(drafter.predicted_feature(1), passes[2][0, root + 1], atol=1e-3)


def test_grown_head_computes_what_it_did_then_learns(tmp_path):
    target = target3()
    base, meta = new_head(target, init_layer=-1)
    base = randomised(base, seed=2)
    record = features_of(target, texts(1, 20)[0], topk=4, layers=LAYERS)
    record["hidden"] = record["hidden"].float()
    plain_record = dict(record, hidden=pick_layers(record["hidden"], LAYERS, (-1,)))
    with torch.no_grad():
        before = unrolled(base, make_batch([plain_record]), 3, 0.0)
    big, big_meta = grown(base, meta, target, 2, LAYERS)
    assert big_meta.config["num_layers"] == 2 and tuple(big_meta.config["feature_layers"]) == LAYERS
    with torch.no_grad():
        after = unrolled(big, make_batch([record]), 3, 0.0)
    for a, b in zip(before, after):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="cannot turn"):
        grown(big, big_meta, target, 1, LAYERS)
    # and it trains (new weights get gradients) from a saved plain head, through train_head(init=)
    save_head(base, meta, tmp_path / "base", dtype=torch.float32)
    data = [features_of(target, t, topk=8, layers=LAYERS) for t in texts(12, 32)]
    cfg = HeadTrainConfig(num_kept_tokens=64, unroll=2, epochs=3, batch_tokens=128, max_len=32, lr=3e-3,
                          warmup_steps=2, eval_every=10, val_fraction=0.25, num_layers=2, feature_layers=LAYERS)
    result = train_head(target, data, tmp_path / "big", cfg, init=tmp_path / "base")
    assert result.steps > 0 and all(0.0 <= a <= 1.0 for a in result.val_agreement)
    trained = load_draft(tmp_path / "big", target)
    assert trained.c.num_layers == 2 and trained.fuse_proj.weight.abs().sum() > 0
    assert trained.more_layers[0].self_attn.o_proj.weight.abs().sum() > 0


def test_fused_two_layer_head_saves_loads_and_stays_lossless(tmp_path):
    target = target3()
    head, meta = new_head(target, token_ids=torch.arange(40, 96), num_layers=2, feature_layers=LAYERS)
    head = randomised(head, seed=3)
    save_head(head, meta, tmp_path / "head", dtype=torch.float32)
    saved = json.loads((tmp_path / "head" / "opttree_draft.json").read_text())
    assert saved["config"]["num_layers"] == 2 and saved["config"]["feature_layers"] == list(LAYERS)
    loaded = load_draft(tmp_path / "head", target)
    for a, b in zip(head.state_dict().values(), loaded.state_dict().values()):
        torch.testing.assert_close(a, b)
    # a fused head fed the last hidden state alone (as today's loop does) still cannot change the
    # output: drafts only decide what is verified
    ids = texts(1, 8, seed=5)[0][None]
    ref = target.generate(ids, max_new_tokens=12, do_sample=False)
    out = target.generate(ids, max_new_tokens=12, do_sample=False, custom_generate=speculative_generate,
                          draft_model=loaded, nodes=5)
    assert torch.equal(out, ref)


def test_a_head_saved_before_these_options_still_loads(tmp_path):
    target = target3()
    head, meta = new_head(target, token_ids=torch.arange(40, 96))
    save_head(randomised(head), meta, tmp_path / "old", dtype=torch.float32)
    path = tmp_path / "old" / "opttree_draft.json"
    old = json.loads(path.read_text())
    del old["config"]["num_layers"], old["config"]["feature_layers"]
    path.write_text(json.dumps(old))
    loaded = load_draft(tmp_path / "old", target)
    assert loaded.c.num_layers == 1 and loaded.c.feature_layers == (-1,)
    torch.testing.assert_close(loaded.fc.weight, head.fc.weight)


def test_chunks_pick_the_layers_the_head_reads():
    target = target3()
    record = features_of(target, texts(1, 10)[0], topk=4, layers=LAYERS)
    piece = chunks([record], 8, layers=(2, -1))[0]
    h = 32
    torch.testing.assert_close(piece["hidden"], torch.cat([record["hidden"][:8, h:2 * h], record["hidden"][:8, 2 * h:]], -1))
    legacy = {k: v for k, v in record.items() if k != "layers"}
    legacy["hidden"] = record["hidden"][:, -h:]  # a cache made before fused features: the last layer
    assert chunks([legacy], 8)[0]["hidden"].shape == (8, h)
    with pytest.raises(ValueError, match="extract them again"):
        chunks([legacy], 8, layers=LAYERS)
