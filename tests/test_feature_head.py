"""The EAGLE-style feature head: lossless in generate(), tree-consistent, fed the target's own
features at the right positions, saved and loaded from the target it was made for."""

import pytest
import torch

from models import peaked, tiny_model
from opttree import speculative_generate
from opttree import load_draft
from opttree.distill.train.head import new_head
from opttree.loading.head_file import save_head
from opttree.drafters.head.feature_head import FeatureHeadDrafter
from opttree.tree import DraftTree


def prompt(seed=0, length=9):
    return torch.randint(3, 90, (1, length), generator=torch.Generator().manual_seed(seed))


def spec(target, draft, ids, **kw):
    return target.generate(ids, do_sample=False, custom_generate=speculative_generate, draft_model=draft,
                           return_dict_in_generate=True, **kw)


def randomised(head, seed=0):
    """Random weights everywhere (new_head starts fc as 'take the feature')."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in head.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 if p.dim() > 1 else 0.1) + (1.0 if "norm" in name else 0.0))
    return head


def oracle_head(target):
    """For a ONE-layer Llama target: a head that computes exactly the target's features from the
    tokens alone (fc keeps the embedding, the layer and norm are the target's): every draft is
    right, which only works if the head's positions, rotary, cache and tree masks are right."""
    head, _ = new_head(target, init_layer=0)
    h = head.c.hidden_size
    with torch.no_grad():
        head.fc.weight.zero_()
        head.fc.weight[:, :h].copy_(torch.eye(h))
    return head


class OffByOne(FeatureHeadDrafter):
    """A head drafter whose tree nodes sit one position too early."""

    def expand(self, pool, frontier):
        self.root_position -= 1
        try:
            return super().expand(pool, frontier)
        finally:
            self.root_position += 1


def drafter_after(head, target, ids):
    """A drafter that has seen ``ids`` [1, T] (prefill features) and drafted the root's children."""
    drafter = head if isinstance(head, FeatureHeadDrafter) else head.for_target(target)  # a head or a drafter
    with torch.no_grad():
        feats = target(ids[:, :-1], output_hidden_states=True).hidden_states[-1][0]
    drafter.add_features(feats)
    root = drafter.root_probs(ids[0])
    return drafter, root


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma", "phi", "gpt2", "opt"])
def test_greedy_equal_to_generate_with_a_head(family):
    target = peaked(tiny_model(family, seed=0), scale=30.0)
    head = randomised(new_head(target)[0])
    for seed in range(2):
        ids = prompt(seed)
        ref = target.generate(ids, max_new_tokens=20, do_sample=False)
        out = spec(target, head, ids, max_new_tokens=20, nodes=8, threshold=0.0, max_depth=4)
        assert torch.equal(out.sequences, ref), (family, seed)


def sharp_one_layer_target():
    target = peaked(tiny_model("llama", seed=0, layers=1), scale=30.0)
    with torch.no_grad():  # sharper attention: the output depends more on the rotary positions
        for proj in (target.model.layers[0].self_attn.q_proj, target.model.layers[0].self_attn.k_proj):
            proj.weight.mul_(6.0)
    return target


def test_oracle_head_is_accepted_deep_into_the_tree():
    target = sharp_one_layer_target()
    ids = prompt(1)
    ref = target.generate(ids, max_new_tokens=40, do_sample=False)
    out = spec(target, oracle_head(target), ids, max_new_tokens=40, nodes=5, strategy="chain")
    assert torch.equal(out.sequences, ref)
    # the head's chain IS the target's greedy path: 5 drafts + the bonus token, every step
    assert out.stats.accept_lengths[:-1] == [6] * (len(out.stats.accept_lengths) - 1)


@pytest.mark.parametrize("broken", [False, True])
def test_oracle_tree_probs_are_the_targets_probs(broken):
    """Each tree node's draft distribution equals the target's at that node: positions, rotary,
    cache and tree mask all right. Negative control: tree nodes one position too early."""
    target = sharp_one_layer_target()
    head = oracle_head(target)
    ids = prompt(1)
    pool = DraftTree(torch.tensor([5, 6, 7, 8]), torch.tensor([-1, -1, 0, 2]), torch.ones(4))
    drafter, _ = drafter_after(OffByOne(head) if broken else head, target, ids)
    for frontier in ([0, 1], [2], [3]):
        probs = drafter.expand(pool, torch.tensor(frontier))
        for node, p in zip(frontier, probs):
            path = [node]
            while int(pool.parents[path[0]]) >= 0:
                path.insert(0, int(pool.parents[path[0]]))
            with torch.no_grad():
                logits = target(torch.cat([ids, pool.tokens[path][None]], 1)).logits[0, -1]
            close = torch.allclose(p, logits.softmax(-1), atol=1e-5)
            assert close != broken, (node, (p - logits.softmax(-1)).abs().max())


def test_tree_probs_equal_each_paths_chain_probs():
    target = tiny_model("llama", seed=0)
    head = randomised(new_head(target)[0], seed=2)
    ids = prompt(2)
    drafter, root = drafter_after(head, target, ids)
    # pool: root -> a, b, c; a -> d, e; b -> f; d -> g
    pool = DraftTree(torch.tensor([5, 6, 7, 8, 9, 10, 11]), torch.tensor([-1, -1, -1, 0, 0, 1, 3]), torch.ones(7))
    tree_probs = {}
    for frontier in ([0, 1, 2], [3, 4, 5], [6]):
        probs = drafter.expand(pool, torch.tensor(frontier))
        tree_probs.update({i: p for i, p in zip(frontier, probs)})
    for node in range(7):
        path = [node]
        while int(pool.parents[path[0]]) >= 0:
            path.insert(0, int(pool.parents[path[0]]))
        chain = DraftTree(pool.tokens[path], torch.arange(len(path)) - 1, torch.ones(len(path)))
        lone, _ = drafter_after(head, target, ids)
        for depth in range(len(path)):
            probs = lone.expand(chain, torch.tensor([depth]))[0]
        torch.testing.assert_close(tree_probs[node], probs, rtol=1e-4, atol=1e-6)


def test_head_reads_the_targets_feature_of_the_previous_position(monkeypatch):
    target = peaked(tiny_model("qwen2", seed=0), scale=30.0)
    head = oracle_head(peaked(tiny_model("llama", seed=3, layers=1), scale=30.0))  # any head of the right shape
    head.embed = [target.get_input_embeddings()]
    fed = {}  # position -> feature the cache entry was computed from
    forward, root_probs, rooting = head.forward, FeatureHeadDrafter.root_probs, []

    def flagged(self, sequence):  # the committed entries are fed in root_probs; tree entries in expand
        rooting.append(True)
        try:
            return root_probs(self, sequence)
        finally:
            rooting.pop()

    def recording(features, tokens, positions, past, mask, slots=None):
        if rooting:
            for p, f in zip(positions[0].tolist(), features[0]):
                fed[p] = f.clone()
        return forward(features, tokens, positions, past, mask, slots)

    monkeypatch.setattr(FeatureHeadDrafter, "root_probs", flagged)

    head.forward = recording
    ids = prompt(4)
    out = spec(target, head, ids, max_new_tokens=30, nodes=6, threshold=0.0, max_depth=4)
    with torch.no_grad():
        true = target(out.sequences, output_hidden_states=True).hidden_states[-1][0]  # [T, H]
    # every position up to the last step's root (the last step's tokens are never drafted from)
    assert sorted(fed) == list(range(len(fed))) and len(fed) > ids.shape[1] + 10
    torch.testing.assert_close(fed[0], torch.zeros_like(fed[0]))
    for position in range(1, len(fed)):
        torch.testing.assert_close(fed[position], true[position - 1], rtol=1e-4, atol=1e-4)


def test_saved_head_loads_through_load_draft(tmp_path):
    target = peaked(tiny_model("llama", seed=0), scale=30.0)
    head, meta = new_head(target, token_ids=torch.arange(40, 96))
    head = randomised(head)
    save_head(head, meta, tmp_path / "head", dtype=torch.float32)
    loaded = load_draft(tmp_path / "head", target)
    ids = prompt(5)
    a = spec(target, head, ids, max_new_tokens=12, nodes=5)
    b = spec(target, loaded, ids, max_new_tokens=12, nodes=5)
    assert torch.equal(a.sequences, b.sequences)
    assert a.stats.accept_lengths == b.stats.accept_lengths
    assert isinstance(loaded.for_target(target), FeatureHeadDrafter)
    half = load_draft(tmp_path / "head", target, dtype=torch.bfloat16)  # a faster draft, same output
    assert half.fc.weight.dtype == half.out_weight.dtype == torch.bfloat16
    assert torch.equal(spec(target, half, ids, max_new_tokens=12, nodes=5).sequences, a.sequences)


def test_head_for_another_target_is_refused_with_the_fix(tmp_path):
    target = tiny_model("llama", seed=0)
    head, meta = new_head(target)
    save_head(head, meta, tmp_path / "head")
    other = tiny_model("llama", seed=0, hidden=48)
    with pytest.raises(ValueError, match="opttree distill --kind head"):
        load_draft(tmp_path / "head", other)
    with pytest.raises(ValueError, match="hidden size"):
        spec(other, head, prompt(0), max_new_tokens=4)


def test_head_mixed_with_prompt_lookup_stays_lossless():
    from opttree.drafters import MixedDrafter

    target = peaked(tiny_model("llama", seed=0), scale=30.0)
    head = randomised(new_head(target)[0])
    ids = torch.tensor([[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6]])  # repeats: the n-gram drafter matches
    ref = target.generate(ids, max_new_tokens=20, do_sample=False)
    out = spec(target, MixedDrafter(head), ids, max_new_tokens=20, nodes=8)
    assert torch.equal(out.sequences, ref)


def test_sampling_with_a_head_is_reproducible():
    target = peaked(tiny_model("llama", seed=0), scale=3.0)
    head = randomised(new_head(target)[0])
    ids = prompt(6)

    def run(seed):
        return target.generate(ids, do_sample=True, temperature=0.8, top_k=20, max_new_tokens=16,
                               custom_generate=speculative_generate, draft_model=head, nodes=6,
                               generator=torch.Generator().manual_seed(seed))

    assert torch.equal(run(1), run(1))


def test_head_in_bf16_under_an_fp32_target_stays_lossless():
    target = peaked(tiny_model("qwen2", seed=0), scale=30.0)
    head = randomised(new_head(target)[0]).to(torch.bfloat16)
    ids = prompt(7)
    ref = target.generate(ids, max_new_tokens=16, do_sample=False)
    assert torch.equal(spec(target, head, ids, max_new_tokens=16, nodes=6).sequences, ref)


def test_head_through_every_entry_point():
    from opttree import SpeculativeGenerator, speculative

    target = peaked(tiny_model("llama", seed=0), scale=30.0)
    head = randomised(new_head(target)[0])
    ids = prompt(8)
    ref = target.generate(ids, max_new_tokens=12, do_sample=False)
    assert torch.equal(SpeculativeGenerator(target, head, nodes=5).generate(ids, max_new_tokens=12, do_sample=False), ref)
    model = speculative(target)
    assert torch.equal(model.generate(ids, draft_model=head, nodes=5, max_new_tokens=12, do_sample=False), ref)


def test_a_fused_head_drafts_from_the_fused_features_in_the_loop(monkeypatch):
    """The loop hands a fused head its fused target layers (drafter.features_from), and stays lossless."""
    from models import peaked, tiny_model
    from opttree import speculative_generate
    from opttree.distill.train.head import new_head
    from opttree.drafters.head.feature_head import FeatureHeadDrafter

    target = peaked(tiny_model("llama", seed=0), scale=30.0)
    head, _ = new_head(target, feature_layers=(1, -1))
    with torch.no_grad():
        head.fuse_proj.weight.normal_(0, 0.5)  # the lower layer now matters
    seen = []
    original = FeatureHeadDrafter.features_from

    def spy(self, hidden_states):
        out = original(self, hidden_states)
        seen.append((out, hidden_states[-1][0]))
        return out

    monkeypatch.setattr(FeatureHeadDrafter, "features_from", spy)
    ids = torch.tensor([[3, 14, 15, 92, 65, 35]])
    ref = target.generate(ids, max_new_tokens=20, do_sample=False)
    out = target.generate(ids, max_new_tokens=20, do_sample=False, custom_generate=speculative_generate,
                          draft_model=head, nodes=8, max_depth=4)
    assert torch.equal(out, ref)
    assert seen and all(f.shape == last.shape for f, last in seen)
    assert not torch.allclose(seen[0][0], seen[0][1])  # fused, not the last hidden state alone
