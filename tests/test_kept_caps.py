"""The kept vocabulary's caps (issue 34): a kept set widened from a head's own tokens, its coverage
of the target's tokens, and benchmarks/draft_agreement.py measuring a head at several sizes, with
the tokens outside the set counted as misses."""

import importlib.util
from pathlib import Path

import pytest
import torch

from models import peaked, tiny_model
from opttree.distill.train.coverage import extended_kept, id_ranking, set_coverage
from opttree.distill.train.head import new_head


def bench():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "draft_agreement.py"
    spec = importlib.util.spec_from_file_location("draft_agreement", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_wider_set_keeps_the_heads_own_tokens_and_adds_the_best_ranked():
    own = torch.tensor([7, 3, 9])
    ranked = torch.tensor([9, 1, 2, 3, 0, 4, 5, 6, 7, 8])
    assert extended_kept(own, ranked, 5).tolist() == [1, 2, 3, 7, 9]  # 9 and 3 are own: skipped
    assert extended_kept(own, ranked, 3).tolist() == [3, 7, 9]
    assert extended_kept(own, id_ranking(10), 10).tolist() == list(range(10))
    with pytest.raises(ValueError, match="cannot hold"):
        extended_kept(own, ranked, 2)


def test_coverage_counts_every_occurrence():
    truth = torch.tensor([1, 1, 1, 2, 5])
    assert set_coverage(torch.tensor([1]), truth) == pytest.approx(0.6)
    assert set_coverage(torch.tensor([2, 5]), truth) == pytest.approx(0.4)
    assert set_coverage(torch.tensor([9]), truth) == 0.0  # negative control


def answers_of(target, n=4, prompt=6, answer=10, seed=0):
    """The tiny target's own greedy continuations: what agreement is measured on."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        ids = torch.randint(3, 90, (1, prompt), generator=g)
        seq = target.generate(ids, max_new_tokens=answer, do_sample=False, min_new_tokens=answer)[0]
        out.append({"category": "ab"[i % 2], "prompt_ids": ids[0].tolist(), "answer_ids": seq[prompt:].tolist()})
    return out


def oracle(target, token_ids):
    """test_feature_head's oracle head over the kept ``token_ids``."""
    head, _ = new_head(target, token_ids=token_ids, init_layer=0)
    h = head.c.hidden_size
    with torch.no_grad():
        head.fc.weight.zero_()
        head.fc.weight[:, :h].copy_(torch.eye(h))
    return head.eval()


def test_the_benchmark_measures_a_head_at_each_kept_size_with_uncovered_tokens_missed():
    b = bench()
    target = peaked(tiny_model("llama", seed=0, layers=1), scale=30.0)
    answers = answers_of(target)
    truth = b.answer_tokens(answers)
    # the oracle head (it computes the one-layer target's own features) keeping none of the answer
    # tokens: it cannot agree
    uncovered = torch.tensor(sorted(set(range(target.config.vocab_size)) - set(truth.tolist())))[:40]
    head = oracle(target, uncovered)
    ranked = torch.bincount(truth, minlength=target.config.vocab_size).argsort(descending=True, stable=True)
    variants = b.widened_heads(head, target, [len(uncovered) - 1, target.config.vocab_size], ranked)
    assert [size for size, _ in variants] == [target.config.vocab_size]  # a smaller size is no widening
    wide = variants[0][1]
    assert torch.equal(wide.token_ids, torch.arange(target.config.vocab_size))
    counts = b.heads_agreement_by_category([head, wide], target, answers, depths=1)
    reports = [b.head_report(name, c, answers, 10) for name, c in zip(("narrow", "wide"), counts)]
    narrow = b.coverage_report(head, answers, reports[0]["agreement_by_depth"][0])
    full = b.coverage_report(wide, answers, reports[1]["agreement_by_depth"][0])
    assert narrow == {"kept_tokens": 40, "coverage": 0.0, "agreement_covered": 0.0}
    assert reports[0]["agreement_by_depth"][0] == 0.0  # every token outside the set is a miss
    assert full["coverage"] == 1.0 and full["kept_tokens"] == target.config.vocab_size
    assert reports[1]["agreement_by_depth"][0] > 0.9  # the oracle, now able to name them
    assert full["agreement_covered"] == reports[1]["agreement_by_depth"][0]


def test_a_partial_set_reports_agreement_over_covered_positions():
    b = bench()
    target = peaked(tiny_model("llama", seed=0), scale=30.0)
    answers = answers_of(target, seed=1)
    truth = b.answer_tokens(answers)
    common = torch.bincount(truth, minlength=target.config.vocab_size).argsort(descending=True)[:3]
    head, _ = new_head(target, token_ids=common.sort().values, init_layer=-1)
    counts = b.heads_agreement_by_category([head.eval()], target, answers, depths=1)
    agree = b.head_report("h", counts[0], answers, 10)["agreement_by_depth"][0]
    report = b.coverage_report(head, answers, agree)
    assert 0.0 < report["coverage"] < 1.0
    assert report["agreement_covered"] == pytest.approx(agree / report["coverage"], abs=1e-3)
    assert agree <= report["coverage"] + 1e-9  # a hit needs a covered position


def test_kept_ranking_counts_the_targets_greedy_tokens(tmp_path):
    from opttree.distill.data.shards import save_records

    b = bench()
    records = [{"input_ids": torch.arange(4), "topk_ids": torch.tensor([[5, 1], [5, 2], [3, 5], [3, 1]], dtype=torch.int32),
                "topk_logits": torch.zeros(4, 2, dtype=torch.float16)}]
    save_records(records, tmp_path / "shard_00000.safetensors")
    ranked = b.kept_ranking([tmp_path], 8)
    assert ranked[:2].tolist() in ([5, 3], [3, 5]) and ranked[2].item() == 1  # then by soft counts
    assert torch.equal(b.kept_ranking([], 8), torch.arange(8))  # no records: id order


def test_chain_speed():
    b = bench()
    assert b.chain_speed(2.0, 3, 30.0, 2.0, 20.0) == pytest.approx(2.0 * 20.0 / 36.0)
    assert b.chain_speed(1.0, 3, 20.0, 0.0, 20.0) == 1.0  # nothing accepted, free drafts: plain's speed


def test_held_out_coverage_chooses_each_categorys_set_without_it():
    """benchmarks/kept_coverage.py: each category's kept sets are ranked on the OTHER categories'
    answers. a wrote 7, 7, 9 and b 9, 8; the shipped set is {8}. Held out, a's set ranks b's tokens
    (8, 9, then ids) and b's ranks a's (7, 9, then ids)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from kept_coverage import held_out_coverage

    answers = [{"category": "a", "answer_ids": [7, 7, 9]}, {"category": "b", "answer_ids": [9, 8]}]
    report = held_out_coverage(torch.tensor([8]), answers, [1, 2], vocab=10)
    # (token-weighted, category mean, worst category, its coverage)
    assert report["counts alone"][1] == pytest.approx((0.0, 0.0, "a", 0.0))  # a: {8}, b: {7}
    assert report["counts alone"][2] == pytest.approx((2 / 5, (1 / 3 + 1 / 2) / 2, "a", 1 / 3))  # {8, 9}, {7, 9}
    assert report["shipped + counts"][2] == pytest.approx((2 / 5, (1 / 3 + 1 / 2) / 2, "a", 1 / 3))  # {8, 9}, {7, 8}
    assert report["shipped + ids"][2] == pytest.approx((1 / 5, 1 / 4, "a", 0.0))  # {0, 8} for both
