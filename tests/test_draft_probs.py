"""DraftProbs: trees grown from a drafter's candidate columns equal the trees grown from its q
spread over the whole vocabulary (the feature head's kept tokens, prompt lookup's continuations,
their mixture), and decoding with them is lossless."""

import pytest
import torch

from models import tiny_model
from opttree import SpeculativeGenerator
from opttree.distill.train.head import new_head
from opttree.drafters import MixedDrafter, PromptLookupDrafter
from opttree.drafters.head.feature_head import FeatureHeadDrafter
from opttree.tree.builder import children_of, grow_opt_tree, top_children
from opttree.tree.config import TreeConfig
from opttree.tree.draft_probs import DraftProbs, kept_columns, mix

VOCAB = 40


def random_q(k, columns, g, zeros=0):
    q = torch.softmax(torch.randn(k, columns, generator=g) * 3, dim=-1)
    if zeros:
        q[:, -zeros:] = 0
    return q


def test_full_spreads_each_form_over_the_vocabulary():
    g = torch.Generator().manual_seed(0)
    values = random_q(3, 5, g)
    dense = DraftProbs.dense(random_q(3, VOCAB, g))
    assert dense.full() is dense.values
    ids = torch.tensor([2, 7, 11, 30, 39])
    expected = torch.zeros(3, VOCAB)
    expected[:, ids] = values
    assert torch.equal(DraftProbs(values, ids, VOCAB).full(), expected)
    # per-row columns, a short row padded with token 0 at q = 0 (token 0 is also a real column of row 1)
    per_row = torch.tensor([[4, 9, 0, 0, 0], [0, 1, 2, 3, 5], [39, 38, 37, 36, 35]])
    values = values.clone()
    values[0, 2:] = 0
    expected = torch.zeros(3, VOCAB)
    for i in range(3):
        for j in range(5):
            expected[i, per_row[i, j]] += values[i, j]
    assert torch.equal(DraftProbs(values, per_row, VOCAB).full(), expected)


@pytest.mark.parametrize("k,vocab,kept", [(3, 40, 17), (40, 30000, 12000)])  # the flat path and the per-row one
def test_children_of_kept_columns_are_the_children_of_the_full_q(k, vocab, kept):
    g = torch.Generator().manual_seed(k)
    parents = torch.rand(k, generator=g)
    ids = torch.randperm(vocab, generator=g)[:kept].sort().values
    probs = DraftProbs(random_q(k, kept, g, zeros=3), ids, vocab)
    for budget in (1, 8, 60):
        rows, tokens, p = children_of(parents, probs, budget)
        want_rows, want_tokens, want_p = top_children(parents, probs.full(), budget)
        positive = int((want_p > 0).sum())
        assert torch.equal(rows[:positive], want_rows[:positive]) and torch.equal(tokens[:positive], want_tokens[:positive])
        assert torch.equal(p[:positive], want_p[:positive])


def dense_mix(model_q, ngram_q, weight):  # the mixture as MixedDrafter computed it over [k, vocab]
    matched = (ngram_q.sum(dim=-1, keepdim=True) > 0).to(model_q.dtype)
    w = weight * matched
    return w * ngram_q + (1 - w) * model_q


def ngram_rows(g, k):
    """Per-row n-gram columns: some rows empty, some hitting kept tokens, some not; padded with 0."""
    ids = torch.zeros(k, 3, dtype=torch.long)
    values = torch.zeros(k, 3)
    for i in range(k):
        n = i % 4  # 0..3 continuations
        if n:
            ids[i, :n] = torch.randperm(VOCAB, generator=g)[:n]
            values[i, :n] = torch.softmax(torch.rand(n, generator=g), dim=0)
    return DraftProbs(values, ids, VOCAB)


@pytest.mark.parametrize("shared", [True, False])
def test_the_sparse_mixture_is_the_dense_one(shared):
    g = torch.Generator().manual_seed(3)
    k = 9
    ngram = ngram_rows(g, k)
    if shared:
        ids = torch.arange(0, VOCAB, 2)  # the even tokens: n-gram tokens land inside and outside
        model = DraftProbs(random_q(k, len(ids), g), ids, VOCAB)
    else:
        model = DraftProbs.dense(random_q(k, VOCAB, g))
    mixed = mix(model, ngram, 0.5, kept_columns(model.token_ids, VOCAB))
    assert torch.equal(mixed.full(), dense_mix(model.full(), ngram.full(), 0.5))
    other = DraftProbs(random_q(k, 7, g), torch.tensor([1, 2, 3, 10, 20, 30, 39]), VOCAB)  # a second drafter's shared columns
    assert torch.equal(mix(model, other, 0.3, kept_columns(model.token_ids, VOCAB)).full(),
                       dense_mix(model.full(), other.full(), 0.3))
    dense_ngram = DraftProbs.dense(ngram.full())  # a second drafter with a dense q: the mixture is dense
    assert torch.equal(mix(model, dense_ngram, 0.5, kept_columns(model.token_ids, VOCAB)).values,
                       dense_mix(model.full(), ngram.full(), 0.5))
    per_row = mix(model, ngram, 0.5, kept_columns(model.token_ids, VOCAB))  # columns per row, mixed again
    assert torch.equal(mix(per_row, other, 0.3).full(), dense_mix(per_row.full(), other.full(), 0.3))


def tree_from(answer_of_layer, root):
    """The OPT-Tree grown when each layer's request is answered by answer_of_layer(k) (a DraftProbs)."""
    growth = grow_opt_tree(root, TreeConfig(nodes=30, threshold=0.0, max_depth=4))
    answer = None
    try:
        while True:
            _, frontier = growth.send(answer)
            answer = answer_of_layer(len(frontier))
    except StopIteration as done:
        return done.value.tree


def test_a_tree_grown_from_the_sparse_mixture_equals_one_grown_from_its_full_q():
    """And the check can fail: a mixture that appended the n-gram columns without merging the
    tokens the model also has (the same q once spread over the vocabulary) splits a token's
    mass over two siblings, and grows another tree."""
    g = torch.Generator().manual_seed(5)
    ids = torch.arange(0, VOCAB, 2)
    layers = {}

    def layer(k):  # the same q for the same layer width, whichever form it is asked in
        if k not in layers:
            ngram = ngram_rows(g, k)
            ngram.values[:, 0] = torch.where(ngram.values[:, 0] > 0, 0.9, 0.0)  # strong n-gram hits
            ngram.token_ids[:, 0] = 2 * (torch.arange(k) % 5)  # ... on kept tokens
            layers[k] = DraftProbs(random_q(k, len(ids), g), ids, VOCAB), ngram
        return layers[k]

    def merged(k):
        model, ngram = layer(k)
        return mix(model, ngram, 0.5, kept_columns(ids, VOCAB))

    def appended(k):  # the mistake: duplicate columns for tokens both drafters propose
        model, ngram = layer(k)
        w = 0.5 * (ngram.values.sum(dim=1, keepdim=True) > 0).float()
        return DraftProbs(torch.cat([(1 - w) * model.values, w * ngram.values], dim=1),
                          torch.cat([ids.expand(k, -1), ngram.token_ids], dim=1), VOCAB)

    root = torch.softmax(torch.randn(VOCAB, generator=g), dim=0)
    reference = tree_from(lambda k: DraftProbs.dense(merged(k).full()), root)
    sparse = tree_from(merged, root)
    assert torch.equal(sparse.tokens, reference.tokens) and torch.equal(sparse.parents, reference.parents)
    assert torch.equal(sparse.path_probs, reference.path_probs)
    wrong = tree_from(appended, root)
    assert torch.equal(appended(3).full(), merged(3).full())  # the same q once spread...
    assert not (torch.equal(wrong.tokens, reference.tokens) and torch.equal(wrong.parents, reference.parents))  # ...another tree


def test_prompt_lookup_columns_are_its_frequencies():
    drafter = PromptLookupDrafter(max_ngram=2, vocab_size=VOCAB)
    drafter.root_probs(torch.tensor([1, 2, 3, 1, 2, 4, 1, 2, 3, 1, 2]))
    probs = drafter._probs([[], [5], [3]])  # after "1 2": 3 twice, 4 once; after 5: nothing; after 3: 1
    full = probs.full()
    assert full[0, 3] == pytest.approx(2 / 3) and full[0, 4] == pytest.approx(1 / 3) and full[0].sum() == pytest.approx(1)
    assert full[1].sum() == 0 and full[2, 1] == 1 and full[2].sum() == 1
    assert probs.token_ids.shape == (3, 2)  # two columns: the most continuations any row has


def dense_everywhere(monkeypatch):
    """Every drafter answers over the whole vocabulary: the behaviour before DraftProbs."""
    for cls in (FeatureHeadDrafter, MixedDrafter, PromptLookupDrafter):
        sparse = cls.expand_probs
        monkeypatch.setattr(cls, "expand_probs", lambda self, pool, frontier, f=sparse: DraftProbs.dense(f(self, pool, frontier).full()))


@pytest.mark.parametrize("mixed", [False, True])
def test_decoding_from_kept_columns_grows_the_same_trees_and_stays_lossless(monkeypatch, mixed):
    torch.manual_seed(0)
    target = tiny_model("llama", seed=3)
    head, _ = new_head(target, token_ids=torch.arange(1, target.config.vocab_size, 3))  # a third of the vocabulary
    draft = MixedDrafter(head) if mixed else head
    prompt = torch.tensor([[5, 17, 33, 2, 41, 8, 19, 60, 5, 17, 33, 2, 41]])  # repeated n-grams for the lookup
    plain = target.generate(prompt, max_new_tokens=40, do_sample=False)

    def run():
        gen = SpeculativeGenerator(target, draft, nodes=20, threshold=0.1, max_depth=6)
        out = gen.generate(prompt, max_new_tokens=40)
        return out, [(s.tree_size, s.accepted) for s in gen.last_stats.steps]

    out, steps = run()
    assert torch.equal(out, plain)
    with monkeypatch.context() as m:
        dense_everywhere(m)
        dense_out, dense_steps = run()
    assert torch.equal(dense_out, plain) and steps == dense_steps
    assert sum(size for size, _ in steps) > 2 * len(steps)  # real trees were grown
