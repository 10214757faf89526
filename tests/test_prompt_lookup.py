"""Model-free drafting: the n-gram prompt-lookup drafter and its mixture with a model drafter.

Their q is a heuristic, the output is not: every drafter passes the same greedy-equality test."""

import pytest
import torch

from models import FAMILIES, VOCAB, peaked, tiny_model
from opttree import SpeculativeGenerator, TreeConfig, build_opt_tree, speculative, speculative_generate
from opttree.drafters import Drafter, MixedDrafter, ModelDrafter, PromptLookupDrafter, make_drafter
from opttree.tree import DraftTree



def repetitive_prompt(seed=0, period=5, length=23):
    """A prompt that repeats a random motif, so its n-grams recur."""
    motif = torch.randint(3, 90, (period,), generator=torch.Generator().manual_seed(seed))
    return motif.repeat(length // period + 1)[:length][None, :]


def spec(target, draft, ids, **kw):
    return target.generate(ids, do_sample=False, custom_generate=speculative_generate, draft_model=draft,
                           return_dict_in_generate=True, **kw)


def chain(tokens: list[int]) -> DraftTree:
    """A one-path tree holding ``tokens``."""
    return DraftTree(torch.tensor(tokens), torch.arange(-1, len(tokens) - 1), torch.ones(len(tokens)))


# -- the lookup itself ---------------------------------------------------------------------------

def test_root_probs_are_continuation_frequencies_of_the_longest_matching_suffix():
    drafter = PromptLookupDrafter(max_ngram=2, vocab_size=10)
    #                     0  1  2  3  4  5  6  7
    q = drafter.root_probs(torch.tensor([1, 2, 3, 1, 2, 4, 1, 2]))
    expected = torch.zeros(10)
    expected[3] = expected[4] = 0.5  # "1 2" was followed once by 3, once by 4
    assert torch.equal(q, expected)

    drafter = PromptLookupDrafter(max_ngram=3, vocab_size=10)
    q = drafter.root_probs(torch.tensor([5, 1, 2, 3, 7, 1, 2, 4, 5, 1, 2]))
    assert q[3] == 1.0 and q.sum() == 1.0  # "5 1 2" (n=3) -> 3 beats "1 2" (n=2) -> {3, 4}


def test_backs_off_to_shorter_ngrams_and_gives_zeros_without_any_match():
    drafter = PromptLookupDrafter(max_ngram=3, vocab_size=10)
    q = drafter.root_probs(torch.tensor([6, 2, 9, 8, 2]))  # only the unigram "2" recurs
    assert q[9] == 1.0 and q.sum() == 1.0
    drafter = PromptLookupDrafter(max_ngram=3, min_ngram=2, vocab_size=10)
    assert drafter.root_probs(torch.tensor([6, 2, 9, 8, 2])).sum() == 0  # no bigram recurs
    assert PromptLookupDrafter(vocab_size=10).root_probs(torch.tensor([1, 2, 3, 4])).sum() == 0


def test_expand_looks_up_the_text_followed_by_each_nodes_path():
    drafter = PromptLookupDrafter(max_ngram=2, vocab_size=10)
    drafter.root_probs(torch.tensor([4, 5, 6, 7, 1]))
    # path 5 6: "5 6" -> 7 in the committed text.  path 2 3 8 2 3: "2 3" -> 8, only on the path itself
    pool = DraftTree(torch.tensor([5, 2, 6, 3, 8, 2, 3]), torch.tensor([-1, -1, 0, 1, 3, 4, 5]), torch.ones(7))
    q = drafter.expand(pool, torch.tensor([2, 6]))
    assert q.shape == (2, 10)
    assert q[0, 7] == 1.0 and q[0].sum() == 1.0
    assert q[1, 8] == 1.0 and q[1].sum() == 1.0


def test_incremental_index_equals_a_fresh_one():
    text = torch.randint(0, 6, (60,), generator=torch.Generator().manual_seed(0))
    grown = PromptLookupDrafter(max_ngram=3, vocab_size=6)
    for end in (5, 6, 17, 18, 40, 60):
        grown.root_probs(text[:end])
        grown.commit([])
    fresh = PromptLookupDrafter(max_ngram=3, vocab_size=6)
    fresh.root_probs(text)
    assert grown.counts == fresh.counts
    pool = chain([1, 2, 3, 4])
    assert torch.equal(grown.expand(pool, torch.arange(4)), fresh.expand(pool, torch.arange(4)))


def test_the_tree_branches_where_the_text_continued_several_ways():
    drafter = PromptLookupDrafter(max_ngram=2, vocab_size=20)
    text = torch.tensor([1, 2, 3, 4, 1, 2, 5, 6, 1, 2, 3, 4, 9, 1, 2])  # "1 2" -> 3 (twice), 5 (once)
    built = build_opt_tree(drafter.root_probs(text), drafter.expand, TreeConfig(nodes=6, threshold=0.0, max_depth=4))
    roots = [i for i in range(len(built.tree)) if built.tree.parents[i] < 0]
    assert sorted(built.tree.tokens[roots].tolist()) == [3, 5]
    assert torch.allclose(built.tree.path_probs[roots].sort().values, torch.tensor([1 / 3, 2 / 3]))
    assert built.tree.depths().max() >= 3  # then the text's continuations, deeper
    assert drafter.forwards == 0


def test_vocab_size_comes_from_the_target_and_instances_are_not_shared_between_calls():
    target = tiny_model("llama")
    bound = make_drafter("prompt_lookup", target)
    assert isinstance(bound, PromptLookupDrafter) and bound.vocab_size == VOCAB
    mine = PromptLookupDrafter(max_ngram=2)
    a, b = make_drafter(mine, target), make_drafter(mine, target)
    assert a is not mine and a is not b and a.max_ngram == 2 and a.vocab_size == VOCAB
    with pytest.raises(ValueError, match="vocab_size"):
        mine.root_probs(torch.tensor([1, 2, 1]))  # unbound: no vocabulary size
    with pytest.raises(ValueError, match="min_ngram"):
        PromptLookupDrafter(max_ngram=0)


# -- the mixture -----------------------------------------------------------------------------------

class Fixed(Drafter):
    """A drafter with fixed q, to test the mixture arithmetic."""

    def __init__(self, q):
        self.q = q  # [vocab]

    def root_probs(self, sequence):
        return self.q

    def expand(self, pool, frontier):
        return self.q.expand(len(frontier), -1)

    def commit(self, accepted_pool_ids):
        pass


def test_mixture_weights_and_fallback_to_the_model_where_nothing_matched():
    model_q = torch.tensor([0.1, 0.2, 0.3, 0.4])
    ngram_q = torch.tensor([0.0, 0.0, 1.0, 0.0])
    mixed = MixedDrafter(Fixed(model_q), Fixed(ngram_q), weight=0.25)
    assert torch.allclose(mixed.root_probs(torch.tensor([1])), 0.75 * model_q + 0.25 * ngram_q)
    assert torch.allclose(mixed.root_probs(torch.tensor([1])).sum(), torch.tensor(1.0))
    no_match = MixedDrafter(Fixed(model_q), Fixed(torch.zeros(4)), weight=0.25)
    assert torch.equal(no_match.root_probs(torch.tensor([1])), model_q)
    for bad in (-0.1, 1.5, True, "x"):
        with pytest.raises(ValueError, match="weight"):
            MixedDrafter(Fixed(model_q), Fixed(ngram_q), weight=bad)


def test_mixed_drafter_binds_its_parts_to_the_target():
    target, draft = tiny_model("qwen2"), tiny_model("qwen2", seed=1)
    mixed = make_drafter(MixedDrafter(draft, "prompt_lookup", 0.5), target)
    assert isinstance(mixed.model_drafter, ModelDrafter) and isinstance(mixed.ngram_drafter, PromptLookupDrafter)
    assert mixed.ngram_drafter.vocab_size == VOCAB and mixed.context_length == 256
    bigger = tiny_model("qwen2")
    bigger.resize_token_embeddings(VOCAB + 8)
    with pytest.raises(ValueError, match="vocabularies differ"):
        make_drafter(MixedDrafter(bigger, "prompt_lookup"), target)


# -- lossless inside generate() --------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", ["prompt_lookup", "mixed"])
def test_equal_to_greedy_generate_for_every_family(family, kind):
    target = peaked(tiny_model(family, seed=0), scale=30.0)
    draft = ("prompt_lookup" if kind == "prompt_lookup"
             else MixedDrafter(tiny_model(family, seed=1), PromptLookupDrafter(max_ngram=3), weight=0.7))
    ids = repetitive_prompt(FAMILIES.index(family))
    ref = target.generate(ids, max_new_tokens=24, do_sample=False)
    out = spec(target, draft, ids, max_new_tokens=24, nodes=8, threshold=0.1, max_depth=6)
    assert torch.equal(out.sequences, ref)
    assert out.stats.new_tokens == 24
    assert sum(step.tree_size for step in out.stats.steps) > 0  # the lookups did hit


def test_prompt_lookup_accepts_long_runs_on_text_that_repeats():
    """A target that copies its input (the peaked model cycles) is predicted by its own text."""
    target = peaked(tiny_model("llama", seed=0), scale=30.0)
    ids = repetitive_prompt(0)
    ref = target.generate(ids, max_new_tokens=60, do_sample=False)
    out = spec(target, "prompt_lookup", ids, max_new_tokens=60, nodes=10, threshold=0.1, max_depth=8)
    assert torch.equal(out.sequences, ref)
    assert out.stats.mean_accepted_tokens > 2.0
    assert all(step.draft_forwards == 0 for step in out.stats.steps)


@pytest.mark.parametrize("max_new_tokens", [1, 2, 5, 13])
def test_deep_lookup_chains_stop_at_max_new_tokens_exactly(max_new_tokens):
    target = peaked(tiny_model("phi3", seed=0), scale=30.0)
    ids = repetitive_prompt(2)
    ref = target.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
    out = spec(target, "prompt_lookup", ids, max_new_tokens=max_new_tokens, nodes=12, threshold=0.0, max_depth=10)
    assert torch.equal(out.sequences, ref)
    assert out.sequences.shape[1] == ids.shape[1] + max_new_tokens


def test_same_instance_reused_across_calls_and_entry_points():
    target = peaked(tiny_model("llama", seed=0), scale=30.0)
    mine = PromptLookupDrafter(max_ngram=3)
    gen = SpeculativeGenerator(target, mine, nodes=8, threshold=0.1)
    model = speculative(target)
    for seed in range(3):
        ids = repetitive_prompt(seed)
        ref = target.generate(ids, max_new_tokens=20, do_sample=False)
        assert torch.equal(gen.generate(ids, max_new_tokens=20, do_sample=False), ref)
        assert torch.equal(model.generate(ids, max_new_tokens=20, do_sample=False, draft_model=mine,
                                          nodes=8, threshold=0.1), ref)
    assert mine.text == []  # the instance itself never held a call's state


def test_mixed_with_an_agreeing_model_is_lossless_and_accepts_deeply():
    target = peaked(tiny_model("qwen3", seed=0), scale=30.0)
    ids = repetitive_prompt(4)
    ref = target.generate(ids, max_new_tokens=30, do_sample=False)
    out = spec(target, MixedDrafter(target, "prompt_lookup", 0.5), ids, max_new_tokens=30, nodes=10, threshold=0.0)
    assert torch.equal(out.sequences, ref)
    assert out.stats.mean_accepted_tokens > 2.0
