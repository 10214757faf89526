"""nodes="auto" / threshold="auto": the selection logic on synthetic latency tables, then end to end."""

import pytest
import torch

from models import peaked, tiny_model
from opttree import TreeConfig, speculative_generate
from opttree import budget
from opttree.budget import AutoTreeConfig, LatencyModel, best_size, depth_threshold, expected_speed
from opttree.builder import build_opt_tree
from opttree.strategies import build_tree
from test_builder import synthetic_probs
from test_strategies import StrictDrafter

SIZES = (0, 1, 2, 4, 8, 16, 32, 64)
CPU_LIKE = (0.060, 0.065, 0.070, 0.110, 0.145, 0.210, 0.250, 0.230)  # DESIGN-NOTES: plateau at 16-64
GPU_LIKE = (0.020,) * 8  # verification is free up to 64 nodes


def latency(table, draft=0.005):
    return LatencyModel(sizes=SIZES, verify=table, draft_forward=draft)


def auto(table, draft=0.005, **kw):
    kw = {"nodes": 64, "threshold": 0.0, "auto_nodes": True, "auto_threshold": True, **kw}
    return AutoTreeConfig(latency=latency(table, draft), **kw)


def test_verify_time_interpolates_and_extrapolates():
    lat = latency(CPU_LIKE)
    assert lat.verify_time(4) == pytest.approx(0.110)
    assert lat.verify_time(3) == pytest.approx(0.090)
    assert lat.verify_time(12) == pytest.approx((0.145 + 0.210) / 2)
    assert lat.verify_time(96) == pytest.approx(0.230)  # a falling last segment is not extrapolated
    assert latency(GPU_LIKE[:-1] + (0.084,)).verify_time(96) == pytest.approx(0.148)  # a rising one is
    lat.verify_scale = 2.0
    assert lat.verify_time(4) == pytest.approx(0.220)


def test_noisy_calibrations_become_a_non_decreasing_table():
    noisy = (0.5, 1.7, 1.7, 1.5, 2.7, 2.2, 8.5, 4.3)  # measured on a busy machine
    assert budget.lower_envelope(noisy) == (0.5, 1.5, 1.5, 1.5, 2.2, 2.2, 4.3, 4.3)
    assert budget.lower_envelope(CPU_LIKE) == (0.060, 0.065, 0.070, 0.110, 0.145, 0.210, 0.230, 0.230)


def brute_force_size(probs, table, draft_seconds):
    lat = latency(table)
    ranked = sorted(probs.tolist(), reverse=True)
    speeds = [(sum(ranked[:m]) + 1) / (lat.verify_time(m) + draft_seconds) for m in range(1, len(ranked) + 1)]
    return max(range(len(speeds)), key=lambda i: (speeds[i], -i)) + 1


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("table", [CPU_LIKE, GPU_LIKE, (0.01, 0.02, 0.03, 0.05, 0.09, 0.17, 0.33, 0.65)])
def test_best_size_maximises_expected_tokens_per_second(seed, table):
    g = torch.Generator().manual_seed(seed)
    probs = torch.rand(40, generator=g) ** 3  # a pool's p̂, any order
    for spent in (0.0, 0.02, 0.2):
        m = best_size(probs, latency(table), spent)
        assert m == brute_force_size(probs, table, spent)
        speed = expected_speed(probs, latency(table), spent)
        assert float(speed[m - 1]) == pytest.approx(float(speed.max()))


def test_free_verification_takes_every_useful_node_and_costly_takes_few():
    probs = torch.tensor([0.9, 0.8, 0.5, 0.3, 0.2, 0.1, 0.05, 0.01])
    assert best_size(probs, latency(GPU_LIKE), 0.01) == 8
    steep = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)  # each node doubles the cost
    assert best_size(probs, latency(steep), 0.0) <= 2
    assert best_size(probs, latency(CPU_LIKE), 0.01) < 8
    assert best_size(probs, latency(GPU_LIKE), 0.01, cap=3) == 3
    assert best_size(torch.empty(0), latency(GPU_LIKE), 0.0) == 0


def test_depth_threshold_is_the_cost_ratio():
    lat = latency(CPU_LIKE, draft=0.01)
    probs = torch.tensor([0.9, 0.5, 0.1])
    # δ = (E + 1) · c / (T + D): one more forward pays only if E grows by more than this share
    assert depth_threshold(probs, lat, 0.02, 2) == pytest.approx((1.4 + 1) * 0.01 / (0.065 + 0.005 + 0.02))
    assert depth_threshold(probs, latency(CPU_LIKE, draft=0.0), 0.02, 2) == 0.0


def test_expensive_drafts_grow_shallower_trees():
    root = synthetic_probs(())
    cheap = build_opt_tree(root, StrictDrafter(), auto(CPU_LIKE, draft=0.0005, max_depth=10))
    dear = build_opt_tree(root, StrictDrafter(), auto(CPU_LIKE, draft=0.5, max_depth=10))
    assert dear.draft_forwards < cheap.draft_forwards
    assert dear.draft_forwards == 1  # the first layer's gain never pays for a forward as slow as 8 verifies


@pytest.mark.parametrize("strategy", ["opt", "heap", "delayed", "chain", "static"])
def test_auto_nodes_cut_every_strategy_to_its_fastest_prefix(strategy):
    root = synthetic_probs(())
    steep = (0.001, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64)
    config = auto(steep, draft=0.0001, strategy=strategy, auto_threshold=False, threshold=0.0, max_depth=4, nodes=20)
    built = build_tree(root, StrictDrafter(), config)
    full = build_tree(root, StrictDrafter(), TreeConfig(nodes=20, threshold=0.0, max_depth=4, strategy=strategy))
    assert 1 <= len(built.tree) < len(full.tree)
    free = build_tree(root, StrictDrafter(), auto(GPU_LIKE, strategy=strategy, auto_threshold=False, max_depth=4, nodes=20))
    assert len(free.tree) == len(full.tree)


def test_online_refresh_moves_towards_measured_times():
    lat = latency(CPU_LIKE, draft=0.01)
    for _ in range(100):
        lat.observe(tree_size=8, verify_seconds=2 * 0.145, draft_forwards=4, draft_seconds=4 * 0.03)
    assert lat.verify_scale == pytest.approx(2.0, rel=1e-3)
    assert lat.draft_forward == pytest.approx(0.03, rel=1e-3)
    lat.observe(tree_size=8, verify_seconds=1000.0, draft_forwards=0, draft_seconds=0.0)  # an outlier is clipped
    assert lat.verify_scale <= 2.0 + 0.1 * 2.0


def test_config_accepts_auto_and_nothing_else():
    assert TreeConfig(nodes="auto", threshold="auto").nodes == "auto"
    for bad in ({"nodes": "Auto"}, {"nodes": "fast"}, {"threshold": "AUTO"}, {"nodes": 0}, {"threshold": -1.0}):
        with pytest.raises(ValueError):
            TreeConfig(**bad)


def test_resolve_measures_once_per_model_and_keeps_other_settings(monkeypatch):
    target = tiny_model("llama", seed=0)
    calls = []
    real = budget._timed_forward
    monkeypatch.setattr(budget, "_timed_forward", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(budget, "_CALIBRATIONS", {})

    class Drafter:
        model = tiny_model("llama", seed=1, layers=1)

    config = TreeConfig(nodes="auto", threshold=0.3, max_depth=7, strategy="heap")
    resolved = budget.resolve(config, target, Drafter())
    assert isinstance(resolved, AutoTreeConfig) and resolved.auto_nodes and not resolved.auto_threshold
    assert (resolved.nodes, resolved.threshold, resolved.max_depth, resolved.strategy) == (64, 0.3, 7, "heap")
    assert len(resolved.latency.verify) == len(budget.VERIFY_SIZES) and resolved.latency.draft_forward > 0
    measured = len(calls)
    budget.resolve(config, target, Drafter())
    assert len(calls) == measured  # cached
    assert budget.resolve(TreeConfig(nodes=5), target, Drafter()) == TreeConfig(nodes=5)


@pytest.mark.parametrize("strategy", ["opt", "heap"])
def test_auto_is_equal_to_greedy_generate(strategy):
    target = peaked(tiny_model("llama", seed=0), scale=30.0)
    ids = torch.randint(3, 90, (1, 7), generator=torch.Generator().manual_seed(2))
    ref = target.generate(ids, max_new_tokens=20, do_sample=False)
    for draft in (target, tiny_model("llama", seed=1)):
        out = target.generate(ids, max_new_tokens=20, do_sample=False, custom_generate=speculative_generate,
                              draft_model=draft, nodes="auto", threshold="auto", strategy=strategy,
                              return_dict_in_generate=True)
        assert torch.equal(out.sequences, ref)
        assert max(out.stats.tree_sizes) <= budget.AUTO_MAX_NODES
