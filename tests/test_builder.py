"""OPT-Tree construction against brute force, with a synthetic drafter (no model)."""

import itertools

import pytest
import torch

from opttree import TreeConfig, build_opt_tree
from opttree.tree.builder import best_nodes

VOCAB = 5


def synthetic_probs(path: tuple) -> torch.Tensor:
    """A fixed pseudo-random draft distribution for each context (path of tokens)."""
    g = torch.Generator().manual_seed(hash(path) % (2**31))
    logits = torch.randn(VOCAB, generator=g) * 2.0
    return torch.softmax(logits, -1)


class Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, pool, frontier):
        self.calls.append(frontier.tolist())
        return torch.stack([synthetic_probs(tuple(pool.tokens[pool.path_to(i)].tolist())) for i in frontier.tolist()])


def brute_force_best(nodes: int, depth: int) -> float:
    """E(A) of the best `nodes`-node tree of depth <= `depth`: the top-`nodes` p̂ of all sequences."""
    probs = []
    for d in range(1, depth + 1):
        for seq in itertools.product(range(VOCAB), repeat=d):
            p = 1.0
            for k in range(d):
                p *= float(synthetic_probs(seq[:k])[seq[k]])
            probs.append(p)
    return sum(sorted(probs, reverse=True)[:nodes])


@pytest.mark.parametrize("nodes,depth", [(1, 3), (3, 2), (6, 3), (10, 4)])
def test_threshold_zero_reaches_the_brute_force_optimum(nodes, depth):
    built = build_opt_tree(synthetic_probs(()), Recorder(), TreeConfig(nodes=nodes, threshold=0.0, max_depth=depth))
    assert len(built.tree) == nodes
    assert built.tree.expected_length == pytest.approx(brute_force_best(nodes, depth), rel=1e-5)


def test_final_tree_is_closed_under_ancestors_even_with_ties():
    # every child has probability 1 on token 0: p̂ ties along the whole chain
    def certain(pool, frontier):
        probs = torch.zeros(len(frontier), VOCAB)
        probs[:, 0] = 1.0
        return probs

    root = torch.tensor([0.5, 0.5, 0.0, 0.0, 0.0])
    built = build_opt_tree(root, certain, TreeConfig(nodes=4, threshold=0.0, max_depth=6))
    tree = built.tree
    assert len(tree) == 4
    assert all(p < i for i, p in enumerate(tree.parents.tolist()))
    assert set(tree.parents.tolist()) <= {-1} | set(range(len(tree)))


def test_no_draft_forward_is_wasted():
    """Every expand() result feeds a layer that the builder then scores; the newest layer is never
    expanded just to be thrown away (the official code runs one such forward per step)."""
    rec = Recorder()
    built = build_opt_tree(synthetic_probs(()), rec, TreeConfig(nodes=8, threshold=0.2, max_depth=10))
    assert len(rec.calls) == built.draft_forwards == len(built.expected_lengths) - 1
    deepest = int(built.tree.depths().max())
    assert built.draft_forwards <= deepest  # a forward at depth d produces depth d + 1


def test_only_nodes_that_can_matter_are_expanded():
    rec = Recorder()
    build_opt_tree(synthetic_probs(()), rec, TreeConfig(nodes=4, threshold=0.0, max_depth=4))
    assert all(len(frontier) <= 4 for frontier in rec.calls)


def test_large_threshold_stops_after_one_layer():
    rec = Recorder()
    built = build_opt_tree(synthetic_probs(()), rec, TreeConfig(nodes=5, threshold=10.0, max_depth=10))
    assert int(built.tree.depths().max()) <= 2
    assert built.draft_forwards == 1


def test_max_depth_and_step_cap():
    built = build_opt_tree(synthetic_probs(()), Recorder(), TreeConfig(nodes=20, threshold=0.0, max_depth=2))
    assert int(built.tree.depths().max()) <= 2
    capped = build_opt_tree(synthetic_probs(()), Recorder(), TreeConfig(nodes=20, threshold=0.0, max_depth=5), max_depth=1)
    assert int(capped.tree.depths().max()) == 1
    empty = build_opt_tree(synthetic_probs(()), Recorder(), TreeConfig(), max_depth=0)
    assert len(empty.tree) == 0


def test_zero_probability_tokens_are_never_drafted():
    root = torch.tensor([0.7, 0.3, 0.0, 0.0, 0.0])
    built = build_opt_tree(root, Recorder(), TreeConfig(nodes=5, threshold=100.0, max_depth=1))
    assert sorted(built.tree.tokens.tolist()) == [0, 1]


def test_best_nodes_breaks_ties_parent_first():
    assert best_nodes(torch.tensor([0.5, 0.5, 0.5, 0.1]), 2).tolist() == [0, 1]


def test_a_layer_read_from_the_best_nodes_alone_equals_one_read_from_the_whole_pool():
    """read_layer sees the previous reading's best nodes instead of the whole pool: same E(A),
    same frontier, ties included (many equal p̂, zeros too)."""
    from opttree.tree.builder import read_layer

    def whole_pool(pool, layer, budget):  # the reference: a stable sort of everything
        merged = torch.sort(torch.cat([pool, layer]), descending=True, stable=True)
        frontier = int((merged.indices[:budget] >= pool.shape[0]).sum())
        return float(merged.values[:budget].sum()), min(frontier, int((layer > 0).sum()))

    g = torch.Generator().manual_seed(0)
    for trial in range(200):
        budget = int(torch.randint(1, 12, (1,), generator=g))
        pool, best = torch.empty(0), []
        for _ in range(4):
            layer = (torch.randint(0, 4, (int(torch.randint(1, 15, (1,), generator=g)),), generator=g) / 4.0)
            layer = torch.sort(layer, descending=True).values  # coarse values: ties everywhere
            reading = read_layer(best, layer, budget)
            gain, frontier = whole_pool(pool, layer, budget)
            assert reading.expected_length == pytest.approx(gain) and reading.frontier == frontier, trial
            pool, best = torch.cat([pool, layer[:reading.positive]]), reading.best


@pytest.mark.parametrize("k,vocab", [(3, 7), (40, 30000)])  # the flat path and the per-row one
def test_top_children_are_the_best_products_either_way(k, vocab):
    from opttree.tree.builder import WIDE_LAYER, top_children

    g = torch.Generator().manual_seed(k)
    parents = torch.rand(k, generator=g)
    children = torch.softmax(torch.randn(k, vocab, generator=g) * 4, dim=-1)
    assert (k * vocab >= WIDE_LAYER) == (vocab == 30000)
    rows, tokens, probs = top_children(parents, children, 20)
    products = (parents[:, None] * children).view(-1)
    expected = products.topk(min(20, products.numel())).values
    assert torch.equal(probs, expected)  # the best values, descending
    assert torch.equal(parents[rows] * children[rows, tokens], probs)  # each names its own parent and token
