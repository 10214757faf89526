"""Training a feature head: the unrolled training passes are exactly the drafting computation,
and the pipeline (features -> train -> save -> load -> draft) runs end to end on a tiny target."""

import pytest
import torch

from models import peaked, tiny_model
from opttree import speculative_generate
from opttree.distill import load_draft
from opttree.distill.features import extract_features, features_of, load_features, unique_sequences
from opttree.distill.head import new_head
from opttree.distill.head_train import HeadTrainConfig, make_batch, train_head, unrolled
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
        torch.testing.assert_close(drafter.predicted[key], passes[depth][0, root + depth], rtol=1e-4, atol=1e-5)
    # and not some other position of that pass (the check can fail)
    assert not torch.allclose(drafter.predicted[1], passes[2][0, root + 1], atol=1e-3)


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
