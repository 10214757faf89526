import torch

from opttree import DraftTree


def small_tree():
    # root ─ a(0) ─ c(2)
    #      └ b(1) ─ d(3) ─ e(4)
    return DraftTree(torch.tensor([10, 11, 12, 13, 14]), torch.tensor([-1, -1, 0, 1, 3]),
                     torch.tensor([0.6, 0.3, 0.3, 0.2, 0.1]))


def test_depths_paths_and_children():
    tree = small_tree()
    assert tree.depths().tolist() == [1, 1, 2, 2, 3]
    assert tree.path_to(4) == [1, 3, 4]
    assert tree.children() == [[0, 1], [2], [3], [], [4], []]
    assert tree.choices() == [(0,), (1,), (0, 0), (1, 0), (1, 0, 0)]
    assert abs(tree.expected_length - 1.5) < 1e-6


def test_ancestor_mask_is_exactly_self_and_ancestors():
    mask = small_tree().ancestor_mask()
    expected = torch.tensor([
        [1, 0, 0, 0, 0],
        [0, 1, 0, 0, 0],
        [1, 0, 1, 0, 0],
        [0, 1, 0, 1, 0],
        [0, 1, 0, 1, 1],
    ], dtype=torch.bool)
    assert torch.equal(mask, expected)


def test_from_paths_round_trips_choices():
    paths = [(0,), (1,), (0, 0), (0, 1), (0, 0, 0)]
    tree = DraftTree.from_paths(paths, tokens_of_path=lambda p: sum(p) + len(p))
    assert tree.choices() == paths
    assert tree.parents.tolist() == [-1, -1, 0, 0, 2]


def test_parents_must_precede_children():
    import pytest

    with pytest.raises(ValueError):
        DraftTree(torch.tensor([1, 2]), torch.tensor([1, -1]), torch.tensor([0.5, 0.5]))


def test_render_marks_accepted_path():
    text = small_tree().render(decode=lambda t: f"t{t}", accepted=[1, 3])
    assert "(root)" in text and "*'t11'" in text and "*'t13'" in text and " 't10'" in text


def grown_by_layers(tree, capacity=0):
    """``tree`` rebuilt with first_layer + extend, one layer per depth (parents keep their order)."""
    depth = tree.depths()
    first = (depth == 1).nonzero().flatten()
    grown = DraftTree.first_layer(tree.tokens[first], tree.path_probs[first], capacity=capacity)
    index = {int(i): k for k, i in enumerate(first)}
    for d in range(2, int(depth.max()) + 1):
        ids = (depth == d).nonzero().flatten()
        parents = torch.tensor([index[int(tree.parents[i])] for i in ids])
        for k, i in enumerate(ids.tolist()):
            index[i] = len(grown) + k
        grown = grown.extend(tree.tokens[ids], parents, tree.path_probs[ids])
    return grown


def test_extend_writes_the_same_ancestors_as_the_closure_whatever_the_capacity():
    tree = small_tree()
    for capacity in (0, 2, 5, 64):  # 0 and 2: the store doubles on the way
        grown = grown_by_layers(tree, capacity)
        from opttree.tree.draft_tree import closure
        assert torch.equal(grown.ancestor_mask(), closure(grown.parents))
        assert grown.depths().tolist() == sorted(tree.depths().tolist())


def test_an_older_tree_extended_again_keeps_both_trees_right():
    """Two extensions of the SAME tree (a branch): the second may not overwrite the rows the first wrote."""
    from opttree.tree.draft_tree import closure
    base = DraftTree.first_layer(torch.tensor([1, 2]), torch.tensor([0.6, 0.4]), capacity=8)
    left = base.extend(torch.tensor([3]), torch.tensor([0]), torch.tensor([0.5]))
    right = base.extend(torch.tensor([4, 5]), torch.tensor([1, 1]), torch.tensor([0.3, 0.1]))
    for tree in (base, left, right):
        assert torch.equal(tree.ancestor_mask(), closure(tree.parents))
    assert left.ancestor_mask()[2].tolist() == [True, False, True]
    assert right.ancestor_mask()[2:].tolist() == [[False, True, True, False], [False, True, False, True]]
