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
