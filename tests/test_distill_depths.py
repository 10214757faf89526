"""Agreement at depths 1, 2, 3 given the path so far was accepted, and a chain's τ, counted from
the unrolled passes' hits (opttree.distill.train.depths)."""

import torch

from opttree.distill.train.depths import DepthCounts, depth_counts


def bools(*values):
    return torch.tensor(values, dtype=torch.bool)


def test_counts_by_hand():
    scored = bools(1, 1, 1, 1, 1, 0)  # position 5 has no next token
    hits = [bools(1, 1, 0, 1, 1, 0),  # pass 0 (depth 1) at root j
            bools(0, 1, 1, 0, 1, 0),  # pass 1 (depth 2) at position j: root j - 1
            bools(0, 0, 1, 1, 1, 0)]  # pass 2 (depth 3) at position j: root j - 2
    c = depth_counts(hits, scored)
    assert (c.hits, c.tokens) == ([4, 3, 3], [5, 4, 3])  # depth 3 agrees at roots 0, 1, 2
    # root 2 missed at depth 1, so its depth-3 hit never reaches a verifier: not counted
    assert (c.path_hits, c.path_tokens) == ([4, 3, 2], [5, 3, 2])
    assert c.path_agreement() == [0.8, 1.0, 1.0] and c.agreement() == [0.8, 0.75, 1.0]
    assert (c.chain_hits, c.roots) == ([2, 2, 2], 3)  # roots 0, 1, 2: 0 and 1 accept all three
    assert c.chain_tau() == 3.0


def test_counts_add_up_over_texts():
    a = depth_counts([bools(1, 0, 0), bools(0, 1, 0)], bools(1, 1, 0))
    b = depth_counts([bools(0, 1, 0), bools(0, 0, 0)], bools(1, 1, 0))
    total = a.add(b)
    assert total.hits == [a.hits[0] + b.hits[0], a.hits[1] + b.hits[1]] and total.roots == a.roots + b.roots
    assert DepthCounts(2).chain_tau() == 1.0  # no roots: only the target's own token


def test_a_head_that_always_agrees_has_tau_depth_plus_one():
    scored = torch.ones(9, dtype=torch.bool)
    scored[-1] = False
    c = depth_counts([torch.ones(9, dtype=torch.bool)] * 3, scored)
    assert c.path_agreement() == [1.0, 1.0, 1.0] and c.chain_tau() == 4.0


def test_the_agreement_benchmark_reports_depths_given_the_accepted_path():
    """benchmarks/draft_agreement.py on a tiny target: depth 1 is the same number either way, and
    the report carries the conditional agreement per depth and a chain's τ."""
    import importlib.util
    from pathlib import Path

    from models import tiny_model
    from opttree.distill.train.head import new_head

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "draft_agreement.py"
    spec = importlib.util.spec_from_file_location("draft_agreement", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    target = tiny_model("llama", seed=0)
    head, _ = new_head(target, init_layer=1)
    g = torch.Generator().manual_seed(0)
    answers = [{"category": c, "prompt_ids": torch.randint(3, 90, (6,), generator=g).tolist(),
                "answer_ids": torch.randint(3, 90, (12,), generator=g).tolist()} for c in ("a", "b", "a")]
    paths = []
    counts = bench.heads_agreement_by_category([head.eval()], target, answers, depths=3, paths=paths)[0]
    report = bench.path_report(paths[0])
    depth1 = sum(v[0][0] for v in counts.values()) / sum(v[0][1] for v in counts.values())
    assert report["agreement_by_depth_given_accepted"][0] == round(depth1, 4)
    assert set(report["per_category_given_accepted"]) == {"a", "b"} and 1.0 <= report["chain_tau"] <= 4.0
