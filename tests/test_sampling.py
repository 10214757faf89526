"""Sampling is lossless for every verifier: the first tokens' distribution is the target's own.

Two levels. (1) The verifiers alone, on a synthetic world: target and draft logits are fixed
random functions of the context over a 5-token vocabulary, trees come from the real builders
("sampled", i.i.d. or without replacement, and OPT-Tree's deterministic top-k), and the first
K tokens of speculative sampling (completed from the target where a step emitted fewer) must
pass a chi-square test against the target's exact K-token law, enumerated from its processed
probabilities. A deliberately wrong verifier fails the same test. (2) A few end-to-end runs of
the real loop on a tiny random LM with a 12-token vocabulary, same check. Plus: the same
generator seed gives the same output, greedy output is untouched by every verifier.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter

import pytest
import torch
import transformers as tf
from transformers import (LogitsProcessorList, MaxLengthCriteria, RepetitionPenaltyLogitsProcessor,
                          StoppingCriteriaList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

from opttree import TreeConfig, build_opt_tree, speculative_generate
from opttree.loop.generation import speculative_decode
from opttree.loop.settings import DecodeSettings
from opttree.tree.sampled import build_sampled_tree, sample_children, slot_threshold
from opttree.verify.sampling import draft_to_probs
from opttree.verify.walk import Acceptance, verify

V = 5  # the synthetic world's vocabulary
PROMPT = (1, 3)


# ---------------------------------------------------------------------------------------------
# the synthetic world


def world(seed: int, scale: float):
    """logits(context tuple) -> [V] float32, a fixed random function of the context."""
    table: dict[tuple, torch.Tensor] = {}

    def logits(context: tuple) -> torch.Tensor:
        if context not in table:
            g = torch.Generator().manual_seed(hash((seed,) + context) % (2**31))
            table[context] = scale * torch.randn(V, generator=g)
        return table[context]

    return logits


def processors(kind: str) -> LogitsProcessorList:
    return LogitsProcessorList({
        "t1": [],
        "t0.7": [TemperatureLogitsWarper(0.7)],
        "t1.5": [TemperatureLogitsWarper(1.5)],
        "topk": [TemperatureLogitsWarper(0.8), TopKLogitsWarper(3)],
        "topp": [TopPLogitsWarper(0.8)],
        "rep": [RepetitionPenaltyLogitsProcessor(1.8), TemperatureLogitsWarper(0.9)],  # needs the context
    }[kind])


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Thousands of tiny-tensor ops: a second thread only adds overhead (3 ms a softmax under load)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def apply(procs, context: tuple, row: torch.Tensor) -> torch.Tensor:
    """[V] processed scores (the processors one by one: LogitsProcessorList inspects signatures)."""
    ids, scores = torch.tensor([context]), row[None].clone()
    for proc in procs:
        scores = proc(ids, scores)
    return scores[0]


def target_law(target, procs, context: tuple) -> torch.Tensor:
    """[V] float64: the target's processed next-token law after ``context``."""
    return torch.softmax(apply(procs, context, target(context)).double(), dim=-1)


def exact_law(target, procs, k: int) -> dict[tuple, float]:
    """The target's exact law of its first k tokens after PROMPT, enumerated."""
    law = {}
    for seq in itertools.product(range(V), repeat=k):
        prob, context = 1.0, PROMPT
        for token in seq:
            prob *= float(target_law(target, procs, context)[token])
            context += (token,)
        law[seq] = prob
    return law


def chi_square(counts: Counter, law: dict[tuple, float], n: int) -> tuple[float, float]:
    """Pearson's statistic (cells with < 5 expected merged) and its 1e-6 critical value."""
    stat, df, small_obs, small_exp = 0.0, -1, 0, 0.0
    for cell, p in law.items():
        expected = n * p
        if expected < 5:
            small_obs, small_exp = small_obs + counts.get(cell, 0), small_exp + expected
            continue
        stat += (counts.get(cell, 0) - expected) ** 2 / expected
        df += 1
    if small_exp > 0:
        stat += (small_obs - small_exp) ** 2 / max(small_exp, 1.0)
        df += 1
    z = 4.75  # one-sided 1e-6
    critical = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3  # Wilson–Hilferty
    return stat, critical


# ---------------------------------------------------------------------------------------------
# one speculative step in the synthetic world, then the target alone up to K tokens


def first_child_verifier(built, tree, logits, choose, config, process=None, generator=None) -> Acceptance:
    """A WRONG verifier (negative control): always accepts the root's first child, then samples."""
    if len(tree) == 0:
        return verify(built, tree, logits, choose, config, process, generator)
    first = tree.children()[0][0]
    token, scores = choose([int(tree.tokens[first])], logits[1 + first])
    return Acceptance(nodes=[first], tokens=[int(tree.tokens[first]), token], scores=[scores, scores],
                      logits=[logits[0], logits[1 + first]])


class Step:
    """One speculative step in the synthetic world; processed laws cached per context."""

    def __init__(self, target, draft, kind):
        self.target, self.draft, self.procs = target, draft, processors(kind)
        self.to_probs = draft_to_probs(self.procs)
        self._q, self._scores = {}, {}

    def q(self, context: tuple) -> torch.Tensor:  # [V] the draft's warped q
        if context not in self._q:
            self._q[context] = self.to_probs(self.draft(context)[None])[0]
        return self._q[context]

    def scores(self, context: tuple) -> torch.Tensor:  # [V] the target's processed scores
        if context not in self._scores:
            self._scores[context] = apply(self.procs, context, self.target(context))
        return self._scores[context]

    def sample(self, verifier, strategy, draws, config, k, generator, verify_fn=verify):
        """The first k tokens: one step's tokens, then the target alone; and the tree's size."""

        def expand(pool, frontier):
            return torch.stack([self.q(PROMPT + tuple(pool.tokens[pool.path_to(int(i))].tolist())) for i in frontier])

        if strategy == "sampled":
            built = build_sampled_tree(self.q(PROMPT), expand, config, generator=generator, draws=draws)
        else:
            built = build_opt_tree(self.q(PROMPT), expand, config)
        tree = built.tree
        paths = [()] + [tuple(tree.tokens[tree.path_to(i)].tolist()) for i in range(len(tree))]
        logits = torch.stack([self.target(PROMPT + p) for p in paths])  # [n + 1, V]

        def process(emitted, row):
            return self.scores(PROMPT + tuple(emitted))

        def choose(emitted, row):
            scores = process(emitted, row)
            return int(torch.multinomial(torch.softmax(scores, -1), 1, generator=generator)), scores

        cfg = TreeConfig(nodes=config.nodes, max_depth=config.max_depth, threshold=config.threshold, verifier=verifier)
        out = list(verify_fn(built, tree, logits, choose, cfg, process, generator).tokens)
        while len(out) < k:  # the next step(s): the target alone is enough to check the law
            law = torch.softmax(self.scores(PROMPT + tuple(out)), -1)
            out.append(int(torch.multinomial(law, 1, generator=generator)))
        return tuple(out[:k]), len(tree)


def run_world(verifier, strategy, draws, kind, agree, n=2000, k=2, nodes=6, seed=0, verify_fn=verify):
    """Pearson's statistic of n seeded samples against the exact law, its critical value, mean tree size."""
    target = world(seed=1, scale=1.5)
    draft = target if agree else world(seed=2, scale=2.0)
    config = TreeConfig(nodes=nodes, max_depth=3, threshold=0.0)
    step = Step(target, draft, kind)
    g = torch.Generator().manual_seed(seed)
    counts, sizes = Counter(), 0
    for _ in range(n):
        first, size = step.sample(verifier, strategy, draws, config, k, g, verify_fn)
        counts[first] += 1
        sizes += size
    stat, critical = chi_square(counts, exact_law(target, step.procs, k), n)
    return stat, critical, sizes / n


CASES = [  # (verifier, strategy, draws, processors, draft agrees)
    ("traversal", "sampled", "without_replacement", "t1", False),
    ("traversal", "sampled", "without_replacement", "t0.7", True),
    ("traversal", "sampled", "iid", "t1.5", False),
    ("traversal", "sampled", "without_replacement", "topk", False),
    ("traversal", "opt", None, "topp", False),
    ("traversal", "opt", None, "rep", True),
    ("rrs", "sampled", "without_replacement", "topp", False),
    ("rrs", "sampled", "iid", "rep", False),
    ("rrs", "opt", None, "t0.7", False),
    ("match", "sampled", "without_replacement", "topk", False),
]


@pytest.mark.parametrize("verifier,strategy,draws,kind,agree", CASES)
def test_verifier_output_has_the_target_law(verifier, strategy, draws, kind, agree):
    stat, critical, mean_size = run_world(verifier, strategy, draws, kind, agree)
    assert mean_size > 2  # real trees were verified
    assert stat < critical, (stat, critical)


def test_three_tokens_through_a_deep_sampled_tree():
    stat, critical, _ = run_world("traversal", "sampled", "without_replacement", "t1", False, n=3000, k=3, nodes=8)
    assert stat < critical, (stat, critical)


def test_a_wrong_verifier_fails_the_same_test():
    """Negative control: accepting the draft's first child unconditionally is caught."""
    stat, critical, _ = run_world("match", "sampled", "without_replacement", "t1", False, verify_fn=first_child_verifier)
    assert stat > critical, (stat, critical)


def wrong_traversal(built, tree, logits, process, generator=None) -> Acceptance:
    """A WRONG Traversal Verification (negative control): after a rejection the parent's weight
    becomes min(1, R / (1 - Q(x))) instead of R / (R + 1 - α) — the update a public
    re-implementation uses."""
    from opttree.verify.sampling import _draw, _Laws, _residual, _uniform

    laws = _Laws(built, tree, logits, process)

    def visit(node, alpha):
        p = laws.target(node)
        tried = []
        for child in laws.kids[node + 1]:
            token = laws.tokens[child]
            q = laws.proposal(node, token, tried)
            if p[token] > 0:
                found = visit(child, min(1.0, alpha * float(p[token]) / float(q[token])))
                if found is not None:
                    return found
            resid, mass = _residual(alpha * p, q)
            p = resid / mass if mass > 0 else p
            alpha = min(1.0, mass / max(1e-12, 1.0 - float(q[token])))
            tried.append(token)
        return (node, p) if node < 0 or _uniform(generator, logits.device) < alpha else None

    end, p = visit(-1, 1.0)
    return laws.acceptance(end, _draw(p, generator))


def test_a_subtly_wrong_traversal_fails_the_same_test(monkeypatch):
    from dataclasses import replace

    from opttree.tree import registry

    wrong = replace(registry.VERIFIERS["traversal"], sampling_walk=wrong_traversal)
    monkeypatch.setitem(registry.VERIFIERS, "traversal", wrong)
    stat, critical, _ = run_world("traversal", "sampled", "without_replacement", "t0.7", False)
    assert stat > critical, (stat, critical)


# ---------------------------------------------------------------------------------------------
# pieces


def test_sample_children_without_replacement_has_distinct_tokens_with_q_positive():
    q = torch.tensor([0.5, 0.0, 0.3, 0.2])
    g = torch.Generator().manual_seed(0)
    firsts = Counter()
    for _ in range(2000):
        drawn = sample_children(q, 3, g).tolist()
        assert sorted(drawn) == [0, 2, 3]
        firsts[drawn[0]] += 1
    assert abs(firsts[0] / 2000 - 0.5) < 0.05 and abs(firsts[3] / 2000 - 0.2) < 0.05  # first draw ~ q


def test_slot_threshold_is_the_budget_th_path_probability():
    q = torch.tensor([0.6, 0.3, 0.1])
    # products of {0.6, 0.3, 0.1}: 0.6, 0.36, 0.3, 0.216, 0.18 (0.6·0.3 and 0.3·0.6), ...
    assert slot_threshold(q, 1, 5) == pytest.approx(0.6)
    assert slot_threshold(q, 3, 5) == pytest.approx(0.3)
    assert slot_threshold(q, 5, 5) == pytest.approx(0.18)
    assert slot_threshold(q, 2, 1) == pytest.approx(0.3)  # depth 1: only the root's children


def test_sampled_builder_keeps_the_budget_and_the_depth():
    draft = world(seed=3, scale=1.0)

    def expand(pool, frontier):
        return torch.softmax(torch.stack([draft(tuple(pool.tokens[pool.path_to(int(i))].tolist())) for i in frontier]), -1)

    g = torch.Generator().manual_seed(0)
    for nodes, depth in [(1, 3), (5, 2), (12, 4)]:
        built = build_sampled_tree(torch.softmax(draft(()), -1), expand, TreeConfig(nodes=nodes, max_depth=depth), generator=g)
        assert 1 <= len(built.tree) <= nodes
        assert int(built.tree.depths().max()) <= depth
        for parent, kids in enumerate(built.tree.children()):  # without replacement: distinct siblings
            tokens = built.tree.tokens[kids].tolist()
            assert len(tokens) == len(set(tokens))
            if kids:
                assert parent - 1 in built.draft_probs


def test_draft_to_probs_applies_the_context_free_warpers_only():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    procs = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(5.0), TemperatureLogitsWarper(0.5), TopKLogitsWarper(2)])
    probs = draft_to_probs(procs)(logits)[0]
    expected = torch.softmax(torch.tensor([4.0, 2.0]), -1)
    assert torch.allclose(probs[:2], expected) and probs[2:].sum() == 0
    assert torch.allclose(draft_to_probs(LogitsProcessorList())(logits), torch.softmax(logits, -1))


# ---------------------------------------------------------------------------------------------
# end to end: the real loop on a tiny LM


VOCAB = 12


def tiny_lm(seed: int, scale: float = 1.0):
    torch.manual_seed(seed)
    config = tf.LlamaConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                            num_key_value_heads=1, intermediate_size=32, max_position_embeddings=64)
    config._attn_implementation = "sdpa"
    model = tf.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(scale)
    return model


def lm_law(model, procs, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        row = model(torch.tensor([ids])).logits[0, -1].float()
    return torch.softmax(procs(torch.tensor([ids]), row[None])[0].double(), -1)


@pytest.mark.parametrize("verifier,strategy,kind,agree", [
    ("traversal", "sampled", "t0.7", True),
    ("rrs", "sampled", "topp", False),
    ("match", "opt", "t0.7", "head"),  # an EAGLE-style feature head drafts (random weights)
])
def test_end_to_end_two_tokens_have_the_target_law(verifier, strategy, kind, agree):
    target = tiny_lm(0, scale=4.0)
    draft = target if agree is True else tiny_lm(5, scale=4.0)
    if agree == "head":
        from opttree.distill.train.head import new_head
        from opttree.drafters.head.feature_head import FeatureHeadDrafter

        head = new_head(target)[0]
        with torch.no_grad():
            head.fc.weight.normal_(0, 0.3, generator=torch.Generator().manual_seed(0))
    procs = processors(kind)
    prompt = [3, 7, 1]
    law = {}
    for a in range(VOCAB):
        pa = float(lm_law(target, procs, prompt)[a])
        law_b = lm_law(target, procs, prompt + [a])
        for b in range(VOCAB):
            law[(a, b)] = pa * float(law_b[b])
    config = TreeConfig(nodes=6, max_depth=3, threshold=0.0, strategy=strategy, verifier=verifier)
    from opttree.drafters import ModelDrafter
    from opttree.hf import kv_cache

    stop = StoppingCriteriaList([MaxLengthCriteria(max_length=len(prompt) + 2)])
    g = torch.Generator().manual_seed(0)
    counts, n, steps = Counter(), 600, 0
    with torch.inference_mode():
        for _ in range(n):
            if agree == "head":
                drafter = FeatureHeadDrafter(head, to_probs=draft_to_probs(procs))
            else:
                drafter = ModelDrafter(draft, to_probs=draft_to_probs(procs))
            settings = DecodeSettings(config, procs, stop, max_length=len(prompt) + 2, context_length=64,
                                      do_sample=True, generator=g)
            result = speculative_decode(target, drafter, torch.tensor([prompt]), kv_cache.new_cache(target), settings)
            counts[tuple(result.sequences[0, len(prompt):].tolist())] += 1
            steps += len(result.stats.steps)
    stat, critical = chi_square(counts, law, n)
    assert stat < critical, (stat, critical)
    if agree is True:
        assert steps < 1.5 * n  # the agreeing draft really is accepted (mostly one step for two tokens)


def test_same_generator_seed_same_output_and_greedy_untouched():
    target = tiny_lm(0, scale=3.0)
    draft = tiny_lm(5, scale=3.0)
    ids = torch.tensor([[3, 7, 1, 4]])
    greedy = target.generate(ids, max_new_tokens=12, do_sample=False)
    differs = 0
    for verifier in ("match", "rrs", "traversal"):
        for strategy in ("opt", "sampled"):
            kw = dict(custom_generate=speculative_generate, draft_model=draft, nodes=6, verifier=verifier,
                      strategy=strategy)
            assert torch.equal(target.generate(ids, max_new_tokens=12, do_sample=False, **kw), greedy)
            runs = [target.generate(ids, max_new_tokens=12, do_sample=True, temperature=0.8, top_p=0.9,
                                    generator=torch.Generator().manual_seed(s), **kw) for s in (7, 7, 8)]
            assert torch.equal(runs[0], runs[1]), (verifier, strategy)
            differs += not torch.equal(runs[0], runs[2])
    assert differs >= 3  # another seed really samples something else


def test_the_tree_is_built_from_the_warped_draft():
    """generate()'s top_k=1 reaches the draft: its q is one-hot, so every step's tree is a chain
    (with softmax-at-temperature-1 q the 6-node budget would branch at the root)."""
    target = tiny_lm(0, scale=3.0)
    out = target.generate(torch.tensor([[3, 7, 1, 4]]), max_new_tokens=10, do_sample=True, top_k=1,
                          custom_generate=speculative_generate, draft_model=tiny_lm(5), nodes=6, max_depth=3,
                          threshold=0.0, generator=torch.Generator().manual_seed(0), return_dict_in_generate=True)
    assert all(step.tree_size == step.tree_depth for step in out.stats.steps)
    assert max(step.tree_size for step in out.stats.steps) > 1
