"""The online reliability map for p̂ and how nodes="auto" uses it: E_m sums calibrated
p̂, so an over-confident draft gets smaller trees and a well-calibrated one keeps its choice."""

import pytest
import torch

from opttree import TreeConfig
from opttree.tree.builder import best_nodes
from opttree.budget.latency import AUTO_MAX_NODES
from opttree.budget.policy import AutoPolicy, best_size, expected_speed
from opttree.budget.reliability import BINS, EDGES, ReliabilityMap, pool_adjacent_violators
from opttree.loop.stats import StepStats
from opttree.tree import DraftTree
from test_budget import CPU_LIKE, latency, step

CHAIN = torch.tensor([0.95, 0.9, 0.85, 0.75, 0.6, 0.45, 0.3, 0.15, 0.05, 0.01])  # p̂ down a chain (float32)


def chain_step(probs: torch.Tensor, accepted: int) -> StepStats:
    """A verified chain root → 0 → 1 → …, its first ``accepted`` nodes accepted; no time measured."""
    n = len(probs)
    tree = DraftTree(torch.arange(n), torch.arange(n) - 1, probs)
    return StepStats(tree_size=n, tree_depth=n, expected_length=float(probs.sum()), accepted=accepted,
                     emitted=accepted + 1, draft_forwards=0, draft_seconds=0.0, verify_seconds=0.0, tree=tree,
                     accepted_nodes=list(range(accepted)))


def accepted_prefix(probs: torch.Tensor, scale: float, g: torch.Generator) -> int:
    """How far a chain is accepted when node i is accepted with probability scale · p̂_i (one draw:
    p̂ falls down the chain, so the accepted nodes are a prefix)."""
    u = float(torch.rand((), generator=g))
    return int((u < scale * probs.double()).sum())


def train(observe, steps: int, scale: float, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        observe(chain_step(CHAIN, accepted_prefix(CHAIN, scale, g)))


def map_observe(rmap: ReliabilityMap):
    def observe(s: StepStats) -> None:
        accepted = torch.zeros(len(s.tree), dtype=torch.bool)
        accepted[s.accepted_nodes] = True
        rmap.update(s.tree.path_probs, accepted)
    return observe


def test_pool_adjacent_violators():
    assert pool_adjacent_violators([1.0, 3.0, 2.0, 4.0], [1.0] * 4) == [1.0, 2.5, 2.5, 4.0]
    assert pool_adjacent_violators([3.0, 1.0, 1.0], [1.0, 1.0, 2.0]) == [1.5, 1.5, 1.5]
    assert pool_adjacent_violators([0.1, 0.2], [5.0, 1.0]) == [0.1, 0.2]  # already monotone: unchanged


def test_the_map_starts_as_the_identity():
    rmap = ReliabilityMap()
    probs = torch.rand(50, generator=torch.Generator().manual_seed(0)) ** 4
    assert torch.equal(rmap.apply(probs), probs)
    assert len(EDGES) + 1 == BINS and list(EDGES) == sorted(EDGES)
    empty = torch.empty(0)
    rmap.update(empty, torch.empty(0, dtype=torch.bool))  # an empty tree is no evidence
    assert rmap.curve is None and rmap.steps == 0
    rmap.update(torch.tensor([0.5]), torch.tensor([True]))  # one node barely moves the prior (8 nodes per bin)
    assert rmap.at(0.05) == pytest.approx(0.05) and rmap.at(0.99) == pytest.approx(0.99)
    assert 0.5 < rmap.at(0.5) < 0.5 + 0.5 / 8


def test_an_over_confident_draft_is_mapped_to_its_real_acceptance():
    """Nodes the draft gives p̂ 0.9 are accepted 30 % of the time: 0.9 → ~0.3 (and so on down)."""
    rmap, calibrated = ReliabilityMap(), ReliabilityMap()
    train(map_observe(rmap), 1500, scale=1 / 3)
    train(map_observe(calibrated), 1500, scale=1.0)
    assert rmap.at(0.9) == pytest.approx(0.3, abs=0.04)
    assert rmap.at(0.6) == pytest.approx(0.2, abs=0.04)
    for p in (0.9, 0.75, 0.6, 0.3):
        assert calibrated.at(p) == pytest.approx(p, abs=0.05)  # a well-calibrated draft: about the identity


def test_the_map_is_monotone_whatever_it_saw():
    rmap = ReliabilityMap()
    g = torch.Generator().manual_seed(1)
    for _ in range(300):  # anti-calibrated: the less probable, the more often accepted
        probs = torch.rand(12, generator=g) ** 3
        rmap.update(probs, torch.rand(12, generator=g) < 1 - probs)
    grid = torch.cat([torch.tensor([0.0, 1e-6, 1e-4]), torch.linspace(0, 1, 2001).double(), torch.tensor([1.0])])
    grid = torch.sort(grid).values
    out = rmap.apply(grid)
    assert out.dtype == grid.dtype and bool((out[1:] >= out[:-1]).all())
    assert bool((out >= 0).all() and (out <= 1).all())


def random_tree(n: int, seed: int) -> DraftTree:
    g = torch.Generator().manual_seed(seed)
    parents = torch.tensor([-1] + [int(torch.randint(-1, i, (), generator=g)) for i in range(1, n)])
    q = torch.rand(n, generator=g) ** 2
    probs = torch.empty(n)
    for i in range(n):
        probs[i] = q[i] * (1.0 if parents[i] < 0 else probs[parents[i]])
    return DraftTree(torch.arange(n), parents, probs)


@pytest.mark.parametrize("seed", range(4))
def test_top_m_by_calibrated_value_is_a_valid_tree(seed):
    rmap = ReliabilityMap()
    train(map_observe(rmap), 400, scale=1 / 3, seed=seed)  # pulls the top bins down: PAV pools them
    tree = random_tree(60, seed)
    cal = rmap.apply(tree.path_probs)
    has_parent = tree.parents >= 0
    assert bool((cal[has_parent] <= cal[tree.parents[has_parent]]).all())  # never above the parent
    rank = torch.sort(tree.path_probs, descending=True, stable=True).indices  # p̂'s order (ties: parent first)
    assert bool((cal[rank][1:] <= cal[rank][:-1]).all())  # so E_m sums the m largest calibrated values too
    by_cal = rank[torch.sort(cal[rank], descending=True, stable=True).indices]  # ties kept in p̂'s order
    for m in range(1, len(tree) + 1):
        keep = set(by_cal[:m].tolist())
        assert all(int(tree.parents[i]) < 0 or int(tree.parents[i]) in keep for i in keep), m
        assert keep == set(best_nodes(tree.path_probs, m).tolist())


# ---------------------------------------------------------------------------------------------
# in the policy


POOL = torch.tensor([0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6])  # a confident pool


def test_auto_verifies_smaller_trees_once_it_has_seen_an_over_confident_draft():
    lat = latency(CPU_LIKE)
    policy = AutoPolicy(TreeConfig(nodes="auto"), lat, clock=lambda: 0.0)  # no time passes: only p̂ matters
    before = policy.plan().size(POOL)
    assert before == 7  # the 7 best fill a verification size (8 rows): Σp̂ = 5.6 is worth T(7)
    train(policy.observe, 600, scale=1 / 3)
    after = policy.plan().size(POOL)
    assert 1 <= after < before
    assert lat.reliability.steps == 600 and lat.verify_scale == 1.0 and lat.overhead == 0.0  # only the map moved
    # the map lives in the pair's latency model: a later call starts from what this one learnt
    assert AutoPolicy(TreeConfig(nodes="auto"), lat, clock=lambda: 0.0).plan().size(POOL) == after
    assert best_size(POOL, lat, 0.0) == after


def test_auto_keeps_its_choice_with_a_well_calibrated_draft():
    lat = latency(CPU_LIKE)
    policy = AutoPolicy(TreeConfig(nodes="auto"), lat, clock=lambda: 0.0)
    before = policy.plan().size(POOL)
    speeds = expected_speed(POOL, lat, 0.0)
    train(policy.observe, 600, scale=1.0)
    assert policy.plan().size(POOL) == before == 7
    assert expected_speed(POOL, lat, 0.0).tolist() == pytest.approx(speeds.tolist(), rel=0.08)


def test_a_layer_of_an_over_confident_draft_is_judged_on_calibrated_p():
    from opttree.budget.policy import layer_pays
    from opttree.tree.plan import LayerState

    probs = torch.tensor([0.95, 0.9])  # a chain: the next node's p̂ ≈ 0.85, the third of a 4-row verification
    state = LayerState(probs, torch.tensor([-1, 0]), 1, 1)
    lat = latency(CPU_LIKE, layer=0.015)  # the node is free to verify (same size); the layer costs 0.015 s
    assert layer_pays(state, lat, 0.0)
    policy = AutoPolicy(TreeConfig(nodes="auto", threshold="auto"), lat, clock=lambda: 0.0)
    train(policy.observe, 600, scale=1 / 3)
    assert not layer_pays(state, lat, 0.0)  # ~0.25 expected tokens no longer pay for a forward


def test_steps_without_a_tree_leave_the_map_alone():
    lat = latency(CPU_LIKE)
    policy = AutoPolicy(TreeConfig(nodes="auto"), lat, clock=lambda: 0.0)
    policy.observe(step(tree_size=8, verify=0.1))  # tree None (a batch's summed step)
    policy.observe(chain_step(CHAIN[:0], 0))  # the root alone
    assert lat.reliability.curve is None


def test_step_times_is_a_slice_of_a_cache_rebuilt_when_the_numbers_change():
    lat, now = latency(CPU_LIKE), [0.0]

    def expected(m):
        return [lat.verify_time(k) + lat.overhead for k in range(1, m + 1)]

    assert lat.step_times(5).tolist() == pytest.approx(expected(5))
    assert lat.step_times(3).data_ptr() == lat.step_times(AUTO_MAX_NODES).data_ptr()  # no rebuild: a view
    policy = AutoPolicy(TreeConfig(nodes="auto"), lat, clock=lambda: now[0])
    policy.plan()
    now[0] += 1.0
    policy.observe(chain_step(CHAIN[:4], 1))  # refreshes the rest of a step
    assert lat.overhead > 0 and lat.step_times(5).tolist() == pytest.approx(expected(5))
    lat.verify_scale = 2.0  # set by hand: still seen
    assert lat.step_times(4).tolist() == pytest.approx(expected(4))
    assert len(lat.step_times(AUTO_MAX_NODES + 10)) == AUTO_MAX_NODES + 10  # a larger pool (cap=None)
    assert lat.step_times(AUTO_MAX_NODES + 10).tolist() == pytest.approx(expected(AUTO_MAX_NODES + 10))


def interpolated(rmap: ReliabilityMap, p: torch.Tensor) -> torch.Tensor:
    """The map as first written: the segment's two points looked up and interpolated, the ends by where()."""
    x, y = rmap.curve.x, rmap.curve.y
    i = torch.searchsorted(x, p, right=True).clamp(1, len(x) - 1)
    inside = y[i - 1] + (y[i] - y[i - 1]) * (p - x[i - 1]) / (x[i] - x[i - 1])
    return torch.where(p < x[0], p * (y[0] / x[0]), torch.where(p >= x[-1], p * (y[-1] / x[-1]), inside)).clamp(0, 1)


def test_the_map_is_a_few_ops_whatever_the_nodes_and_equals_the_interpolation():
    """apply runs several times before every draft forward of an "auto" step: one line per segment, fitted with
    the curve, makes it 6 ops for float64 nodes (33 before; 0.11 -> 0.03 ms for 70 nodes on this Xeon, alone),
    the interpolation's values to 1e-15 (inside, at the points, below and above them)."""
    from opttree.tools.overhead import OverheadCounter

    g = torch.Generator().manual_seed(3)
    rmap = ReliabilityMap()
    for _ in range(5):
        p = torch.rand(30, generator=g) ** 2
        rmap.update(p, torch.rand(30, generator=g) < 0.6 * p)
    probs = torch.cat([torch.rand(100, generator=g, dtype=torch.float64) ** 3, rmap.curve.x,
                       torch.tensor([0.0, 1e-7, 1.0], dtype=torch.float64)])
    assert torch.allclose(rmap.apply(probs), interpolated(rmap, probs), rtol=0, atol=1e-15)
    ops = {}
    for k in (5, 60):
        with OverheadCounter(torch.nn.Identity()) as counter:
            rmap.apply(probs[:k])
        ops[k] = counter.ops
    with OverheadCounter(torch.nn.Identity()) as counter:  # control: the interpolation as first written
        interpolated(rmap, probs[:60])
    assert ops[5] == ops[60] <= 8 < counter.ops, (ops, counter.ops)
