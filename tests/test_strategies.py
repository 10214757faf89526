"""Every tree strategy: the same greedy-equality test, the builder contract, and per-strategy shape."""

import pytest
import torch

from models import peaked, tiny_model
from opttree import TreeConfig, speculative_generate
from opttree.tree.builder import build_opt_tree
from opttree.tree.registry import STRATEGIES
from opttree.tree.static_trees import (BINARY_DEPTH_3, EAGLE_STYLE_25, EAGLE_STYLE_60, NAMED_TREES, check_paths,
                                       positional_tree)
from opttree.tree.strategies import build_heap_tree, build_tree, keep_best
from test_builder import brute_force_best, synthetic_probs


def test_every_strategy_has_a_builder():
    assert tuple(STRATEGIES) == ("opt", "heap", "delayed", "chain", "static", "sampled")
    assert all(callable(record.grow) and record.name == name for name, record in STRATEGIES.items())


# ---------------------------------------------------------------------------------------------
# greedy equality, unchanged for every strategy

def _prompt(seed):
    return torch.randint(3, 90, (1, 7), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("strategy", tuple(STRATEGIES))
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_equal_to_greedy_generate_for_every_strategy(strategy, family):
    target = peaked(tiny_model(family, seed=0), scale=30.0)
    drafts = {"agree": target, "unrelated": tiny_model(family, seed=1)}
    ids = _prompt(0)
    ref = target.generate(ids, max_new_tokens=16, do_sample=False)
    for name, draft in drafts.items():
        out = target.generate(ids, max_new_tokens=16, do_sample=False, custom_generate=speculative_generate,
                              draft_model=draft, strategy=strategy, nodes=10, threshold=0.1, max_depth=6,
                              return_dict_in_generate=True)
        assert torch.equal(out.sequences, ref), (strategy, family, name)
        assert max(out.stats.tree_sizes) <= 10
        if name == "agree":  # the draft really drafts: several tokens per step
            assert out.stats.mean_accepted_tokens > 1.5, strategy


@pytest.mark.parametrize("tree", [BINARY_DEPTH_3, ((0,), (0, 0), (0, 0, 3), (2,))])
def test_static_trees_never_change_the_output(tree):
    target = peaked(tiny_model("qwen3", seed=0), scale=30.0)
    ids = _prompt(1)
    ref = target.generate(ids, max_new_tokens=16, do_sample=False)
    for draft in (target, tiny_model("qwen3", seed=1)):
        out = target.generate(ids, max_new_tokens=16, do_sample=False, custom_generate=speculative_generate,
                              draft_model=draft, strategy="static", static_tree=tree, nodes=60)
        assert torch.equal(out, ref)


# ---------------------------------------------------------------------------------------------
# the builder contract, with a synthetic drafter (no model)

class StrictDrafter:
    """Plays a model drafter: checks that the pool only grows by appending and that every
    frontier node's parent was expanded before it (its ancestors are in the draft's cache)."""

    def __init__(self):
        self.pool = None
        self.expanded = set()
        self.calls = []

    def __call__(self, pool, frontier):
        if self.pool is not None:
            n = len(self.pool)
            assert len(pool) >= n
            assert torch.equal(pool.tokens[:n], self.pool.tokens) and torch.equal(pool.parents[:n], self.pool.parents)
        for i in frontier.tolist():
            parent = int(pool.parents[i])
            assert parent < 0 or parent in self.expanded, "a node was expanded before its parent"
            assert i not in self.expanded, "a node was expanded twice"
        self.expanded.update(frontier.tolist())
        self.pool = pool
        self.calls.append(frontier.tolist())
        return torch.stack([synthetic_probs(self.path(pool, i)) for i in frontier.tolist()])

    @staticmethod
    def path(tree, i):
        return tuple(tree.tokens[tree.path_to(i)].tolist())


@pytest.mark.parametrize("strategy", tuple(STRATEGIES))
@pytest.mark.parametrize("nodes,depth", [(1, 3), (4, 2), (9, 4), (20, 6)])
def test_builder_contract(strategy, nodes, depth):
    drafter = StrictDrafter()
    config = TreeConfig(nodes=nodes, threshold=0.0, max_depth=depth, strategy=strategy)
    built = build_tree(synthetic_probs(()), drafter, config)
    tree = built.tree
    assert 1 <= len(tree) <= nodes
    assert int(tree.depths().max()) <= depth
    assert built.draft_forwards == len(drafter.calls)
    # pool ids name the pool nodes that carry the tree's tokens and parents
    if drafter.pool is not None:
        pool = drafter.pool
        for i, pid in enumerate(built.pool_ids.tolist()):
            if pid < len(pool):
                assert int(pool.tokens[pid]) == int(tree.tokens[i])
    # p̂ is the product of q along the path, and draft_probs hold each expanded node's true q
    for i in range(len(tree)):
        path = StrictDrafter.path(tree, i)
        p = 1.0
        for k in range(len(path)):
            p *= float(synthetic_probs(path[:k])[path[k]])
        assert float(tree.path_probs[i]) == pytest.approx(p, rel=1e-5)
    assert torch.allclose(built.draft_probs[-1], synthetic_probs(()))
    for i, q in built.draft_probs.items():
        if i >= 0:
            assert torch.allclose(q, synthetic_probs(StrictDrafter.path(tree, i)))
    # tree nodes whose children are in the tree were expanded, as were their q's recorded
    for parent in set(tree.parents.tolist()) - {-1}:
        assert parent in built.draft_probs


@pytest.mark.parametrize("nodes,depth", [(1, 3), (3, 2), (6, 3), (10, 4), (25, 5)])
@pytest.mark.parametrize("batch", [1, 3, None])
def test_heap_is_optimal_for_its_budget(nodes, depth, batch):
    built = build_heap_tree(synthetic_probs(()), StrictDrafter(), TreeConfig(nodes=nodes, max_depth=depth), batch=batch)
    assert len(built.tree) == nodes
    assert built.tree.expected_length == pytest.approx(brute_force_best(nodes, depth), rel=1e-5)


def test_the_brute_force_cases_need_depth():
    """Negative control: in these cases a one-layer tree (no expansion at all) is not optimal, so
    the optimality test above can fail."""
    for nodes, depth in [(6, 3), (10, 4), (25, 5)]:
        assert brute_force_best(nodes, depth) > brute_force_best(nodes, 1) + 1e-3
        one_forward = build_heap_tree(synthetic_probs(()), StrictDrafter(), TreeConfig(nodes=nodes, max_depth=2), batch=1)
        assert one_forward.tree.expected_length < brute_force_best(nodes, depth) - 1e-4


def test_heap_batches_its_expansions():
    one, eight = StrictDrafter(), StrictDrafter()
    build_heap_tree(synthetic_probs(()), one, TreeConfig(nodes=24, max_depth=5), batch=1)
    build_heap_tree(synthetic_probs(()), eight, TreeConfig(nodes=24, max_depth=5), batch=8)
    assert all(len(c) == 1 for c in one.calls)
    assert len(eight.calls) < len(one.calls)


def test_heap_matches_opt_with_zero_threshold_and_is_never_worse():
    for nodes, depth in [(5, 3), (12, 4)]:
        config = TreeConfig(nodes=nodes, threshold=0.0, max_depth=depth)
        heap = build_heap_tree(synthetic_probs(()), StrictDrafter(), config)
        opt = build_opt_tree(synthetic_probs(()), StrictDrafter(), config)
        assert heap.tree.expected_length == pytest.approx(opt.tree.expected_length, rel=1e-6)
        lazy = build_opt_tree(synthetic_probs(()), StrictDrafter(), TreeConfig(nodes=nodes, threshold=0.3, max_depth=depth))
        assert heap.tree.expected_length >= lazy.tree.expected_length - 1e-9


def test_chain_is_one_greedy_path():
    built = build_tree(synthetic_probs(()), StrictDrafter(), TreeConfig(nodes=10, max_depth=4, strategy="chain"))
    tree = built.tree
    assert len(tree) == 4 and tree.parents.tolist() == [-1, 0, 1, 2]
    for i in range(4):
        assert int(tree.tokens[i]) == int(torch.argmax(synthetic_probs(StrictDrafter.path(tree, i)[:-1])))
    assert len(build_tree(synthetic_probs(()), StrictDrafter(), TreeConfig(nodes=3, max_depth=9, strategy="chain")).tree) == 3


@pytest.mark.parametrize("delay", [1, 2, 3])
def test_delayed_branches_only_below_its_path(delay):
    from opttree.tree.strategies import build_delayed_tree

    built = build_delayed_tree(synthetic_probs(()), StrictDrafter(), TreeConfig(nodes=12, threshold=0.0, max_depth=6),
                               delay=delay)
    kids = built.tree.children()
    for d in range(delay):  # the root and the first delay - 1 path nodes have exactly one child
        assert len(kids[d]) == 1 and kids[d][0] == d
    assert max(len(k) for k in kids[delay:]) > 1  # it branches, but only from the path's tip on
    assert len(built.tree) == 12


def test_static_fills_the_given_shape():
    built = build_tree(synthetic_probs(()), StrictDrafter(),
                       TreeConfig(nodes=60, max_depth=10, strategy="static", static_tree=BINARY_DEPTH_3))
    assert sorted(built.tree.choices()) == sorted(BINARY_DEPTH_3)
    assert built.draft_forwards == 2  # one per depth below the first
    capped = build_tree(synthetic_probs(()), StrictDrafter(),
                        TreeConfig(nodes=60, max_depth=2, strategy="static", static_tree=BINARY_DEPTH_3))
    assert len(capped.tree) == 6
    budgeted = build_tree(synthetic_probs(()), StrictDrafter(),
                          TreeConfig(nodes=5, max_depth=10, strategy="static", static_tree=EAGLE_STYLE_25))
    assert len(budgeted.tree) == 5


def test_static_drops_tokens_the_draft_cannot_propose():
    root = torch.tensor([0.6, 0.4, 0.0, 0.0, 0.0])
    built = build_tree(root, StrictDrafter(), TreeConfig(nodes=60, strategy="static", static_tree=((0,), (1,), (2,), (2, 0))))
    assert sorted(built.tree.tokens.tolist()) == [0, 1]


def test_named_static_trees_are_valid():
    for name, paths in NAMED_TREES.items():
        assert check_paths(paths) == paths, name
    assert len(EAGLE_STYLE_25) == 25 and len(EAGLE_STYLE_60) == 60 and len(BINARY_DEPTH_3) == 14
    assert positional_tree(3, (0.9, 0.05), max_depth=5) == ((0,), (0, 0), (0, 0, 0))


@pytest.mark.parametrize("bad", [(), ((0,), (0,)), ((0, 1),), ((-1,),), (((0,),),), (3,)])
def test_bad_static_trees_are_refused(bad):
    with pytest.raises(ValueError):
        check_paths(bad)


def test_keep_best_is_a_valid_subtree():
    built = build_tree(synthetic_probs(()), StrictDrafter(), TreeConfig(nodes=15, threshold=0.0, max_depth=4, strategy="heap"))
    for m in range(1, 15):
        cut = keep_best(built, m)
        assert len(cut.tree) == m
        assert all(p < i for i, p in enumerate(cut.tree.parents.tolist()))
        expected = torch.sort(built.tree.path_probs, descending=True).values[:m].sum()
        assert cut.tree.expected_length == pytest.approx(float(expected), rel=1e-6)
        full_ids = built.pool_ids.tolist()
        for i, pid in enumerate(cut.pool_ids.tolist()):
            assert int(cut.tree.tokens[i]) == int(built.tree.tokens[full_ids.index(pid)])


def test_unresolved_auto_is_refused_by_the_builder():
    with pytest.raises(ValueError, match="resolved"):
        build_tree(synthetic_probs(()), StrictDrafter(), TreeConfig(nodes="auto"))

