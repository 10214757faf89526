"""A node's logits under the tree mask equal the logits of its root→node path run as a plain
sequence, for the target's verification forward and for the draft's layer forwards."""

import pytest
import torch
from transformers import DynamicCache

from models import FAMILIES, peaked, tiny_model
from opttree import TreeConfig, build_opt_tree
from opttree.drafters import ModelDrafter
from opttree.hf.compat import with_cache
from opttree.tree.masks import verification_inputs
from opttree.tree import DraftTree


def path_logits(model, prefix: torch.Tensor, path_tokens: list[int]) -> torch.Tensor:
    seq = torch.cat([prefix, torch.tensor(path_tokens, dtype=torch.long)])
    return model(seq[None]).logits[0, -1].float()


def random_tree(n: int, vocab: int, seed: int) -> DraftTree:
    g = torch.Generator().manual_seed(seed)
    parents = [-1] + [int(torch.randint(-1, i, (1,), generator=g)) for i in range(1, n)]
    tokens = torch.randint(3, vocab, (n,), generator=g)
    return DraftTree(tokens, torch.tensor(parents), torch.ones(n))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_verification_logits_equal_path_logits(family, attn):
    model = tiny_model(family, attn=attn)
    prefix = torch.randint(3, 90, (9,))
    tree = random_tree(12, 90, seed=1)
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        model(prefix[None, :-1], **with_cache(model, cache), use_cache=True)
        inputs = verification_inputs(int(prefix[-1]), tree, len(prefix) - 1, model.dtype)
        logits = model(**inputs.as_kwargs(), **with_cache(model, cache), use_cache=True, logits_to_keep=0).logits[0]
        assert torch.allclose(logits[0], path_logits(model, prefix, []), atol=1e-4)
        for i in range(len(tree)):
            expected = path_logits(model, prefix, tree.tokens[tree.path_to(i)].tolist())
            assert torch.allclose(logits[i + 1], expected, atol=1e-4), f"node {i}"


@pytest.mark.parametrize("family", ["llama", "gpt2", "opt", "gemma"])
def test_draft_layer_forwards_see_only_their_own_path(family):
    """If a draft layer's mask let a node see stale non-parent nodes of earlier layers (as the
    official code does), these logits would differ from the plain path's."""
    model = peaked(tiny_model(family), scale=30.0)
    prefix = torch.randint(3, 90, (6,))
    seen = []

    with torch.inference_mode():
        drafter = ModelDrafter(model)

        def expand(pool, frontier):
            probs = drafter.expand(pool, frontier)
            seen.append((pool, frontier.tolist(), probs))
            return probs

        build_opt_tree(drafter.root_probs(prefix), expand, TreeConfig(nodes=6, threshold=0.0, max_depth=4))
        assert len(seen) >= 2 and any(len(f) > 1 for _, f, _ in seen[1:])
        for pool, frontier, probs in seen:
            for row, i in enumerate(frontier):
                expected = torch.softmax(path_logits(model, prefix, pool.tokens[pool.path_to(i)].tolist()), -1)
                assert torch.allclose(probs[row], expected, atol=1e-5)


@pytest.mark.parametrize("family", ["llama", "gpt2", "qwen2", "gemma"])
def test_dummy_rows_change_no_real_row_and_leave_no_slot(family):
    """A verification forward padded to a fixed size (tree.sizes) gives every real row the logits of
    its path, and once the step keeps its accepted slots the cache equals the unpadded forward's.
    Negative control: a real row that sees a dummy row gets other logits."""
    from opttree.hf import kv_cache
    from opttree.tree.masks import tree_forward_inputs, tree_visibility

    model = tiny_model(family)
    prefix = torch.randint(3, 90, (9,))
    tree = random_tree(12, 90, seed=2)  # 13 rows, padded to 16
    kept = [1, 4]  # two nodes' slots, kept as an accepted path would be
    outs = {}
    with torch.inference_mode():
        for size in (None, 16):
            cache = DynamicCache(config=model.config)
            model(prefix[None, :-1], **with_cache(model, cache), use_cache=True)
            inputs = verification_inputs(int(prefix[-1]), tree, len(prefix) - 1, model.dtype, size=size)
            assert inputs.input_ids.shape[1] == (size or 13) and inputs.attention_mask.shape[-1] == 8 + (size or 13)
            logits = model(**inputs.as_kwargs(), **with_cache(model, cache), use_cache=True, logits_to_keep=0).logits[0]
            kv_cache.keep_slots(cache, 9, [9 + i for i in kept])
            outs[size] = (logits[:13], [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers])
        for i in range(len(tree)):
            expected = path_logits(model, prefix, tree.tokens[tree.path_to(i)].tolist())
            assert torch.allclose(outs[16][0][i + 1], expected, atol=1e-4), f"node {i}"
        assert torch.allclose(outs[16][0], outs[None][0], atol=1e-5)
        for (k16, v16), (k, v) in zip(outs[16][1], outs[None][1]):
            assert k16.shape == k.shape and torch.allclose(k16, k, atol=1e-5) and torch.allclose(v16, v, atol=1e-5)
        # negative control: node 0 (row 1) also sees the first dummy row (row 13)
        cache = DynamicCache(config=model.config)
        model(prefix[None, :-1], **with_cache(model, cache), use_cache=True)
        visible = tree_visibility(tree, 3)
        visible[1, 13] = True
        root = prefix[-1:]
        tokens = torch.cat([root, tree.tokens, root.expand(3)])
        positions = torch.nn.functional.pad(tree.depths(), (1, 3)) + 8
        leaky = tree_forward_inputs(tokens, positions, visible, 8, model.dtype)
        logits = model(**leaky.as_kwargs(), **with_cache(model, cache), use_cache=True, logits_to_keep=0).logits[0]
        assert not torch.allclose(logits[1], outs[None][0][1], atol=1e-4)


def test_a_static_cache_mask_spans_its_length_and_hides_the_rest():
    """kv_len: the mask covers a static cache's every slot; those after the new tokens are hidden."""
    tree = random_tree(5, 90, seed=3)
    inputs = verification_inputs(7, tree, 10, torch.float32, size=8, kv_len=40)
    mask = inputs.attention_mask[0, 0]  # [8, 40]
    assert mask.shape == (8, 40)
    assert bool((mask[:, :10] == 0).all()) and bool((mask[:, 18:] < -1e30).all())
    assert torch.equal(inputs.cache_position, torch.arange(10, 18))
