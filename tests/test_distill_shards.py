"""What a round keeps on disk and learns from: features in 16 bits (float32 only in the batch),
byte-identical shards for identical records (the manifest checks rebuilt shards by sha256), and a
loss over the target's top-k distribution, not only its argmax."""

import math

import torch

from models import tiny_model
from opttree.distill.data.features import features_of
from opttree.distill.train.head_data import make_batch
from opttree.distill.data.shards import load_records, save_records, sha256
from opttree.distill.train.shared import soft_hard_loss


def test_the_same_records_always_give_the_same_bytes(tmp_path):
    records = [{"input_ids": torch.arange(5), "hidden": torch.ones(5, 4, dtype=torch.float16), "kind": "x",
                "layers": [-1], "bf16": False} for _ in range(3)]
    hashes = {sha256(save_records(records, tmp_path / f"shard_{i:05d}.safetensors")) for i in range(16)}
    assert len(hashes) == 1


def test_features_are_kept_in_16_bits_and_trained_in_float32(tmp_path):
    target = tiny_model("llama", seed=0)
    record = features_of(target, torch.arange(3, 20), topk=8, layers=(1, -1))
    assert record["hidden"].dtype == torch.float16 and record["topk_logits"].dtype == torch.float16
    assert record["hidden"].shape == (17, 64) and record["topk_ids"].shape == (17, 8)
    save_records([record], tmp_path / "shard_00000.safetensors")
    stored = load_records(tmp_path / "shard_00000.safetensors")[0]
    assert stored["hidden"].dtype == torch.float16 and torch.equal(stored["hidden"], record["hidden"])
    batch = make_batch([stored])
    assert batch.features.dtype == torch.float32 and batch.topk_logits.dtype == torch.float32
    # the file costs 2 bytes per feature value (plus small labels), not 4
    per_position = (tmp_path / "shard_00000.safetensors").stat().st_size / 17
    assert per_position < 64 * 2 + 8 * (4 + 2) + 8 + 300 / 17 * 4


def kept_map(vocab: int, kept: list[int]) -> torch.Tensor:
    full_to_kept = torch.full((vocab,), -1, dtype=torch.long)
    full_to_kept[torch.tensor(kept)] = torch.arange(len(kept))
    return full_to_kept


def test_the_soft_loss_is_the_cross_entropy_to_the_targets_top_k_over_the_kept_tokens():
    vocab, kept = 10, [0, 2, 3, 5, 7]
    full_to_kept = kept_map(vocab, kept)
    topk_ids = torch.tensor([[3, 9, 0]])  # 9 is not kept: dropped, the rest renormalised
    topk_logits = torch.tensor([[2.0, 1.5, 0.0]])
    logits = torch.randn(1, len(kept))
    log_q = torch.log_softmax(logits, -1)[0]
    p3, p0 = math.exp(2.0) / (math.exp(2.0) + 1.0), 1.0 / (math.exp(2.0) + 1.0)
    soft = -(p3 * log_q[2] + p0 * log_q[0])
    hard = -log_q[2]  # the greedy token 3 is kept index 2
    loss = soft_hard_loss(logits, topk_ids, topk_logits, topk_ids[:, 0], full_to_kept)
    torch.testing.assert_close(loss, (soft + hard) / 2)
    only_soft = soft_hard_loss(logits, topk_ids, topk_logits, topk_ids[:, 0], full_to_kept, soft_weight=1.0)
    torch.testing.assert_close(only_soft, soft)


def test_the_soft_loss_is_lowest_at_the_targets_distribution():
    """Its gradient vanishes where the head's distribution over the kept tokens equals the
    target's renormalised top-k: it teaches the whole distribution, not just the argmax."""
    vocab, kept = 12, list(range(6))
    full_to_kept = kept_map(vocab, kept)
    topk_ids = torch.tensor([[1, 4, 2, 0]])
    topk_logits = torch.tensor([[3.0, 2.5, 1.0, -1.0]])
    p = torch.softmax(topk_logits, -1)[0]
    at_target = torch.full((1, len(kept)), -30.0)
    at_target[0, topk_ids[0]] = p.log()
    at_target.requires_grad_(True)
    soft_hard_loss(at_target, topk_ids, topk_logits, topk_ids[:, 0], full_to_kept, soft_weight=1.0).backward()
    assert at_target.grad.abs().max() < 1e-6
    argmax_only = torch.full((1, len(kept)), -30.0)
    argmax_only[0, 1] = 0.0  # all mass on the greedy token: the hard loss's optimum, not the soft one's
    base = soft_hard_loss(at_target.detach(), topk_ids, topk_logits, topk_ids[:, 0], full_to_kept, soft_weight=1.0)
    assert soft_hard_loss(argmax_only, topk_ids, topk_logits, topk_ids[:, 0], full_to_kept, soft_weight=1.0) > base + 1


def test_kept_vocabulary_coverage_is_ranked_on_training_texts_and_counted_on_held_out_ones():
    from opttree.distill.train.coverage import coverage

    def record(greedy):
        ids = torch.tensor(greedy)[:, None].repeat(1, 2)  # [N, 2] top-2 ids, the greedy first
        return {"input_ids": torch.arange(len(greedy)), "topk_ids": ids}

    train = [record([1, 1, 1, 2, 2, 3])]  # ranked 1, 2, 3, then the rest by id
    held = [record([1, 2, 3, 4])]
    c = coverage(train, held, sizes=(1, 2, 3, 10))
    assert [x.covered for x in c] == [0.25, 0.5, 0.75, 1.0] and c[0].tokens == 4


def test_coverage_stage_prints_per_source(tmp_path, capsys, monkeypatch):
    from opttree.distill import cli
    from opttree.distill.recipes.recipe import parse_recipe
    from opttree.distill.recipes.recipe_run import features_folder

    recipe = parse_recipe({"source": [{"name": "t", "kind": "teacher", "count": 4}], "stage": [{"name": "s"}]},
                          tmp_path)
    folder = features_folder(tmp_path / "cache", recipe, recipe.sources[0])
    folder.mkdir(parents=True)
    g = torch.Generator().manual_seed(0)
    save_records([{"input_ids": torch.arange(50), "topk_ids": torch.randint(0, 40, (50, 4), generator=g)}
                  for _ in range(20)], folder / "shard_00000.safetensors")
    monkeypatch.setattr("opttree.distill.recipes.recipe.load_recipe", lambda path: recipe)
    assert cli.main(["--recipe", "r.toml", "--cache", str(tmp_path / "cache"), "--out", "x",
                     "--stage", "coverage"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("t: 8192: 100.0%") and "all: 8192: 100.0%" in out


def test_features_too_large_for_float16_stay_finite_in_bfloat16():
    from opttree.distill.data.features import sixteen_bits

    small, huge = torch.tensor([1.5, -3.0]), torch.tensor([1.5, 1e6])
    assert sixteen_bits(small).dtype == torch.float16
    assert sixteen_bits(huge).dtype == torch.bfloat16 and torch.isfinite(sixteen_bits(huge)).all()


def test_coverage_of_other_tokens_ranks_on_the_training_texts():
    from opttree.distill.train.coverage import tokens_coverage

    train = [{"input_ids": torch.arange(4), "topk_ids": torch.tensor([[5, 6], [5, 6], [7, 5], [8, 5]])}]
    c = tokens_coverage(train, torch.tensor([5, 9, 7, 5]), sizes=(1, 3))
    assert [x.covered for x in c] == [0.5, 0.75]  # 9 was never seen: ranked by id after the others
