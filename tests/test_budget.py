"""Budget policies: the seam, nodes="auto" / threshold="auto" on fake machines, the width cap, the
calibration (through the drafter protocol) and its on-disk cache, and greedy equality end to end."""

import json
import math

import pytest
import torch

from clocks import HANG_GUARD
from models import peaked, tiny_model
from opttree import TreeConfig, speculative_generate
from opttree.budget import calibration, calibration_file, policy as policy_module, timing
from opttree.budget import latency as latency_module
from opttree.budget.latency import LatencyModel, LatencyTable
from opttree.budget.policy import (AutoPolicy, as_calibrated, best_choice, best_size, expected_speed, layer_pays,
                                   layer_width, next_layer_guess)
from opttree.integration import prepare as integration  # the preparation: where a call meets its policy
from opttree.tree.plan import FixedPolicy, LayerState, StepPlan
from opttree.tree.builder import build_opt_tree
from opttree.distill.train.head import new_head
from opttree.drafters import ModelDrafter, PromptLookupDrafter
from opttree.drafters.head.feature_head import FeatureHeadDrafter
from opttree.loop.stats import LayerTiming, StepStats
from opttree.tree.strategies import build_tree
from test_builder import synthetic_probs
from test_strategies import StrictDrafter

# the node counts that fill a verification size (tree.sizes: 1, 2, 4, ... rows with the root): the
# latency model prices n nodes at the next of them, as the loop pads them
SIZES = (0, 1, 3, 7, 15, 31, 63, 127)
CPU_LIKE = (0.060, 0.065, 0.070, 0.110, 0.145, 0.210, 0.250, 0.230)  # DESIGN-NOTES: plateau at 16-64
GPU_LIKE = (0.020,) * 8  # verification is free up to 127 nodes
WIDTHS = (1, 2, 4, 8, 16, 32)


def latency(table, layer=0.005, root=0.0):
    """A LatencyModel with the verify ``table`` and a flat per-layer draft cost."""
    return LatencyModel(verify=LatencyTable(SIZES, table), layer=LatencyTable((1,), (layer,)), root_seconds=root)


def step(tree_size=8, verify=0.1, layers=(), root=0.0):
    return StepStats(tree_size=tree_size, tree_depth=1, expected_length=0.0, accepted=0, emitted=1,
                     draft_forwards=len(layers), draft_seconds=root + sum(s for _, s in layers), verify_seconds=verify,
                     root_seconds=root, layers=[LayerTiming(w, s) for w, s in layers])


# ---------------------------------------------------------------------------------------------
# the modules: the budget's names each have one home: plan (the seam), latency, policy, calibration, its file or timing


BUDGET_NAMES = ['AUTO_MAX_NODES', 'AffineFit', 'AutoPolicy', 'BudgetPolicy', 'CALIBRATION_PREFIX', 'CALIBRATION_VERSION',
             'DRAFT_WIDTHS', 'FixedPolicy', 'LatencyModel', 'LatencyTable', 'LayerState', 'MIN_CALIBRATION_PREFIX',
             'MIN_WIDTH', 'REFRESH', 'REPEATS', 'SIZE_REFRESH', 'START_SIZE', 'StepPlan', 'VERIFY_NODES',
             'WIDTH_PER_NODE', 'best_choice', 'best_size', 'cache_dir', 'cache_mode', 'calibrate', 'calibration_key',
             'calibration_prefix', 'clear_calibrations', 'drafter_fingerprint', 'expected_speed', 'from_json',
             'known_latency', 'layer_pays', 'layer_width', 'lower_envelope', 'make_policy', 'measure',
             'measure_drafter', 'measure_verify', 'model_fingerprint', 'next_layer_guess', 'read_cached', 'to_json',
             'policy_maker', 'write_cached', 'complete_table', 'forward_kind', 'measure_verify_budgeted', 'VerifyRig',
             'warm_then_time', 'with_fitted_sizes', 'as_calibrated']  # every public name of the budget


def test_every_budget_name_has_one_home():
    from opttree.tree import plan

    for name in BUDGET_NAMES:
        homes = [m for m in (plan, latency_module, policy_module, calibration, calibration_file, timing)
                 if name in m.__all__]
        assert len(homes) == 1, name  # offered by exactly one module
        assert getattr(getattr(homes[0], name), "__module__", homes[0].__name__) == homes[0].__name__  # defined there
    assert sorted(plan.__all__) == ["BudgetPolicy", "FixedPolicy", "LayerState", "StepPlan"]


def test_the_budget_names_node_counts_apart_from_rows():
    """Calibration times node counts (VERIFY_NODES); a forward's rows (the root too) are tree.sizes.VERIFY_SIZES:
    two units, two names, and the budget exports only its own."""
    from opttree.tree.sizes import VERIFY_SIZES

    for module in (calibration, timing):
        assert "VERIFY_SIZES" not in module.__all__ and not hasattr(module, "SIZES")
    assert all(n + 1 in VERIFY_SIZES for n in timing.VERIFY_NODES)  # each fills a verification size
    assert timing.VERIFY_NODES[0] == 0 and timing.VERIFY_NODES[-1] == latency_module.AUTO_MAX_NODES


def test_the_plan_seam_imports_nothing_heavy():
    """Builders import the seam: at run time it needs only the standard library, opttree.tree.config and
    opttree.tree.sizes (pure Python: the fixed verification sizes); config needs only opttree.tree.registry
    (pure Python: the strategies' and verifiers' records, registered by the modules that implement them)."""
    import ast
    from pathlib import Path

    from opttree.tree import config, plan, registry, sizes

    def runtime_imports(path):
        tree = ast.parse(Path(path).read_text())
        for node in tree.body:  # top level only; `if TYPE_CHECKING:` blocks are not run
            if isinstance(node, ast.Import):
                yield from (a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                yield "." * node.level + (node.module or "")

    assert set(runtime_imports(plan.__file__)) == {"__future__", "dataclasses", "typing", ".config", ".sizes"}
    assert set(runtime_imports(config.__file__)) <= {"__future__", "dataclasses", "math", ".registry"}
    assert set(runtime_imports(registry.__file__)) <= {"__future__", "dataclasses", "typing"}  # the names' records
    assert set(runtime_imports(sizes.__file__)) <= {"__future__"}
    assert "torch" in set(runtime_imports(calibration.__file__))  # the check can see an import (control)


def test_refreshing_one_latency_model_from_several_threads_neither_deadlocks_nor_drifts():
    """AutoPolicy.observe holds the model's lock and calls LatencyModel.observe, which takes it again
    (a plain Lock would hang here); the shared model still learns what every thread measured."""
    import threading

    lat = latency(CPU_LIKE, layer=0.01)
    policies = [AutoPolicy(TreeConfig(nodes="auto"), lat, clock=lambda: 0.0) for _ in range(4)]
    barrier = threading.Barrier(4)

    def run(policy):
        barrier.wait(HANG_GUARD)
        for _ in range(300):
            policy.observe(step(tree_size=8, verify=2 * 0.145, layers=[(8, 0.03)], root=0.02))

    threads = [threading.Thread(target=run, args=(p,)) for p in policies]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HANG_GUARD)
    assert not any(t.is_alive() for t in threads)
    assert lat.verify_scale == pytest.approx(2.0, rel=1e-3) and lat.layer_time(8) == pytest.approx(0.03, rel=1e-3)
    assert lat.verify_fit.w == pytest.approx(1.0) and lat.lock.acquire(blocking=False)  # no lock left held
    lat.lock.release()


# ---------------------------------------------------------------------------------------------
# the latency model and the pure decisions


def test_latency_table_interpolates_and_extrapolates():
    lat = latency(CPU_LIKE)
    assert lat.verify.at(5) == pytest.approx(0.090)  # the table: linear between measured sizes
    assert lat.verify.at(11) == pytest.approx((0.110 + 0.145) / 2)
    assert lat.verify.at(200) == pytest.approx(0.230)  # a falling last segment is not extrapolated
    assert latency(GPU_LIKE[:-1] + (0.084,)).verify.at(191) == pytest.approx(0.148)  # a rising one is
    # the model prices a tree at its padded size: 4-7 nodes cost what 7 do (8 rows), 8-15 what 15 do
    assert [lat.verify_time(n) for n in (3, 4, 7, 8, 12, 15)] == pytest.approx([0.070, 0.110, 0.110, 0.145, 0.145, 0.145])
    assert lat.verify_time(96) == pytest.approx(0.230)
    lat.verify_scale = 2.0
    assert lat.verify_time(4) == pytest.approx(0.220)
    assert LatencyModel(verify=LatencyTable(SIZES, CPU_LIKE)).layer_time(8) == 0.0  # unmeasured drafter


def test_noisy_calibrations_become_a_non_decreasing_table():
    noisy = (0.5, 1.7, 1.7, 1.5, 2.7, 2.2, 8.5, 4.3)  # measured on a busy machine
    assert timing.lower_envelope(noisy) == (0.5, 1.5, 1.5, 1.5, 2.2, 2.2, 4.3, 4.3)
    assert timing.lower_envelope(CPU_LIKE) == (0.060, 0.065, 0.070, 0.110, 0.145, 0.210, 0.230, 0.230)


def brute_force_size(probs, table, draft_seconds):
    lat = latency(table)
    ranked = sorted(probs.tolist(), reverse=True)
    speeds = [(sum(ranked[:m]) + 1) / (lat.verify_time(m) + draft_seconds) for m in range(0, len(ranked) + 1)]
    return max(range(len(speeds)), key=lambda m: (speeds[m], -m))  # m = 0: the root alone


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("table", [CPU_LIKE, GPU_LIKE, (0.01, 0.02, 0.03, 0.05, 0.09, 0.17, 0.33, 0.65)])
def test_best_size_maximises_expected_tokens_per_second(seed, table):
    g = torch.Generator().manual_seed(seed)
    probs = torch.rand(40, generator=g) ** 3  # a pool's p̂, any order
    for spent in (0.0, 0.02, 0.2):
        m = best_size(probs, latency(table), spent)
        assert m == brute_force_size(probs, table, spent)
        speed = expected_speed(probs, latency(table), spent)
        if m > 0:
            assert float(speed[m - 1]) == pytest.approx(float(speed.max()))


def test_free_verification_takes_every_useful_node_and_costly_takes_few():
    probs = torch.tensor([0.9, 0.8, 0.5, 0.3, 0.2, 0.1, 0.05, 0.01])
    assert best_size(probs, latency(GPU_LIKE), 0.01) == 8
    steep = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)  # each node doubles the cost
    assert best_size(probs, latency(steep), 0.0) <= 2
    assert best_size(probs, latency(CPU_LIKE), 0.01) < 8
    assert best_size(probs, latency(GPU_LIKE), 0.01, cap=3) == 3
    assert best_size(torch.empty(0), latency(GPU_LIKE), 0.0) == 0


def test_a_weak_draft_falls_back_to_verifying_the_root_alone():
    cpu = (0.045, 0.077, 0.080, 0.080, 0.091, 0.119, 0.177, 0.281)  # this project's CPU: T(1) = 1.7 T(0)
    weak, strong = torch.tensor([0.3, 0.1, 0.05]), torch.tensor([0.9, 0.8, 0.7])
    assert best_choice(weak, latency(cpu), 0.01) == (0, pytest.approx(1 / 0.055))
    assert best_size(strong, latency(cpu), 0.01) == 3

def test_the_next_layer_is_guessed_from_the_last_one():
    # root -> a (0.6), b (0.3); a -> c (0.36 = 0.6 · 0.6), d (0.12 = 0.6 · 0.2); b -> e (0.15 = 0.3 · 0.5)
    probs = torch.tensor([0.6, 0.3, 0.36, 0.12, 0.15])
    parents = torch.tensor([-1, -1, 0, 0, 1])
    guess = next_layer_guess(LayerState(probs, parents, 2, 2))  # q by rank: (0.55, 0.1)
    expected = sorted([0.36 * 0.55, 0.36 * 0.1, 0.15 * 0.55, 0.15 * 0.1], reverse=True)
    assert guess.tolist() == pytest.approx(expected)
    assert next_layer_guess(LayerState(probs[:2], parents[:2], 0, 1)).tolist() == pytest.approx([0.36, 0.18])  # root's q
    assert len(next_layer_guess(LayerState(probs, parents, 2, 2), cap=3)) == 3


def guess_by_groups(state: LayerState) -> torch.Tensor:
    """next_layer_guess as first written: a loop over the sibling groups (the reference)."""
    probs, parents = state.path_probs.double(), state.parents
    last = torch.arange(state.previous, len(probs))
    parent_probs = torch.where(parents[last] >= 0, probs[parents[last].clamp(min=0)], probs.new_ones(len(last)))
    ratios = probs[last] / parent_probs
    groups = [torch.sort(ratios[parents[last] == p], descending=True).values for p in torch.unique(parents[last])]
    width = max(len(g) for g in groups)
    profile = torch.stack([torch.nn.functional.pad(g, (0, width - len(g))) for g in groups]).mean(0)
    frontier = torch.sort(probs[last], descending=True).values[:state.next_width]
    return torch.sort((frontier[:, None] * profile[None, :]).flatten(), descending=True).values


def test_the_next_layer_guess_costs_the_same_ops_whatever_its_sibling_groups():
    """The guess runs before every draft forward of an "auto" step: its ops do not grow with the last layer's
    sibling groups (a loop over them cost 0.46 ms a call on this Xeon, alone; 0.24 ms now), and it equals the loop's."""
    from opttree.tools.overhead import OverheadCounter

    def layer(groups: int, seed: int) -> LayerState:
        g = torch.Generator().manual_seed(seed)
        first = torch.sort(torch.rand(groups, generator=g), descending=True).values  # the previous layer: groups
        sizes = torch.randint(1, 5, (groups,), generator=g)
        parents = torch.repeat_interleave(torch.arange(groups), sizes)
        probs = first[parents] * torch.rand(len(parents), generator=g)
        return LayerState(torch.cat([first, probs]), torch.cat([torch.full((groups,), -1), parents]), groups, 4)

    ops = {}
    for groups in (2, 5, 12):
        for seed in range(5):
            state = layer(groups, seed)
            assert next_layer_guess(state).tolist() == pytest.approx(guess_by_groups(state).tolist(), rel=1e-12)
        with OverheadCounter(torch.nn.Identity()) as counter:
            next_layer_guess(layer(groups, 0))
        ops[groups] = counter.ops
    assert ops[2] == ops[5] == ops[12], ops
    with OverheadCounter(torch.nn.Identity()) as counter:  # control: the loop's ops grow with the groups
        guess_by_groups(layer(12, 0))
    assert counter.ops > ops[12] + 12, (counter.ops, ops)


def test_step_times_prices_each_padded_size_once(monkeypatch):
    """After every timed step the model's numbers change and T(1 … 63) is rebuilt: one price per padded size
    (1, 3, 7, 15, 31, 63 nodes), not one per node count (a 0.5 ms rebuild a step at 135 M, 0.1 ms now)."""
    lat = latency(CPU_LIKE)
    calls = []
    original = LatencyModel.verify_time
    monkeypatch.setattr(LatencyModel, "verify_time", lambda self, n: calls.append(n) or original(self, n))
    times = lat.step_times(latency_module.AUTO_MAX_NODES).tolist()
    assert len(calls) == 6, calls
    monkeypatch.setattr(LatencyModel, "verify_time", original)
    assert times == pytest.approx([lat.verify_time(k) + lat.overhead for k in range(1, latency_module.AUTO_MAX_NODES + 1)])


def test_a_layer_pays_while_its_gain_per_second_beats_the_current_rate():
    probs = torch.tensor([0.9, 0.8, 0.72, 0.64])  # a chain-like draft: q = 0.9 at every node
    parents = torch.tensor([-1, 0, 1, 2])
    state = LayerState(probs, parents, 3, 1)  # next: one node of p̂ ≈ 0.58
    free = latency(GPU_LIKE, layer=0.0)
    assert layer_pays(state, free, 0.01)  # free drafting, free verification: any gain pays
    assert not layer_pays(state, latency(GPU_LIKE, layer=10.0), 0.01)  # a forward dearer than the gain
    rate = float(expected_speed(probs, free, 0.01).max())  # the gain 0.58 must beat rate · c
    c_even = 0.58 / rate
    assert layer_pays(state, latency(GPU_LIKE, layer=0.9 * c_even), 0.01)
    assert not layer_pays(state, latency(GPU_LIKE, layer=1.1 * c_even), 0.01)
    # a layer whose nodes the fastest tree would leave out gains nothing, however cheap drafting is
    steep = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)
    assert best_size(probs, latency(steep), 0.01) < 4 and not layer_pays(state, latency(steep, layer=0.0), 0.01)


def test_layer_width_is_about_twice_the_recent_tree_never_the_whole_budget():
    assert layer_width(4.0, 64) == 8
    assert layer_width(10.2, 64) == 20
    assert layer_width(60.0, 64) == 32  # never more than half the budget
    assert layer_width(0.3, 64) == 2
    assert layer_width(5.0, 1) == 1 and layer_width(5.0, 3) == 2


def test_online_refresh_moves_towards_measured_times():
    lat = latency(CPU_LIKE, layer=0.01)
    for _ in range(100):
        lat.observe(step(tree_size=8, verify=2 * 0.145, layers=[(8, 0.03)] * 4, root=0.02))
    assert lat.verify_scale == pytest.approx(2.0, rel=1e-3)
    assert lat.layer_time(8) == pytest.approx(0.03, rel=1e-3)
    assert lat.root_seconds == pytest.approx(0.02, rel=1e-3)
    lat.observe(step(tree_size=8, verify=1000.0))  # an outlier is clipped
    assert lat.verify_scale <= 2.0 + 0.1 * 2.0
    unmeasured = LatencyModel(verify=LatencyTable(SIZES, CPU_LIKE))
    unmeasured.observe(step(layers=[(4, 0.007)]))  # a drafter that could not be timed: learnt from its steps
    assert unmeasured.layer_time(4) == pytest.approx(0.007) and unmeasured.layer_time(16) == pytest.approx(0.007)


@pytest.mark.parametrize("truth", [lambda t: 2.0 * t, lambda t: t + 0.03, lambda t: 1.5 * t + 0.01])
def test_the_verify_refresh_learns_a_load_as_a_scale_and_a_fixed_cost_as_an_offset(truth):
    lat = latency(CPU_LIKE)
    sizes = [0, 1, 4, 8, 16, 32] * 40  # the sizes auto verifies vary from step to step
    for n in sizes:
        lat.observe(step(tree_size=n, verify=truth(lat.verify_table(n))))
    for n in (0, 2, 8, 24):
        assert lat.verify_time(n) == pytest.approx(truth(lat.verify_table(n)), rel=0.05)
    one_size = latency(CPU_LIKE)
    for _ in range(200):  # a single size cannot tell the two apart: a pure scale, as before
        one_size.observe(step(tree_size=8, verify=truth(0.145)))
    assert one_size.verify_offset == pytest.approx(0.0, abs=1e-9)
    assert one_size.verify_time(8) == pytest.approx(truth(0.145), rel=1e-3)


def test_auto_learns_the_rest_of_a_step():
    lat, now = latency(CPU_LIKE), [0.0]
    policy = AutoPolicy(TreeConfig(nodes="auto"), lat, clock=lambda: now[0])
    policy.plan()
    now[0] += 1.0  # the whole step, from plan() to observe()
    policy.observe(StepStats(tree_size=4, tree_depth=1, expected_length=1.0, accepted=0, emitted=1, draft_forwards=1,
                             draft_seconds=0.2, verify_seconds=0.3))
    assert lat.overhead == pytest.approx(0.1 * 0.5)
    assert float(expected_speed(torch.tensor([1.0]), lat, 0.0)[0]) == pytest.approx(2 / (0.065 * lat.verify_scale + 0.05))


# ---------------------------------------------------------------------------------------------
# the policies on a fake machine (a simulated clock): auto must find the known optimum


ALIKE = torch.softmax(torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0]), -1)  # the same q after every context


class FakeMachine:
    """A synthetic drafter whose calls advance a simulated clock by the latency model's costs.
    draft: "synthetic" (a different pseudo-random q per context) or "alike" (ALIKE everywhere)."""

    def __init__(self, lat: LatencyModel, draft: str = "synthetic"):
        self.lat, self.draft, self.now, self.strict, self.widths = lat, draft, 0.0, StrictDrafter(), []

    def clock(self) -> float:
        return self.now

    def root_probs(self) -> torch.Tensor:
        self.now += self.lat.root_seconds
        return ALIKE if self.draft == "alike" else synthetic_probs(())

    def expand(self, pool, frontier):
        self.now += self.lat.layer_time(len(frontier))
        self.widths.append(len(frontier))
        q = self.strict(pool, frontier)  # checks the builder contract
        return ALIKE.expand(len(frontier), -1) if self.draft == "alike" else q


def realised_speed(built, lat, draft_seconds) -> float:
    return (built.tree.expected_length + 1) / (lat.verify_time(len(built.tree)) + draft_seconds)


def best_fixed_speed(lat, config, width, draft):
    """The best speed over every depth and size, by brute force: every depth d drafted in full
    (same budget and width cap as auto), then the best size for that drafting time."""
    best = (0.0, None)
    for depth in range(1, config.max_depth + 1):
        machine = FakeMachine(lat, draft)
        plan = StepPlan(nodes=latency_module.AUTO_MAX_NODES, threshold=0.0, width=width, grow=lambda state: True)
        built = build_tree(machine.root_probs(), machine.expand, config, depth, plan=plan)
        speed = best_choice(built.tree.path_probs, lat, machine.now)[1]
        best = max(best, (speed, depth), key=lambda x: x[0])
    return best


@pytest.mark.parametrize("draft", ["alike", "synthetic"])
@pytest.mark.parametrize("table,layer", [(CPU_LIKE, 0.001), (CPU_LIKE, 0.004), (CPU_LIKE, 0.02), (CPU_LIKE, 0.08),
                                         (GPU_LIKE, 0.001), (GPU_LIKE, 0.003), (GPU_LIKE, 0.01),
                                         ((0.01, 0.02, 0.03, 0.05, 0.09, 0.17, 0.33, 0.65), 0.005)])
def test_auto_finds_the_fastest_tree_on_a_fake_machine(table, layer, draft):
    """The optimum (depth and size) by brute force; auto, deciding layer by layer, must reach it
    exactly when the draft's q looks alike everywhere (its guess of the next layer is then exact),
    and come within 10 % of it with a q that differs per context."""
    lat = latency(table, layer=layer, root=layer)
    config = TreeConfig(nodes="auto", threshold="auto", max_depth=6)
    machine = FakeMachine(lat, draft)
    policy = AutoPolicy(config, lat, clock=machine.clock)
    plan = policy.plan()
    built = build_tree(machine.root_probs(), machine.expand, config, plan=plan)
    best, depth = best_fixed_speed(lat, config, plan.width, draft)
    speed = realised_speed(built, lat, machine.now)
    if draft == "alike":
        assert speed == pytest.approx(best, rel=1e-6) and built.draft_forwards + 1 == depth
    else:
        assert best * 0.9 <= speed <= best * (1 + 1e-6), (depth, built.draft_forwards + 1)
    assert max(machine.widths, default=0) <= plan.width


def test_expensive_drafts_grow_shallower_trees():
    root = synthetic_probs(())
    config = TreeConfig(nodes="auto", threshold="auto", max_depth=10)
    cheap = build_tree(root, StrictDrafter(), config, plan=AutoPolicy(config, latency(CPU_LIKE, layer=0.0005)).plan())
    dear = build_tree(root, StrictDrafter(), config, plan=AutoPolicy(config, latency(CPU_LIKE, layer=0.5)).plan())
    assert dear.draft_forwards < cheap.draft_forwards
    assert dear.draft_forwards == 0  # no layer's gain pays for a forward as slow as 8 verifies


def test_the_width_cap_follows_the_recent_tree_size():
    root = synthetic_probs(())
    config = TreeConfig(nodes="auto", threshold=0.0, max_depth=5)
    lat = latency(GPU_LIKE, layer=0.0)
    policy = AutoPolicy(config, lat)
    assert policy.plan().width == 8  # before any step: twice START_SIZE
    drafter = StrictDrafter()
    build_tree(root, drafter, config, plan=policy.plan())
    assert max(map(len, drafter.calls)) == 8
    uncapped = StrictDrafter()
    build_opt_tree(root, uncapped, TreeConfig(nodes=64, threshold=0.0, max_depth=5))
    assert max(map(len, uncapped.calls)) > 8  # what the cap saves
    for _ in range(30):
        policy.observe(step(tree_size=2, verify=0.02))
    assert policy.plan().width == 4
    assert AutoPolicy(config, lat).plan().width == 4  # a later call with these settings starts from there
    assert AutoPolicy(TreeConfig(nodes="auto", threshold="auto"), lat).plan().width == 8  # other settings do not
    narrow = StrictDrafter()
    build_tree(root, narrow, config, plan=policy.plan())
    assert max(map(len, narrow.calls)) <= 4


@pytest.mark.parametrize("strategy", ["opt", "heap", "delayed", "chain", "static"])
def test_auto_nodes_cut_every_strategy_to_its_fastest_prefix(strategy):
    root = synthetic_probs(())
    steep = (0.01, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64)
    config = TreeConfig(nodes="auto", threshold=0.0, max_depth=4, strategy=strategy)
    built = build_tree(root, StrictDrafter(), config, plan=AutoPolicy(config, latency(steep, layer=0.0001)).plan())
    full = build_tree(root, StrictDrafter(), TreeConfig(nodes=20, threshold=0.0, max_depth=4, strategy=strategy))
    assert 1 <= len(built.tree) < len(full.tree)
    cheap = AutoPolicy(TreeConfig(nodes=20, threshold="auto", max_depth=4, strategy=strategy), latency(GPU_LIKE, layer=0.0))
    free = build_tree(root, StrictDrafter(), cheap.config, plan=cheap.plan())
    assert len(free.tree) == len(full.tree)


@pytest.mark.parametrize("strategy", ["opt", "heap", "delayed", "chain"])
def test_growth_rules_stop_every_growing_strategy(strategy):
    config = TreeConfig(nodes=20, threshold=0.0, max_depth=6, strategy=strategy)
    asked = []
    never = StepPlan(nodes=20, threshold=0.0, grow=lambda state: asked.append(state) or False)
    drafter = StrictDrafter()
    built = build_tree(synthetic_probs(()), drafter, config, plan=never)
    assert built.draft_forwards == len(drafter.calls) == (2 if strategy == "delayed" else 0)  # delayed: its stem
    assert asked and all(0 <= s.previous <= len(s.path_probs) and s.next_width >= 1 for s in asked)


def test_fixed_policy_is_todays_behaviour():
    config = TreeConfig(nodes=12, threshold=0.2, max_depth=5)
    policy = FixedPolicy(config)
    assert policy.max_nodes == 12 and policy.plan() == StepPlan(nodes=12, threshold=0.2)
    a = build_tree(synthetic_probs(()), StrictDrafter(), config, plan=policy.plan())
    b = build_opt_tree(synthetic_probs(()), StrictDrafter(), config)
    assert torch.equal(a.tree.tokens, b.tree.tokens) and torch.equal(a.tree.parents, b.tree.parents)


def test_config_accepts_auto_and_nothing_else():
    assert TreeConfig(nodes="auto", threshold="auto").nodes == "auto"
    for bad in ({"nodes": "Auto"}, {"nodes": "fast"}, {"threshold": "AUTO"}, {"nodes": 0}, {"threshold": -1.0}):
        with pytest.raises(ValueError):
            TreeConfig(**bad)


# ---------------------------------------------------------------------------------------------
# the seam in the decoding loop


class RecordingPolicy:
    """A policy of its own: a fixed plan, and a record of every step it was told about (timed: the loop
    times its steps, as for "auto")."""

    timed = True

    def __init__(self, nodes):
        self.max_nodes, self.plans, self.steps = nodes, 0, []

    def plan(self):
        self.plans += 1
        return StepPlan(nodes=self.max_nodes, threshold=0.0, width=2)

    def observe(self, stats):
        self.steps.append(stats)

    def verify_rows(self, nodes):
        return FixedPolicy(TreeConfig(nodes=self.max_nodes)).verify_rows(nodes)


def test_the_loop_asks_the_policy_each_step_and_tells_it_the_cost(monkeypatch):
    target = peaked(tiny_model("llama", seed=0), scale=30.0)
    ids = torch.randint(3, 90, (1, 7), generator=torch.Generator().manual_seed(2))
    policy = RecordingPolicy(6)
    monkeypatch.setattr(integration.calibration, "policy_maker", lambda *args, **kwargs: lambda: policy)
    ref = target.generate(ids, max_new_tokens=16, do_sample=False)
    out = target.generate(ids, max_new_tokens=16, do_sample=False, custom_generate=speculative_generate,
                          draft_model=target, max_depth=4, return_dict_in_generate=True)
    assert torch.equal(out.sequences, ref)
    assert policy.plans == len(policy.steps) == len(out.stats.steps)
    assert all(s.tree_size <= 6 and all(t.width <= 2 for t in s.layers) for s in policy.steps)
    timed = [s for s in policy.steps if s.layers]
    assert timed and all(s.root_seconds > 0 and s.draft_forwards == len(s.layers) + 1 for s in timed)
    assert all(s.build_seconds >= 0 and s.draft_seconds >= s.root_seconds + sum(t.seconds for t in s.layers)
               for s in policy.steps)


# ---------------------------------------------------------------------------------------------
# calibration: through the drafter protocol, cached in memory and on disk


def test_drafters_are_timed_through_their_protocol():
    draft = tiny_model("llama", seed=1, layers=1)
    head, _ = new_head(tiny_model("llama", seed=0), init_layer=0)
    for drafter in (ModelDrafter(draft), PromptLookupDrafter(vocab_size=96), FeatureHeadDrafter(head)):
        root, layers = timing.measure_drafter(drafter, 96, torch.device("cpu"), repeats=1, hidden_size=32)
        assert root >= 0 and len(layers) == len(calibration.DRAFT_WIDTHS) and all(t >= 0 for t in layers)
    assert ModelDrafter(draft).forwards == 0


@pytest.fixture
def pair():
    target = tiny_model("llama", seed=0)
    draft = tiny_model("llama", seed=1, layers=1)
    return target, ModelDrafter(draft), (lambda: ModelDrafter(draft))


@pytest.fixture
def count_measures(monkeypatch, tmp_path_factory):
    # a fresh on-disk cache too: generate() without tree arguments calibrates ("auto"), so earlier tests
    # may have cached these tiny pairs in the session's folder
    monkeypatch.setenv("OPTTREE_CALIBRATION_DIR", str(tmp_path_factory.mktemp("calibration")))
    calls = []
    real = calibration.measure  # where calibrate() looks it up (budget only re-exports it)
    monkeypatch.setattr(calibration, "measure", lambda *a, **k: calls.append(1) or real(*a, **k))
    calibration.clear_calibrations()
    yield calls
    calibration.clear_calibrations()


def test_calibration_is_written_reused_and_invalidated_on_disk(pair, tmp_path, count_measures):
    target, drafter, new_drafter = pair
    first = calibration.calibrate(target, drafter, new_drafter, folder=tmp_path, mode="on")
    files = list(tmp_path.glob("*.json"))
    assert len(count_measures) == 1 and len(files) == 1
    data = json.loads(files[0].read_text())
    assert data["key"]["target"]["class"] == "LlamaForCausalLM" and data["key"]["threads"] == torch.get_num_threads()
    assert first.layer is not None and len(first.verify.seconds) == len(calibration.VERIFY_NODES)
    assert calibration.calibrate(target, drafter, new_drafter, folder=tmp_path, mode="on") is first  # memory

    calibration.clear_calibrations()  # a new process: read from disk, nothing measured
    again = calibration.calibrate(target, drafter, new_drafter, folder=tmp_path, mode="on")
    assert len(count_measures) == 1 and again.verify == first.verify and again.layer == first.layer

    threads = torch.get_num_threads()
    try:  # another key (threads, another draft): measured again, another file
        torch.set_num_threads(threads + 1)
        calibration.calibrate(target, drafter, new_drafter, folder=tmp_path, mode="on")
    finally:
        torch.set_num_threads(threads)
    other = ModelDrafter(tiny_model("llama", seed=1, layers=2))
    calibration.calibrate(target, other, lambda: ModelDrafter(other.model), folder=tmp_path, mode="on")
    assert len(count_measures) == 3 and len(list(tmp_path.glob("*.json"))) == 3

    calibration.calibrate(target, drafter, new_drafter, folder=tmp_path, mode="refresh")  # measured and rewritten
    assert len(count_measures) == 4 and len(list(tmp_path.glob("*.json"))) == 3


def test_concurrent_auto_calls_measure_each_pair_once_and_one_at_a_time(pair, tmp_path, monkeypatch):
    """Several threads asking for calibrations at once (two of them for each of two pairs): each pair
    is measured once, never two measurements at the same time, and every caller of a pair gets its
    one shared model."""
    import threading
    import time

    target, drafter, new_drafter = pair
    other = ModelDrafter(tiny_model("llama", seed=1, layers=2))
    running, overlaps, measured = [0], [], []

    def slow_measure(target, new_drafter, prefix, *timed_as, **how):  # a fake measurement long enough for the threads to race
        running[0] += 1
        overlaps.append(running[0])
        time.sleep(0.2)
        measured.append(new_drafter)
        running[0] -= 1
        return latency(CPU_LIKE)

    monkeypatch.setattr(calibration, "measure", slow_measure)
    calibration.clear_calibrations()
    barrier = threading.Barrier(6)
    got, errors = {}, []
    which = [(drafter, new_drafter), (other, None)] * 3

    def call(i):
        try:
            barrier.wait(HANG_GUARD)
            d, nd = which[i]
            got[i] = calibration.calibrate(target, d, nd, folder=tmp_path, mode="off")
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HANG_GUARD)
    calibration.clear_calibrations()
    assert not errors and len(got) == 6
    assert len(measured) == 2 and max(overlaps) == 1  # once per pair, one at a time
    assert all(got[i] is got[0] for i in (2, 4)) and all(got[i] is got[1] for i in (3, 5))
    assert got[0] is not got[1]


def test_calibration_off_never_touches_the_disk_and_bad_files_are_ignored(pair, tmp_path, count_measures):
    target, drafter, new_drafter = pair
    calibration.calibrate(target, drafter, new_drafter, folder=tmp_path / "off", mode="off")
    assert not (tmp_path / "off").exists()
    key = calibration.calibration_key(target, drafter)
    (tmp_path / f"{calibration_file.key_digest(key)}.json").write_text("{not json")
    calibration.clear_calibrations()
    calibration.calibrate(target, drafter, new_drafter, folder=tmp_path, mode="on")
    assert len(count_measures) == 2


def test_cache_location_and_mode_come_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("OPTTREE_CALIBRATION_DIR", raising=False)
    monkeypatch.setenv("OPTTREE_CACHE", str(tmp_path / "root"))
    assert calibration_file.cache_dir() == tmp_path / "root" / "calibration"
    monkeypatch.setenv("OPTTREE_CALIBRATION_DIR", str(tmp_path / "cal"))
    assert calibration_file.cache_dir() == tmp_path / "cal"
    monkeypatch.setenv("OPTTREE_CALIBRATION", "Refresh")
    assert calibration_file.cache_mode() == "refresh"
    monkeypatch.setenv("OPTTREE_CALIBRATION", "sometimes")
    with pytest.raises(ValueError, match="OPTTREE_CALIBRATION"):
        calibration_file.cache_mode()


def test_calibration_fits_the_context_or_refuses_auto(pair):
    target, drafter, new_drafter = pair
    assert calibration.calibration_prefix(target) == calibration.CALIBRATION_PREFIX  # tiny models: 256 positions
    drafter.context_length = calibration._ROOM + 20
    assert calibration.calibration_prefix(target, drafter) == 20  # less, where a context is shorter
    target.config.max_position_embeddings = calibration._ROOM + calibration.MIN_CALIBRATION_PREFIX - 1
    with pytest.raises(ValueError, match="context"):
        calibration.make_policy(TreeConfig(nodes="auto"), target, drafter, new_drafter)


def test_the_test_session_never_writes_into_the_home_cache():
    from pathlib import Path

    assert not str(calibration_file.cache_dir()).startswith(str(Path.home() / ".cache"))


def test_make_policy_measures_once_per_pair_and_keeps_other_settings(pair, count_measures):
    target, drafter, new_drafter = pair
    config = TreeConfig(nodes="auto", threshold=0.3, max_depth=7, strategy="heap")
    policy = calibration.make_policy(config, target, drafter, new_drafter)
    assert isinstance(policy, AutoPolicy) and policy.auto_nodes and not policy.auto_threshold
    plan = policy.plan()
    assert (plan.nodes, plan.threshold, plan.grow, policy.max_nodes) == (63, 0.3, None, 63)  # 64 rows with the root
    assert policy.latency.layer is not None and policy.latency.layer_time(8) > 0
    calibration.make_policy(config, target, drafter, new_drafter)
    assert len(count_measures) == 1  # cached
    assert isinstance(calibration.make_policy(TreeConfig(nodes=5), target, drafter), FixedPolicy)
    bare = ModelDrafter(tiny_model("llama", seed=1, layers=3))
    uncopyable = calibration.make_policy(TreeConfig(threshold="auto"), target, bare, None)
    assert uncopyable.latency.layer is None  # learnt from the steps instead
    assert uncopyable.max_nodes == 60 and uncopyable.plan().size is None


# ---------------------------------------------------------------------------------------------
# end to end: lossless


@pytest.mark.parametrize("strategy", ["opt", "heap"])
def test_auto_is_equal_to_greedy_generate(strategy):
    target = peaked(tiny_model("llama", seed=0), scale=30.0)
    ids = torch.randint(3, 90, (1, 7), generator=torch.Generator().manual_seed(2))
    ref = target.generate(ids, max_new_tokens=20, do_sample=False)
    for draft in (target, tiny_model("llama", seed=1), "prompt_lookup"):
        out = target.generate(ids, max_new_tokens=20, do_sample=False, custom_generate=speculative_generate,
                              draft_model=draft, nodes="auto", threshold="auto", strategy=strategy,
                              return_dict_in_generate=True)
        assert torch.equal(out.sequences, ref)
        assert max(out.stats.tree_sizes) <= latency_module.AUTO_MAX_NODES
        assert all(t.width <= 32 for s in out.stats.steps for t in s.layers)


def test_auto_learns_an_uncopyable_drafters_cost_and_stays_lossless():
    target = peaked(tiny_model("llama", seed=0), scale=30.0)
    ids = torch.randint(3, 90, (1, 7), generator=torch.Generator().manual_seed(3))
    ref = target.generate(ids, max_new_tokens=16, do_sample=False)
    drafter = ModelDrafter(tiny_model("llama", seed=1))  # a bare Drafter: no scratch copy to time
    out = target.generate(ids, max_new_tokens=16, do_sample=False, custom_generate=speculative_generate,
                          draft_model=drafter, nodes="auto", threshold="auto", return_dict_in_generate=True)
    assert torch.equal(out.sequences, ref)
    learnt = calibration.known_latency(target, drafter)
    assert learnt.layer is not None and math.isfinite(learnt.layer_time(4))


def test_steps_that_verify_the_root_alone_stay_lossless(monkeypatch):
    target = peaked(tiny_model("llama", seed=0), scale=30.0)
    ids = torch.randint(3, 90, (1, 7), generator=torch.Generator().manual_seed(4))
    policy = RecordingPolicy(8)
    policy.plan = lambda: StepPlan(nodes=8, threshold=0.0, size=lambda path_probs: 0)  # auto's m = 0, every step
    monkeypatch.setattr(integration.calibration, "policy_maker", lambda *args, **kwargs: lambda: policy)
    ref = target.generate(ids, max_new_tokens=12, do_sample=False)
    for draft in (target, "prompt_lookup"):
        out = target.generate(ids, max_new_tokens=12, do_sample=False, custom_generate=speculative_generate,
                              draft_model=draft, return_dict_in_generate=True)
        assert torch.equal(out.sequences, ref)
        assert set(out.stats.tree_sizes) == {0} and len(out.stats.steps) == 12


def test_the_strategies_benchmark_runs_every_strategy_fixed_budgets_and_auto():
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).parent.parent / "benchmarks" / "strategies.py"
    spec = importlib.util.spec_from_file_location("strategies_benchmark", path)
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # dataclasses look their module up
    spec.loader.exec_module(bench)
    args = bench.argparse.Namespace(nodes=16, budgets="8,32", threshold=0.3, max_depth=8,
                                    strategies="opt,heap,delayed,chain,static", auto="opt")
    methods = bench.methods_for(args)
    assert {m["strategy"] for m in methods.values()} == {"opt", "heap", "delayed", "chain", "static"}
    assert sorted(str(m["nodes"]) for m in methods.values() if m["strategy"] == "opt") == ["16", "16", "32", "8", "auto"]
    assert all(m["nodes"] == 16 for m in methods.values() if m["strategy"] != "opt")
    assert len(methods["static (EAGLE-style 25) n=16"]["static_tree"]) == 25


def test_auto_with_a_feature_head_is_calibrated_and_lossless(count_measures):
    target = peaked(tiny_model("llama", seed=0), scale=30.0)
    head, _ = new_head(target, init_layer=0)
    ids = torch.randint(3, 90, (1, 7), generator=torch.Generator().manual_seed(5))
    ref = target.generate(ids, max_new_tokens=16, do_sample=False)
    out = target.generate(ids, max_new_tokens=16, do_sample=False, custom_generate=speculative_generate,
                          draft_model=head, nodes="auto", threshold="auto", return_dict_in_generate=True)
    assert torch.equal(out.sequences, ref)
    assert len(count_measures) == 1 and calibration.known_latency(target, head.for_target(target)).layer is not None


def test_a_tree_is_padded_to_the_cheapest_measured_size_that_holds_it():
    """On a CPU a forward of 4 rows may cost less than one of 2 (kernels chosen per row count): a
    1-node tree (2 rows) is then verified at 4 rows, and priced so. Nothing measured: the smallest size."""
    from opttree.tree.plan import FixedPolicy

    odd = (0.048, 0.081, 0.058, 0.076, 0.093, 0.162, 0.250, 0.300)  # measured at 1 thread: T(2 rows) > T(4 rows)
    lat = latency(odd)
    assert [lat.verify_rows(n) for n in (0, 1, 2, 3, 4, 7, 8, 20)] == [1, 4, 4, 4, 8, 8, 16, 32]
    assert lat.verify_time(1) == pytest.approx(0.058) and lat.verify_time(0) == pytest.approx(0.048)
    assert [lat.verify_time(n) for n in range(0, 64)] == sorted(lat.verify_time(n) for n in range(0, 64))  # never less for more
    assert latency(CPU_LIKE).verify_rows(1) == 2  # control: where 2 rows are cheaper, 2 rows
    assert latency(CPU_LIKE).verify_rows(200) == 256  # beyond the table: its own size
    policy = AutoPolicy(TreeConfig(nodes="auto"), lat)
    assert policy.verify_rows(1) == 4
    assert FixedPolicy(TreeConfig(nodes=5)).verify_rows(1) == 2 and FixedPolicy(TreeConfig(nodes=5)).verify_rows(5) == 8


class FakeRig:
    """A verification rig whose forward over the root and n nodes 'takes' a + b · rows seconds."""

    def __init__(self, a: float, b: float, calls: list):
        self.a, self.b, self.calls = a, b, calls

    def __call__(self, target, prefix, forward=None, hidden=False, slots=None):
        return self

    def run(self, n: int) -> float:
        self.calls.append(n)
        return self.a + self.b * (n + 1)


@pytest.mark.parametrize("kind, a, b, timed", [
    ("flat (a GPU)", 2e-3, 1e-6, (0, 1, 3, 7, 15, 31, 63)),  # all fit in BUDGET_SECONDS, with more rounds
    ("a CPU", 0.3, 0.02, (0, 15)),  # T(16 rows) ~2.2x T(1): the budget of 6 forwards holds two sizes
    ("a flat 50 ms forward", 0.05, 1e-4, (0, 3, 15, 63)),  # BUDGET_SECONDS holds four sizes, once each
    ("a flatter CPU", 0.3, 0.002, (0, 15)),  # 64 rows would take it past 6 forwards
])
def test_calibration_times_the_sizes_its_budget_allows_and_fits_the_rest(kind, a, b, timed, monkeypatch):
    calls = []
    monkeypatch.setattr(timing, "VerifyRig", FakeRig(a, b, calls))
    table = timing.measure_verify_budgeted(None)
    assert table.sizes == timed
    assert table.seconds == tuple(a + b * (n + 1) for n in timed)
    spent = sum(a + b * (n + 1) for n in calls)
    budget = max(timing.BUDGET_FORWARDS * (a + b), timing.BUDGET_SECONDS)
    one_round = sum(a + b * (n + 1) for n in timed)  # the round after the pass, always run
    assert spent <= budget + 2 * (a + b * 16) + one_round  # the first two sizes are always timed, warm-ups included
    assert calls[:4] == [0, 0, 15, 15]  # each size warmed, then timed; the ends first
    full = latency_module.complete_table(table, calibration.VERIFY_NODES)
    assert full.sizes == calibration.VERIFY_NODES
    for n, t in zip(full.sizes, full.seconds):  # the fitted sizes on the line of the timed ones
        assert t == pytest.approx(a + b * (n + 1), rel=1e-9)


def test_a_step_at_a_fitted_size_replaces_the_fit_from_its_second_step_on():
    table = LatencyTable((0, 15), (0.010, 0.016))
    latency = LatencyModel(verify=latency_module.complete_table(table, (0, 1, 3, 7, 15, 31, 63)),
                           verify_measured=frozenset({0, 15}))
    fitted = latency.verify_time(63)
    latency.observe(step(63, 0.5))  # the first step at 64 rows: warms it (a compile, kernel trials)
    assert latency.verify_time(63) == pytest.approx(fitted) and 63 not in latency.verify_measured
    latency.observe(step(63, 0.05))
    assert 63 in latency.verify_measured and latency.verify_table(63) == pytest.approx(0.05)
    assert latency.verify_scale == 1.0 and latency.verify_offset == 0.0  # no evidence on the correction
    latency.observe(step(15, 0.032))  # a timed size: the correction moves, the table does not
    assert latency.verify_table(15) == pytest.approx(0.016) and latency.verify_scale > 1.0
    assert calibration_file.to_json(latency)["verify"] == {"sizes": (0, 15, 63), "seconds": (0.010, 0.016, 0.05)}
    back = calibration_file.from_json(json.loads(json.dumps(calibration_file.to_json(latency))))  # as a file holds it
    assert back.verify.sizes == calibration.VERIFY_NODES and back.verify_measured == {0, 15, 63}
    every = LatencyModel(verify=LatencyTable((0, 15), (0.010, 0.016)))  # control: a table given whole
    every.observe(step(15, 0.02))
    assert every.verify.sizes == (0, 15) and every.verify_measured is None


# decoding's clock against the calibration's: on the Xeon AMX in float32 the calibration (32 tokens, the fastest
# trial) priced 15 nodes at 1.5x the root, decoding's steps at 1.75x (RESULTS, "Is auto as fast ...")
CALIBRATED = LatencyTable((0, 15), (0.046, 0.069))  # what the calibration timed; the other sizes fitted
DECODING = {0: 0.055, 1: 0.057, 3: 0.058, 7: 0.072, 15: 0.097, 31: 0.150, 63: 0.250}  # what decoding's steps take
CONFIDENT_TAIL = torch.tensor([0.6, 0.3, 0.2, 0.1] + [0.09] * 4 + [0.08] * 7)  # 15 nodes worth verifying at T(15)


def calibrated_model() -> LatencyModel:
    return LatencyModel(verify=latency_module.complete_table(CALIBRATED, calibration.VERIFY_NODES),
                        verify_measured=frozenset(CALIBRATED.sizes))


def decode_on_the_clock(latency: LatencyModel, steps: int) -> list[int]:
    """``steps`` steps of an auto policy on ``latency``, each verifying its chosen tree at DECODING's time (no
    drafting time: only the verification's price decides); the priced size of each step."""
    policy = AutoPolicy(TreeConfig(nodes="auto"), latency, clock=lambda: 0.0)
    sizes = []
    for _ in range(steps):
        m = policy.plan().size(CONFIDENT_TAIL)
        sizes.append(policy.verify_rows(m) - 1)  # as the loop asks (loop/verify_inputs.py)
        policy.observe(step(m, DECODING[sizes[-1]]))
    return sizes


def truth_best() -> int:
    gain = {n: 1 + float(CONFIDENT_TAIL[:n].sum()) for n in (0, 1, 3, 7, 15)}
    return max(gain, key=lambda n: gain[n] / DECODING[n])


def test_decoding_clock_prices_the_sizes_it_verifies_and_probes_the_smaller_ones():
    """The calibration's ratio T(15) / T(0) is wrong; one correction for every size keeps it wrong (a pure scale
    where the steps verify one size), so without the clock per size auto keeps 15 nodes; with it, and probes of
    the smaller sizes, it finds the size that is fastest on decoding's clock, and then probes rarely."""
    assert truth_best() == 3 and best_size(CONFIDENT_TAIL, calibrated_model(), 0.0) == 15
    latency = calibrated_model()
    sizes = decode_on_the_clock(latency, 300)
    assert sizes[0] == 15 and sizes[-40:].count(truth_best()) >= 39  # at most one probe in the last 40 steps
    for n in (0, 1, 3, 15):  # the sizes below the one chosen were probed, those above it never
        assert latency.priced_by_clock(n) and latency.verify_time(n) == pytest.approx(DECODING[n])
    assert latency.verify_time(31) != pytest.approx(DECODING[31])  # never verified there: the corrected table


def test_a_size_the_calibration_timed_too_dear_is_probed_at_its_own_rows(monkeypatch):
    """A table that prices 4 and 8 rows dearer than 16 (this Xeon, 135 M bfloat16: 80 / 84 against 71 ms, the
    first two from one noisy decoding step each, where decoding takes them cheaper): a tree of 3 or 7 nodes is
    then padded to 16 rows, so a probe of those sizes must be verified at its own rows, or decoding's clock never
    prices them and 15 nodes stay for good."""
    noisy = LatencyTable((0, 1, 3, 7, 15), (0.046, 0.050, 0.080, 0.084, 0.069))

    def noisy_model() -> LatencyModel:
        return LatencyModel(verify=latency_module.complete_table(noisy, calibration.VERIFY_NODES),
                            verify_measured=frozenset(noisy.sizes))

    assert best_size(CONFIDENT_TAIL, noisy_model(), 0.0) == 15 and noisy_model().verify_rows(3) == 16
    latency = noisy_model()
    sizes = decode_on_the_clock(latency, 300)
    assert sizes[-40:].count(truth_best()) >= 39, sizes[-40:]
    assert latency.priced_by_clock(3) and latency.verify_time(3) == pytest.approx(DECODING[3])
    # control: a probe padded as the table pads it times 16 rows again, and 15 nodes stay
    monkeypatch.setattr(AutoPolicy, "verify_rows", lambda self, nodes: self.latency.verify_rows(nodes))
    assert set(decode_on_the_clock(noisy_model(), 300)[-40:]) == {15}


def test_without_the_clock_per_size_auto_keeps_the_calibrations_choice(monkeypatch):
    """Negative control: the probes and the per-size clock out of reach, the calibration's choice stays."""
    for name in ("SEEN_AFTER", "PROBE_EVERY", "PROBE_AGAIN"):
        monkeypatch.setattr(latency_module, name, 10**9)
    sizes = decode_on_the_clock(calibrated_model(), 300)
    assert set(sizes[1:]) == {15}


def test_a_compiled_forwards_model_verifies_only_at_the_sizes_calibration_timed():
    """A compiled verification forward: every size is a graph, compiled at its first forward (tens of seconds on a
    CPU), so decoding verifies only at the sizes calibration timed (and compiled): a smaller tree is padded to the
    nearest of them, a larger one is priced out, and no probe goes elsewhere. Control: the same model eager finds
    decoding's fastest size, 3 nodes, which calibration never timed."""
    latency = calibrated_model()
    latency.measured_only = True
    sizes = decode_on_the_clock(latency, 300)
    assert set(sizes) == {0, 15} or set(sizes) == {15}, sorted(set(sizes))
    assert [latency.verify_rows(n) for n in (0, 1, 3, 7, 15)] == [1, 16, 16, 16, 16]
    assert latency.verify_time(16) == float("inf") and latency.verify_time(63) == float("inf")
    assert all(latency.probe(15) in (0, 15) for _ in range(2 * latency_module.PROBE_AGAIN))
    assert as_calibrated(latency).measured_only  # what a sampled call plans from keeps the rule
    eager = calibrated_model()
    assert truth_best() in decode_on_the_clock(eager, 300)[-40:]  # control


def test_a_size_is_priced_by_the_clock_from_its_third_step_and_probes_follow_the_schedule():
    latency = calibrated_model()
    assert latency.probe(15) == 15  # no timed step yet: nothing to compare with
    latency.observe(step(15, 0.5))  # the first step at a size warms it: not counted
    latency.observe(step(15, 0.1))
    assert not latency.priced_by_clock(15)
    latency.observe(step(15, 0.1))
    assert latency.priced_by_clock(15) and latency.verify_time(15) == pytest.approx(0.1)
    latency.observe(step(15, 10.0))  # an outlier counts as 4x the mean at most (the 3rd counted step: weight 1/3)
    assert latency.seen[15].seconds == pytest.approx(0.1 + (0.4 - 0.1) / 3)
    for _ in range(latency_module.PROBE_EVERY - latency.steps % latency_module.PROBE_EVERY):
        latency.observe(step(15, 0.1))
    assert latency.probe(12) == 7 and latency.probe(0) == 0  # the nearest open size below; nothing below the root


def test_once_the_smaller_sizes_are_priced_a_probe_comes_every_probe_again_steps():
    latency = calibrated_model()
    for n in (0, 1, 3, 7, 15):
        for _ in range(latency_module.SEEN_AFTER + 1):
            latency.observe(step(n, DECODING[n]), n)  # verified at its own size, as a probe is
    assert all(latency.priced_by_clock(n) for n in (0, 1, 3, 7, 15))
    probes = []
    for _ in range(2 * latency_module.PROBE_AGAIN):
        probes.append(latency.probe(15))
        latency.observe(step(15, DECODING[15]))
    assert probes.count(7) == 2 and probes.count(15) == len(probes) - 2  # the nearest below, to follow a drift


def test_a_sampled_calls_policy_never_probes():
    latency = calibrated_model()
    for _ in range(latency_module.PROBE_EVERY):
        latency.observe(step(15, CALIBRATED.seconds[1]))  # as calibrated: the choice stays 15
    untimed = AutoPolicy(TreeConfig(nodes="auto"), latency, timed=False)
    assert latency.probe(15) != 15 and untimed.plan().size(CONFIDENT_TAIL) == 15


def test_calibration_times_a_sliding_window_model_past_its_window_as_decoding_runs_it(monkeypatch):
    """measure_verify on a Mistral whose 16-token window is far shorter than the 256-token prefix it
    times on (before: a raw sdpa size error, "(16) must match (257)"): the cache keeps every slot and
    the mask is the sliding one, as in decoding. Control: the forwards it times see the window."""
    from models import windowed_model
    from opttree.tree import masks

    target = windowed_model("mistral", 16)
    seen = []
    real = masks.tree_forward_inputs

    def spy(*args, **kwargs):
        seen.append(kwargs.get("layout"))
        return real(*args, **kwargs)

    monkeypatch.setattr(masks, "tree_forward_inputs", spy)
    times = timing.measure_verify(target, sizes=(1, 7), prefix=calibration.CALIBRATION_PREFIX, repeats=1)
    assert len(times) == 2 and all(t > 0 for t in times)
    assert seen and all(layout is not None and layout.windowed for layout in seen)


def test_calibration_times_the_verification_forward_decoding_runs(monkeypatch):
    """One verification forward: the rig runs the function the loop runs (hf.compiled.target_forward, through
    its one seam with hf, ScratchTarget), on the inputs a step builds for that size (padded to its
    verification size, on the rig's prefix)."""
    from opttree.hf import compiled
    from opttree.loop import generation

    assert generation.target_forward is compiled.target_forward
    calls, real = [], compiled.target_forward

    def spy(target, inputs, cache, want_hidden, extra=None, forward=None):
        calls.append((inputs.input_ids.shape[1], inputs.past_len, want_hidden, extra, forward))
        return real(target, inputs, cache, want_hidden, extra, forward)

    monkeypatch.setattr(compiled, "target_forward", spy)
    rig = timing.VerifyRig(tiny_model("llama"), prefix=8, hidden=True)
    assert rig.run(5) > 0 and rig.run(0) > 0
    assert calls == [(8, 8, True, None, None), (1, 8, True, None, None)]  # 1 + 5 rows padded to 8; the root alone


def test_a_size_is_warmed_until_its_forwards_stop_getting_faster():
    """The first forwards of a size pay its kernels' trials and packing (or a compile): forwards run
    until one is no faster than 0.8 x the one before it, at most 4, and the fastest after the first is timed."""
    class Rig:
        def __init__(self, seconds):
            self.seconds = list(seconds)

        def run(self, n):
            return self.seconds.pop(0)

    assert timing.warm_then_time(Rig([7.0, 0.9, 0.35, 0.34]), 15) == (0.34, 4)
    assert timing.warm_then_time(Rig([7.0, 0.9, 0.85]), 15) == (0.85, 3)
    assert timing.warm_then_time(Rig([0.3, 0.29, 9.0]), 0) == (0.29, 2)  # steady at once: one warm-up
    assert timing.warm_then_time(Rig([8.0, 4.0, 2.0, 1.0, 0.5]), 63) == (1.0, 4)  # at most four
    # a spike after the warm-up (a kernel chosen for good packing every weight it had not met): not the time
    assert timing.warm_then_time(Rig([0.35, 0.11, 1.0]), 15) == (0.11, 3)


def test_a_size_is_warmed_until_a_forward_runs_with_its_kernels_chosen_and_packed(monkeypatch):
    """Seen on a Zen 4 in float32 (SmolLM2, 16 rows): forwards took 0.3-0.7 s while the kernels tried
    candidates and packed weights for the one chosen, 0.1 s after; the 4 forwards the speed rule ran all
    fell in that phase, T(15) read 0.54 s and `auto` kept ~1-node trees. Forwards now go on while one
    changes linears.preparing() (at most SETTLE_FORWARDS), and the fastest after the first is timed.
    Control: with nothing preparing, the speed rule alone (2 forwards)."""
    from opttree.kernels import linears

    class Rig:
        def __init__(self, seconds, preparing_runs):
            self.seconds, self.preparing_runs, self.count, self.runs = list(seconds), preparing_runs, 0, 0

        def run(self, n):
            self.runs += 1
            if self.runs <= self.preparing_runs:
                self.count += 1  # a trial or a packed weight in this forward
            return self.seconds.pop(0)

    rig = Rig([0.30, 0.29, 0.70, 0.35, 0.10, 0.11, 9.0], preparing_runs=5)
    monkeypatch.setattr(linears, "preparing", lambda: rig.count)
    assert timing.warm_then_time(rig, 15) == (0.10, 6)  # the 6th forward is the first with nothing preparing
    rig = Rig([0.30, 0.29, 0.70] + [0.5] * 10, preparing_runs=100)
    assert timing.warm_then_time(rig, 15) == (0.29, timing.SETTLE_FORWARDS)  # bounded
    rig = Rig([0.30, 0.29, 9.0], preparing_runs=0)
    assert timing.warm_then_time(rig, 15) == (0.29, 2)  # control


def test_calibration_warms_a_size_until_the_real_kernels_have_settled_there(monkeypatch):
    """On a real (tiny, 12-layer) target under the CPU kernels, from a fresh choice: after a size is
    warmed and timed, one more forward of it neither tries a kernel nor packs a weight (a count, not a
    time). Its LM head runs its trials at one product, as an LM head over twice the cache does."""
    from opttree.kernels import linears
    from opttree.kernels.choice import Chooser

    target = tiny_model("llama", layers=12)
    head = target.get_output_embeddings().weight
    monkeypatch.setattr(linears, "IN_PLACE_BYTES", head.numel() * head.element_size())
    real, linears._choice = linears._choice, Chooser()
    try:
        with torch.inference_mode(), linears.fast_linears(target):
            rig = timing.VerifyRig(target, prefix=8)
            for n in (0, 15):
                _, runs = timing.warm_then_time(rig, n)
                before = linears.preparing()
                rig.run(n)
                assert linears.preparing() == before and 2 <= runs <= timing.SETTLE_FORWARDS
    finally:
        linears._choice = real
