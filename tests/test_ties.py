"""The near-tie rule for greedy equality up to rounding (opttree.tools.ties), the same in every dtype with
its bound scaled to the dtype's eps: the classifier on synthetic scores, opttree on tiny random models
in bf16 and fp16 (equal or a tie, never a mismatch), float32 near-ties engineered in the LM head
(opttree's own rounding splits from plain's there, and only there), a tie made on purpose through the
whole loop, and negative controls: a verifier that emits a non-argmax token, and outputs with one
token changed, are mismatches in every dtype."""

import pytest
import torch

from models import FAMILIES, VOCAB, peaked, tiny_model
from opttree import speculative_generate
from opttree.loop import walking
from opttree.tools.ties import TIE_EPS_MULTIPLE, Outcome, check_greedy, classify, gap_in_ulps, plain_greedy, tie_bound

HALF = [torch.bfloat16, torch.float16]
WIDE = [torch.float32, torch.float64]


def scores_with(values: dict[int, float], vocab: int = 8, rest: float = 0.0, dtype=torch.float32) -> torch.Tensor:
    """One step's scores [vocab] (float32 by default): ``rest`` everywhere but at the given tokens."""
    row = torch.full((vocab,), rest, dtype=dtype)
    for token, value in values.items():
        row[token] = value
    return row


# -- the classifier on synthetic scores --------------------------------------------------------------

@pytest.mark.parametrize("dtype", HALF + WIDE, ids=str)
def test_equal_outputs_are_equal_in_every_dtype(dtype):
    verdict = classify([1, 2, 3], [1, 2, 3], [scores_with({1: 1.0})] * 3, dtype)
    assert verdict.outcome is Outcome.EQUAL and verdict.ok and verdict.ties == () and verdict.mismatch is None


@pytest.mark.parametrize("dtype", HALF + WIDE, ids=str)
def test_an_exact_tie_is_a_tie_in_every_dtype(dtype):
    step1 = scores_with({2: 0.310546875, 5: 0.310546875})  # plain took the first of two equal maxima
    verdict = classify([4, 2, 7], [4, 5, 1], [scores_with({4: 1.0}), step1, scores_with({7: 1.0})], dtype)
    assert verdict.outcome is Outcome.TIE and verdict.ok
    (tie,) = verdict.ties
    assert (tie.step, tie.expected, tie.got, tie.gap) == (1, 2, 5, 0.0)
    assert tie.bound == TIE_EPS_MULTIPLE * torch.finfo(dtype).eps * 0.310546875
    assert "tie at new token 1" in verdict.describe()


@pytest.mark.parametrize("dtype", HALF + [torch.float32], ids=str)
def test_a_gap_at_the_bound_is_a_tie_and_one_step_more_is_a_mismatch(dtype):
    eps = torch.finfo(dtype).eps
    top = 8.0  # the largest |score|: values in [4, 8) are eps * 4 apart in this dtype
    at_bound = top - TIE_EPS_MULTIPLE * eps * top
    beyond = at_bound - eps * 4  # the next representable value below
    for value in (at_bound, beyond):  # both are scores a model of this dtype can produce
        assert torch.tensor(value, dtype=dtype).item() == value
    for value, outcome in ((at_bound, Outcome.TIE), (beyond, Outcome.MISMATCH)):
        scores = [scores_with({0: top, 1: value, 2: -top})]
        assert classify([0], [1], scores, dtype).outcome is outcome, value
    assert gap_in_ulps(top - at_bound, scores_with({0: top}), dtype) == 4.0  # eps * 8.0 is one ulp at 8.0


def test_fp16_allows_an_eighth_of_bf16s_gap():
    row = scores_with({0: 3.0, 1: 2.9})
    assert tie_bound(row, torch.float16) == tie_bound(row, torch.bfloat16) / 8


def test_float32s_bound_is_its_eps_and_far_smaller_than_half_precisions():
    row = scores_with({0: 3.0, 1: 2.9})
    assert tie_bound(row, torch.float32) == TIE_EPS_MULTIPLE * 2.0 ** -23 * 3.0
    assert tie_bound(row, torch.float32) == tie_bound(row, torch.bfloat16) / 2 ** 16
    assert tie_bound(row, torch.float64) == TIE_EPS_MULTIPLE * 2.0 ** -52 * 3.0


@pytest.mark.parametrize("dtype", WIDE, ids=str)
def test_in_float32_and_float64_a_one_ulp_gap_is_a_tie_and_a_real_gap_a_mismatch(dtype):
    """float32 and float64 follow the same rule: a gap of one unit in the last place is rounding, a gap of
    a thousandth (far above the bound: 4 eps * 0.5) is an error."""
    top = 0.5
    one_ulp = torch.nextafter(torch.tensor(top, dtype=dtype), torch.tensor(0.0, dtype=dtype)).item()
    verdict = classify([0], [1], [scores_with({0: top, 1: one_ulp}, dtype=dtype)], dtype)
    assert verdict.outcome is Outcome.TIE and 0 < verdict.ties[0].gap <= verdict.ties[0].bound
    for got, value in ((1, top - 1e-3), (3, 0.0)):  # a close second, and a token far below
        verdict = classify([0], [got], [scores_with({0: top, 1: value}, dtype=dtype)], dtype)
        assert verdict.outcome is Outcome.MISMATCH and not verdict.ok and verdict.ties == ()
        assert verdict.mismatch.step == 0 and verdict.mismatch.gap > verdict.mismatch.bound > 0


def test_stopping_elsewhere_is_a_mismatch_even_in_half_precision():
    scores = [scores_with({1: 1.0, 2: 1.0})] * 3
    for plain, other in (([1, 1], [1]), ([1], [1, 1])):
        verdict = classify(plain, other, scores, torch.bfloat16)
        assert verdict.outcome is Outcome.MISMATCH and verdict.mismatch.gap is None
        assert "length difference" in verdict.describe()


def test_masked_scores_do_not_set_the_scale():
    row = scores_with({0: 1.0, 1: 0.99}, rest=float("-inf"))  # e.g. a processor's -inf mask
    assert tie_bound(row, torch.bfloat16) == TIE_EPS_MULTIPLE * torch.finfo(torch.bfloat16).eps * 1.0


def test_scores_that_prefer_the_other_token_are_not_plains():
    with pytest.raises(ValueError, match="not the scores plain chose from"):
        classify([0], [1], [scores_with({0: 0.5, 1: 0.6})], torch.bfloat16)


def test_without_scores_no_divergence_is_a_tie():
    verdict = classify([1, 2], [1, 3], None, torch.bfloat16)
    assert verdict.outcome is Outcome.MISMATCH and verdict.mismatch.gap is None
    assert verdict.describe() == "mismatch: at new token 1: plain 2, got 3"


# -- opttree on tiny random models in half precision ------------------------------------------------

def prompt(seed: int, length: int = 6) -> torch.Tensor:  # [1, length] long
    return torch.randint(3, 90, (1, length), generator=torch.Generator().manual_seed(seed))


def opttree_tokens(target, draft, ids, max_new_tokens=16, nodes_=6, **kw) -> list[int]:
    out = target.generate(ids, custom_generate=speculative_generate, draft_model=draft, nodes=nodes_,
                          max_new_tokens=max_new_tokens, do_sample=False, **kw)
    return out[0, ids.shape[1]:].tolist()


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("family", FAMILIES)
def test_half_precision_output_is_plains_or_diverges_only_at_ties(family, dtype):
    """Raw random models (top scores often within a few units of rounding of each other): opttree's
    output may leave plain's at a near-tie, and only there, on any CPU."""
    target = tiny_model(family, seed=0, dtype=dtype)
    for draft in (tiny_model(family, seed=1, dtype=dtype), target):
        for seed in range(3):
            ids = prompt(seed)
            verdict = check_greedy(target, ids, opttree_tokens(target, draft, ids), max_new_tokens=16)
            assert verdict.ok, verdict.describe()


def nudged_walk(token: int, ulps: int = 1):
    """The argmax walk on logits where ``token`` scores ``ulps`` float32 units higher: where it ties
    exactly with a lower token, it wins (plain's argmax takes the lower one); nowhere else can the
    choice change, as half-precision scores lie far more than one float32 unit apart."""
    real = walking.greedy_walk

    def walk(tree, logits, pool_ids, depth=None):  # logits: [n + 1, vocab] float32
        logits = logits.clone()
        for _ in range(ulps):
            logits[:, token] = torch.nextafter(logits[:, token], torch.tensor(float("inf")))
        return real(tree, logits, pool_ids, depth)

    return walk


def tied_target(dtype):
    """A target whose LM head gives token ``b`` exactly token ``a``'s logit, ``a`` < ``b`` being plain's
    first new token on prompt(0): plain picks ``a``, a walk that breaks the tie upwards ``b``."""
    target = tiny_model("llama", seed=0, dtype=dtype)
    a = plain_greedy(target, prompt(0), max_new_tokens=1).tokens[0]
    b = VOCAB - 1
    assert a < b
    with torch.no_grad():
        target.lm_head.weight[b] = target.lm_head.weight[a]
    return target, a, b


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_a_tie_broken_the_other_way_is_a_tie(dtype, monkeypatch):
    target, a, b = tied_target(dtype)
    monkeypatch.setattr(walking, "greedy_walk", nudged_walk(b))
    ids = prompt(0)
    tokens = opttree_tokens(target, target, ids)
    assert tokens[0] == b
    verdict = check_greedy(target, ids, tokens, max_new_tokens=16)
    assert verdict.outcome is Outcome.TIE, verdict.describe()
    assert (verdict.ties[0].step, verdict.ties[0].expected, verdict.ties[0].got, verdict.ties[0].gap) == (0, a, b, 0.0)
    # the same walk on a float32 target is a tie too: an exact tie is within any dtype's rounding
    target32, a32, b32 = tied_target(torch.float32)
    tokens32 = opttree_tokens(target32, target32, ids)
    verdict = check_greedy(target32, ids, tokens32, max_new_tokens=16)
    assert tokens32[0] == b32 and verdict.outcome is Outcome.TIE and verdict.ties[0].gap == 0.0


def test_after_a_tie_the_continuation_is_checked_too(monkeypatch):
    """A wrong token after a genuine tie is still caught: the rest of the output is checked against
    the target's own greedy from the diverged context."""
    target, a, b = tied_target(torch.bfloat16)
    monkeypatch.setattr(walking, "greedy_walk", nudged_walk(b))
    ids = prompt(0)
    tokens = opttree_tokens(target, target, ids)
    after = torch.cat([ids, torch.tensor([tokens[:4]])], 1)
    scores = plain_greedy(target, after, max_new_tokens=1).scores[0]
    wrong = int(scores.topk(10).indices[-1])  # the 10th best where the 5th token is chosen
    verdict = check_greedy(target, ids, tokens[:4] + [wrong] + tokens[5:], max_new_tokens=16)
    assert verdict.outcome is Outcome.MISMATCH and verdict.ties[0].step == 0
    assert verdict.mismatch.step == 4 and verdict.mismatch.gap > verdict.mismatch.bound



def test_methods_parting_at_the_same_tie_share_plains_reruns(monkeypatch):
    """The bench judges a turn's methods with one PlainReruns: two outputs that part from plain at the same
    tie are judged as each alone is (a tie; a wrong token after it still a mismatch), and plain is rerun
    from the prompt and from the tied prefix once for both, not once each (the control: unshared, 2 each)."""
    from opttree.bench.runner import PlainReruns, judge, judge_kwargs

    target, a, b = tied_target(torch.bfloat16)
    monkeypatch.setattr(walking, "greedy_walk", nudged_walk(b))
    ids = prompt(0)
    tokens = opttree_tokens(target, target, ids)
    plain = plain_greedy(target, ids, max_new_tokens=16).tokens
    assert tokens[0] == b and plain[0] == a
    after = torch.cat([ids, torch.tensor([tokens[:4]])], 1)
    wrong = int(plain_greedy(target, after, max_new_tokens=1).scores[0].topk(10).indices[-1])
    bad = tokens[:4] + [wrong] + tokens[5:]
    alone = [judge(target, ids, out, plain, 16) for out in (tokens, bad)]
    reruns = PlainReruns(target, judge_kwargs(target, ids, 16))
    shared = [judge(target, ids, out, plain, 16, reruns) for out in (tokens, bad)]
    assert [v.outcome for v in shared] == [v.outcome for v in alone] == [Outcome.TIE, Outcome.MISMATCH]
    assert shared == alone
    assert reruns.made == 2  # from the prompt, and from the prefix [b]: shared by both outputs
    unshared = PlainReruns(target, judge_kwargs(target, ids, 16)), PlainReruns(target, judge_kwargs(target, ids, 16))
    for out, own in zip((tokens, bad), unshared):
        judge(target, ids, out, plain, 16, own)
    assert [own.made for own in unshared] == [2, 2]


# -- float32: near-ties engineered in the LM head ---------------------------------------------------

def near_tie_target(family: str, seed: int):
    """A float32 target whose LM head gives token ``b`` (the last) the logit of plain's first argmax
    ``a`` on prompt(seed) in exact arithmetic: b's row is a's plus a vector of a row's usual norm,
    orthogonal to the last hidden state, then moved along it to match a's logit. In float32 the two
    logits differ by a unit in the last place or less (1e-8 to 1e-7 here), and which is larger
    depends on how the forward rounds: a tree forward and plain's one-token forward may disagree.
    Returns (target, a, b, prompt)."""
    ids = prompt(seed)
    target = tiny_model(family, seed=0)
    head = target.get_output_embeddings()
    with torch.no_grad():
        h = target.base_model(ids).last_hidden_state[0, -1]  # [H], what the LM head reads
        logits = head(h)  # [vocab]
        a = int(logits.argmax())
        b = VOCAB - 1 if a != VOCAB - 1 else VOCAB - 2
        v = torch.randn(h.shape[0], generator=torch.Generator().manual_seed(seed))
        v = v - (v @ h) / (h @ h) * h  # orthogonal to h: the logit does not move
        row = head.weight[a] + v / v.norm() * head.weight[a].norm()
        row = row + (logits[a] - h @ row) * h / (h @ h)  # b's logit = a's, in exact arithmetic
        weight = head.weight.detach().clone()  # untied from the input embedding (GPT-2 ties them)
        weight[b] = row
        head.weight = torch.nn.Parameter(weight)
    return target, a, b, ids


SEED_SEARCH = 48  # seeds tried for a near-tie of the kind a test needs before it says none was found


def near_ties(family: str, wanted, count: int):
    """The first ``count`` near-tie targets (``near_tie_target(family, seed)`` with plain's greedy on its
    prompt) whose plain scores satisfy ``wanted(gap, scores)``, gap = plain's score of its own first token
    minus the other tied token's. Which seeds qualify depends on how THIS CPU's kernels round (on an AMX
    Xeon plain's two logits come out exactly equal for seed 0, on a Zen 4 they differ by an ulp), so the
    tests search for their precondition instead of assuming one seed has it, and fail, saying so, only
    when a bounded search finds too few."""
    found = []
    for seed in range(SEED_SEARCH):
        target, a, b, ids = near_tie_target(family, seed)
        plain = plain_greedy(target, ids, max_new_tokens=8)
        first, scores = plain.tokens[0], plain.scores[0]
        if first not in (a, b):
            continue
        other = b if first == a else a
        if wanted(float(scores[first] - scores[other]), scores):
            found.append((seed, target, a, b, ids, plain))
            if len(found) == count:
                return found
    raise AssertionError(f"{family}: only {len(found)} of {count} near-ties of the kind wanted among "
                         f"{SEED_SEARCH} seeds on this CPU: the construction no longer makes them here")


def within_bound(gap: float, scores: torch.Tensor) -> bool:
    return abs(gap) <= tie_bound(scores, torch.float32)


def split_by_an_ulp_or_two(gap: float, scores: torch.Tensor) -> bool:
    """Plain's own token ahead by a unit or two in the last place: a near-tie, not an exact one, that a
    nudge of 4 units to the other token reverses."""
    return 0 < gap and gap_in_ulps(gap, scores, torch.float32) <= 2 and within_bound(gap, scores)


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
def test_float32_near_ties_engineered_in_the_lm_head_are_ties_never_mismatches(family):
    """opttree's output on float32 targets with a near-tie (within float32's bound in plain's own scores)
    at the first token: equal to plain's, or leaving it exactly there, between the two tied tokens, as a
    TIE (on the AMD EPYC this was written on, 15 or 16 of 36 runs split: the CPU kernel's timed choices
    vary from run to run). Six such targets per family, found on this CPU (:func:`near_ties`)."""
    for seed, target, a, b, ids, plain in near_ties(family, within_bound, count=6):
        for nodes in (1, 8):
            tokens = opttree_tokens(target, target, ids, max_new_tokens=8, nodes_=nodes)
            verdict = check_greedy(target, ids, tokens, max_new_tokens=8, plain=plain)
            assert verdict.ok, (family, seed, nodes, verdict.describe())
            if verdict.outcome is Outcome.TIE:
                tie = verdict.ties[0]
                assert tie.step == 0 and {tie.expected, tie.got} == {a, b}, verdict.describe()


def test_a_float32_near_tie_split_the_other_way_is_a_tie_and_a_far_token_a_mismatch(monkeypatch):
    """The split made certain: the walk adds 4 float32 units to the token plain did not take. Plain's
    gap there is not zero (a near-tie, not an exact one: found on this CPU, :func:`near_ties`) and is a
    tie; a token far below plain's at the same step is a mismatch (negative control)."""
    ((seed, target, a, b, ids, plain),) = near_ties("llama", split_by_an_ulp_or_two, count=1)
    first, scores = plain.tokens[0], plain.scores[0]
    other = b if first == a else a
    gap = float(scores[first] - scores[other])
    assert 0 < gap <= tie_bound(scores, torch.float32)
    monkeypatch.setattr(walking, "greedy_walk", nudged_walk(other, ulps=4))
    tokens = opttree_tokens(target, target, ids, max_new_tokens=8)
    assert tokens[0] == other, seed
    verdict = check_greedy(target, ids, tokens, max_new_tokens=8)
    assert verdict.outcome is Outcome.TIE and len(verdict.ties) == 1, verdict.describe()
    assert (verdict.ties[0].expected, verdict.ties[0].got, verdict.ties[0].gap) == (first, other, gap)
    far = int(scores.topk(10).indices[-1])
    wrong = check_greedy(target, ids, [far] + tokens[1:], max_new_tokens=8, plain=plain)
    assert wrong.outcome is Outcome.MISMATCH and wrong.mismatch.step == 0
    assert wrong.mismatch.gap > 1000 * wrong.mismatch.bound


def test_the_near_tie_search_says_so_when_this_cpu_gives_none():
    """The search's own negative control: a precondition no seed can meet fails with its reason, never
    passes by finding nothing to check."""
    with pytest.raises(AssertionError, match="near-ties of the kind wanted among"):
        near_ties("llama", lambda gap, scores: False, count=1)


# -- negative controls: what the rule must not excuse ----------------------------------------------

def demoting_walk(ranks: int):
    """A WRONG verifier: at the first step's root it takes the target's (ranks + 1)-th best token."""
    real = walking.greedy_walk
    calls = []

    def walk(tree, logits, pool_ids, depth=None):  # logits: [n + 1, vocab] float32
        if not calls:
            logits = logits.clone()
            logits[0, logits[0].topk(ranks).indices] = float("-inf")
        calls.append(1)
        return real(tree, logits, pool_ids, depth)

    return walk


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("family", ["llama", "qwen3", "gpt2"])
def test_a_verifier_that_accepts_a_non_argmax_token_is_a_mismatch(family, dtype, monkeypatch):
    target = tiny_model(family, seed=0, dtype=dtype)
    monkeypatch.setattr(walking, "greedy_walk", demoting_walk(9))
    ids = prompt(1)
    verdict = check_greedy(target, ids, opttree_tokens(target, target, ids), max_new_tokens=16)
    assert verdict.outcome is Outcome.MISMATCH and verdict.ties == ()
    assert verdict.mismatch.step == 0 and verdict.mismatch.gap > verdict.mismatch.bound


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("rank", [1, 9])  # the 2nd and the 10th best token
def test_an_output_with_one_token_changed_is_a_mismatch(rank, dtype):
    """On a peaked target (top scores far apart) the 2nd best is as wrong as the 10th."""
    target = peaked(tiny_model("llama", seed=0, dtype=dtype), scale=30.0)
    ids = prompt(2)
    plain = plain_greedy(target, ids, max_new_tokens=12)
    changed = 0
    for step, row in enumerate(plain.scores):
        tokens = list(plain.tokens)
        tokens[step] = int(row.topk(rank + 1).indices[-1])
        if row[plain.tokens[step]] - row[tokens[step]] <= 2 * tie_bound(row, dtype):
            continue  # a near-tie on this CPU: changing it is no clear error
        verdict = classify(plain.tokens, tokens, plain.scores, dtype)
        assert verdict.outcome is Outcome.MISMATCH and verdict.mismatch.step == step
        assert check_greedy(target, ids, tokens, max_new_tokens=12, plain=plain).outcome is Outcome.MISMATCH
        changed += 1
    assert changed >= 6
