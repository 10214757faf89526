"""Steps that do not draft (budget/skip.py): the rule pinned by its decisions, "auto"'s worth of a drafted
step, and decoding with skipped steps lossless for every kind of drafter, each catching up right (drafters
that are always right stay right after a skip: every drafted step accepts its whole chain)."""

import pytest
import torch

from models import peaked, tiny_model
from opttree import TreeConfig, speculative_generate
from opttree.budget.latency import LatencyModel, LatencyTable
from opttree.budget.policy import AutoPolicy, drafting_worth
from opttree.budget.skip import MAX_BACKOFF, SETTLE, SkipRule
from opttree.integration import prepare as integration
from opttree.tree.plan import StepPlan
from opttree.tree.sizes import padded_size
from test_feature_head import oracle_head, sharp_one_layer_target


def run(rule: SkipRule, worths: list[float], steps: int = 120) -> str:
    """The rule's decisions ("d" drafted, "." not) while drafted steps are worth ``worths`` in turn (cycled)."""
    out, k = [], 0
    while len(out) < steps:
        drafts = rule.draft_next()
        out.append("d" if drafts else ".")
        rule.observe(drafts, worths[k % len(worths)] if drafts else None)
        k += drafts
    return "".join(out)


def test_drafting_worth_more_than_the_root_alone_on_average_is_never_skipped():
    assert run(SkipRule(), [1.2]) == "d" * 120
    assert run(SkipRule(), [0.8, 1.4]) == "d" * 120  # a hard step after each easy one: the mean decides


def test_drafting_worth_less_is_tried_again_after_doubling_runs():
    seen = run(SkipRule(), [0.8])
    assert seen.startswith("d" * SETTLE + ".")
    runs = [len(r) for r in seen.split("d")[SETTLE:-1]]  # undrafted runs between drafted tries
    assert runs[:5] == [1, 2, 4, 8, 16] and set(runs[5:]) == {MAX_BACKOFF}


def test_a_retried_step_worth_drafting_starts_drafting_again():
    rule = SkipRule()
    run(rule, [0.8])
    assert rule.backoff == MAX_BACKOFF
    seen = run(rule, [1.3])  # the text got easier: the next drafted step is worth it
    assert seen.lstrip(".").startswith("d" * 100) and rule.backoff == 1 and rule.worth >= 1.0


def test_a_step_without_a_priced_tree_moves_nothing():
    rule = SkipRule()
    for _ in range(3 * SETTLE):
        rule.observe(True, None)
    assert rule == SkipRule()


def latency_of(t0: float, t1: float, overhead: float = 0.0) -> LatencyModel:
    return LatencyModel(verify=LatencyTable((0, 1), (t0, t1)), overhead=overhead)


def test_a_drafted_steps_worth_is_its_speed_with_drafting_over_the_root_alones():
    latency = latency_of(0.050, 0.060, overhead=0.010)
    assert drafting_worth(1.5 / 0.090, latency) == pytest.approx(1.5 * 0.060 / 0.090)
    policy = AutoPolicy(TreeConfig(nodes="auto"), latency, clock=lambda: 0.0)
    plan = policy.plan()
    assert plan.size(torch.tensor([0.9])) == 1 and policy._worth == pytest.approx(1.9 / 0.070 * 0.060)
    assert plan.size(torch.tensor([0.01])) == 0 and policy._worth == pytest.approx(1.0)  # the root alone, D = 0


# ---------------------------------------------------------------------------------------------
# decoding with skipped steps


class Rhythm:
    """A fixed policy whose steps draft only where ``pattern`` says "d" (cycled)."""

    timed = False

    def __init__(self, nodes: int, pattern: str, strategy_plan: dict):
        self.max_nodes, self.pattern, self.k, self.more = nodes, pattern, 0, strategy_plan

    def plan(self):
        drafts = self.pattern[self.k % len(self.pattern)] == "d"
        self.k += 1
        return StepPlan(nodes=self.max_nodes, threshold=0.0, draft=drafts, **self.more)

    def observe(self, stats):
        pass

    def verify_rows(self, nodes):
        return padded_size(nodes + 1)


def rhythm(monkeypatch, pattern: str, nodes: int = 5):
    monkeypatch.setattr(integration.calibration, "policy_maker", lambda *a, **k: lambda: Rhythm(nodes, pattern, {}))


def spec(target, draft, ids, **kw):
    return target.generate(ids, do_sample=False, custom_generate=speculative_generate, draft_model=draft,
                           return_dict_in_generate=True, strategy="chain", **kw)


@pytest.mark.parametrize("pattern", ["d.", "d..d", "d...."])
def test_an_oracle_head_stays_right_after_skipped_steps(pattern, monkeypatch):
    """The feature head catches up on the features of the steps it skipped: every drafted step's whole
    chain is accepted, as without skips (its tokens and features fed in order, positions right)."""
    target = sharp_one_layer_target()
    ids = torch.randint(3, 90, (1, 9), generator=torch.Generator().manual_seed(1))
    ref = target.generate(ids, max_new_tokens=30, do_sample=False)
    rhythm(monkeypatch, pattern)
    out = spec(target, oracle_head(target), ids, max_new_tokens=30, nodes=5)
    assert torch.equal(out.sequences, ref)
    steps = out.stats.steps
    drafted = [s for s in steps if s.tree_size > 0]
    assert len(drafted) < len(steps) and all(s.accepted == s.tree_size for s in drafted[:-1])
    assert all(s.tree_size == 0 and s.draft_forwards == 0 and s.root_seconds == 0 for s in steps if s.tree_size == 0)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("pattern", ["d.", "d..d"])
def test_a_draft_model_stays_right_after_skipped_steps(family, pattern, monkeypatch):
    """The target as its own draft model: its cache catches up on the skipped tokens, so every drafted
    chain is accepted whole."""
    target = peaked(tiny_model(family, seed=0), scale=30.0)
    ids = torch.randint(3, 90, (1, 7), generator=torch.Generator().manual_seed(4))
    ref = target.generate(ids, max_new_tokens=24, do_sample=False)
    rhythm(monkeypatch, pattern)
    out = spec(target, target, ids, max_new_tokens=24, nodes=4)
    assert torch.equal(out.sequences, ref)
    drafted = [s for s in out.stats.steps if s.tree_size > 0]
    assert 0 < len(drafted) < len(out.stats.steps) and all(s.accepted == s.tree_size for s in drafted[:-1])


def test_prompt_lookup_and_a_padded_batch_stay_plain_with_skipped_steps(monkeypatch):
    target = peaked(tiny_model("llama", seed=0), scale=30.0)
    rows = [torch.randint(3, 90, (n,), generator=torch.Generator().manual_seed(n)) for n in (9, 5)]
    width = max(len(r) for r in rows)
    ids = torch.stack([torch.cat([torch.zeros(width - len(r), dtype=torch.long), r]) for r in rows])
    mask = torch.stack([torch.cat([torch.zeros(width - len(r)), torch.ones(len(r))]) for r in rows]).long()
    rhythm(monkeypatch, "d..")
    for draft in ("prompt_lookup", target):
        out = spec(target, draft, ids, attention_mask=mask, max_new_tokens=16, nodes=4)
        for b, r in enumerate(rows):
            ref = target.generate(r[None], max_new_tokens=16, do_sample=False)
            assert torch.equal(out.sequences[b, width:], ref[0, len(r):]), (draft, b)


def test_an_eagle3_head_catches_up_after_skipped_steps_as_without_them(tmp_path, monkeypatch):
    """An EAGLE-3 head drafts after skipped steps the q it drafts there without skips (its catch-up feeds the
    skipped tokens' features in order): the same trees' p̂ at the same positions, whatever the rhythm."""
    from eagle_folders import target_for, write_eagle3
    target = target_for("llama")
    folder = write_eagle3(tmp_path / "head", target)
    ids = torch.randint(3, 90, (1, 9), generator=torch.Generator().manual_seed(2))
    ref = target.generate(ids, max_new_tokens=20, do_sample=False)
    trees = {}
    for pattern in ("d", "d.."):
        rhythm(monkeypatch, pattern)
        out = spec(target, str(folder), ids, max_new_tokens=20, nodes=3)
        assert torch.equal(out.sequences, ref), pattern
        at, position = {}, ids.shape[1]
        for s in out.stats.steps:
            if s.tree_size > 0:
                at[position] = s.tree.path_probs
            position += s.emitted
        trees[pattern] = at
    common = set(trees["d"]) & set(trees["d.."])
    assert len(common) >= 2
    for position in common:
        torch.testing.assert_close(trees["d.."][position], trees["d"][position], rtol=1e-4, atol=1e-6)


def test_auto_skips_drafting_where_undrafted_steps_deliver_more_and_stays_plain(monkeypatch):
    """End to end on "auto": a drafter whose steps cost more than they deliver (a fake clock says so)
    (every drafted step worth half an undrafted one) leads to undrafted steps, and the output stays plain's."""
    target = peaked(tiny_model("llama", seed=0), scale=30.0)
    ids = torch.randint(3, 90, (1, 7), generator=torch.Generator().manual_seed(4))
    ref = target.generate(ids, max_new_tokens=40, do_sample=False)
    monkeypatch.setattr("opttree.budget.policy.drafting_worth", lambda speed, latency: 0.5)
    out = target.generate(ids, do_sample=False, custom_generate=speculative_generate, draft_model="prompt_lookup",
                          return_dict_in_generate=True, max_new_tokens=40)
    assert torch.equal(out.sequences, ref)
    undrafted = [s for s in out.stats.steps if s.draft_forwards == 0 and s.root_seconds == 0]
    assert len(undrafted) >= len(out.stats.steps) // 2
