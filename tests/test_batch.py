"""Batches: left-padded prompts, each row with its own tree, equal row by row to the target's own
batched greedy generate() (same left padding, same pad tokens after a row's EOS); sampling keeps
each row's law; finished rows leave the batch."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from transformers import LogitsProcessorList, StoppingCriteria, StoppingCriteriaList, TemperatureLogitsWarper

from models import partly_agreeing, peaked, tiny_model
from opttree import TreeConfig, speculative, speculative_generate
from opttree.loop import rows as rows_module
from opttree.loop import slots as slots_module
from opttree.loop import verify_inputs as inputs_module

FAMILIES = ["llama", "qwen2", "gpt2", "opt", "gemma"]


def padded(lengths, seed=0, pad=0):
    """Left-padded prompts of the given lengths: (input_ids [B, T], attention_mask [B, T])."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.full((len(lengths), width), pad, dtype=torch.long)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for b, n in enumerate(lengths):
        ids[b, width - n:] = torch.randint(3, 90, (n,), generator=g)
        mask[b, width - n:] = 1
    return ids, mask


def spec(target, draft, ids, mask, **kw):
    tree = {k: kw.pop(k) for k in ("nodes", "threshold", "max_depth", "verifier", "strategy") if k in kw}
    return target.generate(ids, attention_mask=mask, do_sample=False, custom_generate=speculative_generate,
                           draft_model=draft, return_dict_in_generate=True, **tree, **kw)


def pairs(family):
    target = peaked(tiny_model(family, seed=0), scale=30.0)
    return target, {"agree": target, "partly": partly_agreeing(target), "unrelated": tiny_model(family, seed=1)}


def emitted(sequences, prompt_width, eos) -> list[int]:
    """Tokens each row generated: up to and including its first EOS, else all."""
    eos = set(eos if isinstance(eos, list) else [eos])
    counts = []
    for row in sequences[:, prompt_width:].tolist():
        counts.append(next((i + 1 for i, t in enumerate(row) if t in eos), len(row)))
    return counts


def accepted_per_step(stats) -> list[list[int]]:
    """[row][step] accepted draft tokens."""
    return [[s.accepted for s in row.steps] for row in stats.rows]


@pytest.mark.parametrize("family", FAMILIES)
def test_equal_to_batched_greedy_generate_row_by_row(family):
    target, drafts = pairs(family)
    pad = target.generation_config.pad_token_id
    for lengths in ([1, 14, 6], [9, 3, 12, 5]):
        ids, mask = padded(lengths, seed=len(lengths), pad=pad)
        ref = target.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False)
        for name, draft in drafts.items():
            out = spec(target, draft, ids, mask, max_new_tokens=20, nodes=8, threshold=0.1, max_depth=5)
            assert out.sequences.shape == ref.shape, (family, name, lengths)
            for b in range(len(lengths)):
                assert torch.equal(out.sequences[b], ref[b]), (family, name, lengths, b)
            assert len(out.stats.rows) == len(lengths)
            assert out.stats.new_tokens == sum(r.new_tokens for r in out.stats.rows)
            assert [r.new_tokens for r in out.stats.rows] == emitted(ref, ids.shape[1], target.generation_config.eos_token_id)


@pytest.mark.parametrize("family,attn,dtype", [
    ("llama", "eager", torch.bfloat16), ("opt", "sdpa", torch.bfloat16), ("gpt2", "eager", torch.float16),
], ids=str)
def test_half_precision_and_eager_batches(family, attn, dtype):
    """The additive row masks in half precision, with eager attention too (a bool mask went wrong
    there, DESIGN-NOTES), on a peaked target whose argmax margins dwarf half-precision rounding."""
    target = peaked(tiny_model(family, attn=attn, dtype=dtype), scale=30.0)
    drafts = [target, partly_agreeing(target), tiny_model(family, seed=1, attn=attn, dtype=torch.float32)]
    ids, mask = padded([2, 11, 6], seed=12, pad=target.generation_config.pad_token_id)
    ref = target.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False)
    for draft in drafts:
        out = spec(target, draft, ids, mask, max_new_tokens=16, nodes=8, threshold=0.0)
        assert torch.equal(out.sequences, ref), draft.dtype


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_squeezing_the_holes_out_every_step_changes_nothing(family, monkeypatch):
    """Compaction (kv_cache.compact_rows) moves every row's slots; positions and masks follow."""
    monkeypatch.setattr(slots_module.kv_cache, "COMPACT_MIN_HOLES", 0)
    monkeypatch.setattr(slots_module.kv_cache, "COMPACT_SHARE", 0.0)
    calls = []
    real = slots_module.kv_cache.compact_rows
    monkeypatch.setattr(slots_module.kv_cache, "compact_rows", lambda cache, valid: calls.append(1) or real(cache, valid))
    target, drafts = pairs(family)
    ids, mask = padded([1, 14, 6, 9], seed=13, pad=target.generation_config.pad_token_id)
    ref = target.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False)
    for draft in drafts.values():
        out = spec(target, draft, ids, mask, max_new_tokens=20, nodes=8, threshold=0.0)
        assert torch.equal(out.sequences, ref)
    assert calls


def test_rows_accept_their_own_numbers_of_tokens():
    """With a draft that agrees on some tokens only, rows accept very different amounts, even
    within one step (the holes of the rows that accepted fewer are masked)."""
    target, drafts = pairs("llama")
    ids, mask = padded([4, 13, 8, 2], seed=5)
    ref = target.generate(ids, attention_mask=mask, max_new_tokens=30, do_sample=False)
    out = spec(target, drafts["partly"], ids, mask, max_new_tokens=30, nodes=10, threshold=0.0, max_depth=6)
    assert torch.equal(out.sequences, ref)
    taus = [row.mean_accepted_tokens for row in out.stats.rows]
    assert max(taus) > 1.5 * min(taus), taus
    per_step = accepted_per_step(out.stats)
    steps = min(map(len, per_step))
    assert any(len({row[s] for row in per_step}) > 1 for s in range(steps))  # rows differed within a step
    # τ of the batch: tokens of all rows per verification forward
    assert out.stats.mean_accepted_tokens == pytest.approx(out.stats.new_tokens / len(out.stats.steps))
    counts = emitted(ref, ids.shape[1], target.generation_config.eos_token_id)
    assert [sum(row.accept_lengths) for row in out.stats.rows] == [row.new_tokens for row in out.stats.rows] == counts


@pytest.mark.parametrize("verifier,strategy", [("rrs", "opt"), ("traversal", "sampled"), ("match", "heap"),
                                               ("match", "chain")])
def test_every_verifier_and_strategy_stays_greedy(verifier, strategy):
    target, drafts = pairs("qwen2")
    ids, mask = padded([3, 10, 6], seed=2)
    ref = target.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False)
    for draft in (drafts["partly"], drafts["unrelated"]):
        out = spec(target, draft, ids, mask, max_new_tokens=16, nodes=8, threshold=0.0, max_depth=4,
                   verifier=verifier, strategy=strategy)
        assert torch.equal(out.sequences, ref), (verifier, strategy)


def eos_for_one_row(target, ids, mask, row, at=3):
    """A token that first appears in row ``row``'s free output at index >= ``at`` and not in the
    other rows' outputs before that index (so that row finishes first)."""
    free = target.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False)[:, ids.shape[1]:]
    for i in range(at, 12):
        token = int(free[row, i])
        if token not in free[row, :i].tolist() and all(token not in free[b, :i + 4].tolist()
                                                        for b in range(len(free)) if b != row):
            return token
    pytest.skip("no suitable EOS token in this output")


class BatchSizes:
    """A forward pre-hook recording the batch size of every target forward."""

    def __init__(self, model):
        self.sizes = []
        self.handle = model.register_forward_pre_hook(lambda m, args, kwargs: self.sizes.append(
            kwargs["input_ids"].shape[0]), with_kwargs=True)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_eos_in_one_row_early_pads_it_and_drops_it(family):
    target, drafts = pairs(family)
    ids, mask = padded([5, 11, 3], seed=7, pad=target.generation_config.pad_token_id)
    eos = eos_for_one_row(target, ids, mask, row=1)
    ref = target.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False, eos_token_id=eos)
    pad = target.generation_config.pad_token_id
    for name, draft in drafts.items():
        sizes = BatchSizes(target)
        out = spec(target, draft, ids, mask, max_new_tokens=20, eos_token_id=eos, nodes=8, threshold=0.0, max_depth=6)
        sizes.handle.remove()
        assert torch.equal(out.sequences, ref), (family, name)
        new = out.sequences[1, ids.shape[1]:].tolist()
        end = new.index(eos)
        assert end < 12 and set(new[end + 1:]) <= {pad}  # padded after EOS, as generate() does
        assert out.stats.rows[1].new_tokens == end + 1
        # the finished row left the batch: the target's forwards after its last step are smaller
        last = len(out.stats.rows[1].steps)  # row 1 took part in steps 0 … last - 1
        assert last < len(out.stats.steps)
        assert out.stats.steps[last - 1].rows == 3 and out.stats.steps[last].rows < 3
        if draft is not target:  # (the agreeing draft IS the target: its forwards are recorded too)
            assert sizes.sizes[0] == 3 and sizes.sizes[1 + last] < 3  # (sizes[0]: the prefill)


def test_all_rows_stop_at_eos_at_different_steps():
    target, drafts = pairs("llama")
    ids, mask = padded([6, 2, 9], seed=11)
    free = target.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False)[:, ids.shape[1]:]
    eos = [int(free[0, 4]), int(free[1, 9]), int(free[2, 14])]  # several EOS ids: each row meets one
    ref = target.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False, eos_token_id=eos)
    for draft in drafts.values():
        out = spec(target, draft, ids, mask, max_new_tokens=24, eos_token_id=eos, nodes=8, threshold=0.0)
        assert torch.equal(out.sequences, ref)


@pytest.mark.parametrize("max_new_tokens", [1, 2, 5])
def test_max_new_tokens_hit_exactly(max_new_tokens):
    target, drafts = pairs("opt")
    ids, mask = padded([7, 2], seed=3, pad=target.generation_config.pad_token_id)
    ref = target.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False)
    for draft in drafts.values():
        out = spec(target, draft, ids, mask, max_new_tokens=max_new_tokens, nodes=10, threshold=0.0, max_depth=8)
        assert out.sequences.shape == (2, ids.shape[1] + max_new_tokens)
        assert torch.equal(out.sequences, ref)


def test_a_padded_single_prompt_and_the_other_entry_points():
    target, drafts = pairs("gemma")
    ids, mask = padded([4, 9], seed=4)
    one_ids, one_mask = ids[:1], mask[:1]  # a batch of one, padded
    ref = target.generate(one_ids, attention_mask=one_mask, max_new_tokens=12, do_sample=False)
    assert torch.equal(spec(target, drafts["partly"], one_ids, one_mask, max_new_tokens=12).sequences, ref)
    ref = target.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False)
    model = speculative(target)
    out = model.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False, draft_model=drafts["partly"],
                         nodes=6)
    assert torch.equal(out, ref)



@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma3 windowed"])
def test_one_prompt_decodes_alike_as_a_batch_of_one(family, monkeypatch):
    """Batch 1 is the rows' layout with its one declared switch off (slots.Slots.holes: no padding, no
    other row). Declaring holes for one unpadded prompt runs it as a batch of one (its own slots
    recorded, its path kept by keep_row_slots, its masks by batch_verification_inputs): the same tokens
    and logits as without, and as plain generate(), so the two cannot drift apart below the loop.
    Controls: the switch is off by default and on where declared."""
    from models import windowed_model

    if family == "gemma3 windowed":  # one row's cache keeps only the window without holes, every slot with
        target = peaked(windowed_model("gemma3", 8), 30.0)
        drafts = [target, windowed_model("gemma3", 8, seed=1)]
    else:
        target = peaked(tiny_model(family, seed=0), scale=30.0)
        target.generation_config.eos_token_id = None  # every run goes the whole length
        drafts = [target, partly_agreeing(target)]
    ids = torch.randint(3, 90, (1, 11), generator=torch.Generator().manual_seed(3))
    kw = dict(max_new_tokens=24, do_sample=False, output_logits=True, return_dict_in_generate=True)
    plain = target.generate(ids, **kw)
    of, made = slots_module.Slots.of.__func__, []

    def recorded(cls, mask, padding, layout, kv_len, holes, forced=False):
        made.append(of(cls, mask, padding, layout, kv_len, holes or forced))
        return made[-1]

    def run(draft):
        return target.generate(ids, custom_generate=speculative_generate, draft_model=draft, nodes=8, threshold=0.0,
                               **kw)

    monkeypatch.setattr(slots_module.Slots, "of", classmethod(recorded))
    alone = [run(draft) for draft in drafts]
    assert [slots.holes for slots in made] == [False] * len(drafts)
    monkeypatch.setattr(slots_module.Slots, "of", classmethod(lambda *a, **k: recorded(*a, **k, forced=True)))
    as_batch = [run(draft) for draft in drafts]
    assert [slots.holes for slots in made[len(drafts):]] == [True] * len(drafts)
    for one, batch in zip(alone, as_batch):
        assert torch.equal(one.sequences, plain.sequences) and torch.equal(batch.sequences, plain.sequences)
        assert max(float((a - b).abs().max()) for a, b in zip(one.logits, batch.logits)) < 1e-4


class StopAfter(StoppingCriteria):
    def __init__(self, token):
        self.token = token

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, -1] == self.token


def test_without_eos_rows_go_on_until_all_have_stopped():
    """generate() pads finished rows only when it has an EOS criterion; without one, a row whose
    criteria fired keeps its real tokens until every row has stopped."""
    target, drafts = pairs("llama")
    target.generation_config.eos_token_id = None
    ids, mask = padded([5, 8], seed=1)
    free = target.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False)[:, ids.shape[1]:]
    stop = next(int(t) for t in free[0, 2:] if int(t) not in free[1, :6].tolist())
    criteria = StoppingCriteriaList([StopAfter(stop)])
    ref = target.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False, stopping_criteria=criteria)
    for draft in drafts.values():
        out = spec(target, draft, ids, mask, max_new_tokens=20, stopping_criteria=criteria, nodes=8, threshold=0.0)
        assert torch.equal(out.sequences, ref)


# ---------------------------------------------------------------------------------------------
# negative controls: the equality test catches a misaligned row


def test_positions_that_count_the_padding_are_caught(monkeypatch):
    """Positions must count only a row's own tokens: taking the shared cache length as every root's
    position (the batch-1 rule, which counts padding and holes) changes the padded row's output,
    and the equality check fails."""
    target = tiny_model("gpt2")  # learned absolute positions, not peaked: positions matter
    target.generation_config.eos_token_id = None
    ids, mask = padded([3, 14], seed=6, pad=target.generation_config.pad_token_id)
    ref = target.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False)
    draft = partly_agreeing(target)
    assert torch.equal(spec(target, draft, ids, mask, max_new_tokens=16, nodes=8, threshold=0.0).sequences, ref)
    real = inputs_module.batch_verification_inputs
    monkeypatch.setattr(inputs_module, "batch_verification_inputs", lambda roots, trees, positions, visible, dtype, **kw:
                        real(roots, trees, torch.full_like(positions, visible.shape[1]), visible, dtype, **kw))
    out = spec(target, draft, ids, mask, max_new_tokens=16, nodes=8, threshold=0.0)
    assert not torch.equal(out.sequences[0], ref[0])


def test_visible_holes_and_padding_are_caught(monkeypatch):
    """Each row must hide the others' slots: letting every row see every cached slot (padding and
    the holes left where another row accepted more) changes the output."""
    target, drafts = pairs("llama")
    ids, mask = padded([2, 12, 5], seed=8)
    ref = target.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False)
    real = inputs_module.batch_verification_inputs
    monkeypatch.setattr(inputs_module, "batch_verification_inputs",
                        lambda roots, trees, pos, visible, dtype, **kw: real(roots, trees, pos, torch.ones_like(visible), dtype,
                                                                             **kw))
    out = spec(target, drafts["partly"], ids, mask, max_new_tokens=20, nodes=8, threshold=0.0)
    assert not torch.equal(out.sequences, ref)


# ---------------------------------------------------------------------------------------------
# sampling: each row's first tokens follow the target's own law


@pytest.mark.parametrize("verifier,strategy,drafter", [
    ("traversal", "sampled", "model"),
    ("rrs", "sampled", "model"),
    ("match", "opt", "model"),
    ("match", "opt", "head"),  # one feature-head drafter per row (PerRow)
])
def test_sampling_keeps_each_rows_law(verifier, strategy, drafter):
    from test_sampling import VOCAB, chi_square, lm_law, tiny_lm
    from opttree.hf import kv_cache
    from opttree.loop.generation import speculative_decode
    from opttree.loop.settings import DecodeSettings
    from opttree.drafters.batch_model import BatchModelDrafter
    from opttree.verify.sampling import draft_to_probs
    from transformers import MaxLengthCriteria

    target, draft = tiny_lm(0, scale=12.0), tiny_lm(5, scale=12.0)
    procs = LogitsProcessorList([TemperatureLogitsWarper(0.8)])
    def law(prompt):  # the target's exact law of its first two tokens
        first = lm_law(target, procs, prompt)
        return {(a, b): float(first[a]) * float(lm_law(target, procs, prompt + [a])[b])
                for a in range(VOCAB) for b in range(VOCAB)}

    def distance(p, q):
        return sum(abs(p[k] - q[k]) for k in p)

    laws = [law([3, 7, 1])]
    # the one-token prompt whose law is farthest from row 0's, so that swapped rows are caught
    second = max(range(VOCAB), key=lambda t: distance(laws[0], law([t])))
    laws.append(law([second]))
    ids = torch.tensor([[3, 7, 1], [0, 0, second]])  # left-padded
    mask = torch.tensor([[1, 1, 1], [0, 0, 1]])
    config = TreeConfig(nodes=6, max_depth=3, threshold=0.0, strategy=strategy, verifier=verifier)
    if drafter == "head":
        from opttree.distill.train.head import new_head
        from opttree.drafters.base import PerRow
        from opttree.drafters.head.feature_head import FeatureHeadDrafter

        head = new_head(target)[0]
    stop = StoppingCriteriaList([MaxLengthCriteria(max_length=ids.shape[1] + 2)])
    g = torch.Generator().manual_seed(0)
    counts, n, steps = [Counter(), Counter()], 500, 0
    with torch.inference_mode():
        for _ in range(n):
            if drafter == "head":
                rows = PerRow([FeatureHeadDrafter(head, draft_to_probs(procs)) for _ in range(2)])
            else:
                rows = BatchModelDrafter(draft, draft_to_probs(procs), rows=2)
            settings = DecodeSettings(config, procs, stop, max_length=ids.shape[1] + 2, context_length=64,
                                      pad_token_id=0, do_sample=True, generator=g)
            result = speculative_decode(target, rows, ids, kv_cache.new_cache(target), settings, attention_mask=mask)
            for b in range(2):
                counts[b][tuple(result.sequences[b, ids.shape[1]:].tolist())] += 1
            steps += len(result.stats.steps)
    for b in range(2):
        stat, critical = chi_square(counts[b], laws[b], n)
        assert stat < critical, (b, stat, critical)
    # a row-swapped law fails the same test (the rows' laws differ enough to tell them apart)
    stat, critical = chi_square(counts[0], laws[1], n)
    assert stat > critical


def test_sampling_is_reproducible_and_rows_differ():
    target, drafts = pairs("llama")
    ids, mask = padded([3, 8], seed=9)
    kw = dict(max_new_tokens=12, do_sample=True, temperature=1.5, custom_generate=speculative_generate,
              draft_model=drafts["partly"], nodes=6, attention_mask=mask)
    runs = [target.generate(ids, generator=torch.Generator().manual_seed(s), **kw) for s in (1, 1, 2)]
    assert torch.equal(runs[0], runs[1])
    assert not torch.equal(runs[0], runs[2])
    # num_return_sequences: generate() repeats the prompt into a batch, each row samples its own
    out = target.generate(ids[:1, -3:], max_new_tokens=12, do_sample=True, temperature=1.5, num_return_sequences=3,
                          custom_generate=speculative_generate, draft_model=drafts["partly"], nodes=6,
                          generator=torch.Generator().manual_seed(0))
    assert out.shape == (3, 15) and len({tuple(row) for row in out[:, 3:].tolist()}) > 1


# ---------------------------------------------------------------------------------------------
# the lockstep that lets the rows' tree builders share draft forwards


def test_lockstep_batches_every_round_and_drops_finished_tasks():
    from opttree.loop.lockstep import run_in_lockstep

    rounds = []

    def task(row, layers):
        answers = []
        for layer in range(layers):
            answers.append((yield (row, layer)))
        return answers

    def answer_all(requests):
        rounds.append(list(requests))
        return [None if request is None else f"{request[0]}:{request[1]}" for request in requests]

    results = run_in_lockstep([task(0, 2), task(1, 0), task(2, 3)], answer_all)
    assert results == [["0:0", "0:1"], [], ["2:0", "2:1", "2:2"]]
    # one call per round, in row order; a row that has returned asks nothing
    assert rounds == [[(0, 0), None, (2, 0)], [(0, 1), None, (2, 1)], [None, None, (2, 2)]]


def test_lockstep_reraises_a_failing_task_and_ends_the_others():
    import threading

    from opttree.loop.lockstep import run_in_lockstep

    ended = []

    def waits_forever(name):
        try:
            while True:
                yield "again"
        finally:
            ended.append(name)

    def fails():
        yield "once"
        raise RuntimeError("boom")

    before = threading.active_count()
    with pytest.raises(RuntimeError, match="boom"):
        run_in_lockstep([waits_forever("a"), fails(), waits_forever("b")], lambda requests: [None] * len(requests))
    assert sorted(ended) == ["a", "b"]  # every waiting task was closed
    assert threading.active_count() <= before


# ---------------------------------------------------------------------------------------------
# pieces


def test_batch_verification_inputs_pad_trees_with_dummies_and_hide_other_slots():
    from opttree import DraftTree
    from opttree.tree.masks import batch_verification_inputs

    small = DraftTree(torch.tensor([7]), torch.tensor([-1]), torch.tensor([0.5]))
    big = DraftTree(torch.tensor([4, 5, 6]), torch.tensor([-1, 0, -1]), torch.tensor([0.6, 0.3, 0.2]))
    valid = torch.tensor([[False, True, True, False], [True, True, True, True]])  # [2, 4]: padding, a hole
    inputs = batch_verification_inputs(torch.tensor([9, 8]), [small, big], valid.sum(1), valid, torch.float32)
    assert inputs.input_ids.tolist() == [[9, 7, 9, 9], [8, 4, 5, 6]]  # dummies carry the root token
    assert inputs.position_ids.tolist() == [[2, 3, 2, 2], [4, 5, 6, 5]]  # own token count + depth
    assert inputs.cache_position.tolist() == [4, 5, 6, 7]  # shared slots
    seen = inputs.attention_mask[:, 0] == 0  # [2, 4, 8]
    assert seen[0].int().tolist() == [[0, 1, 1, 0, 1, 0, 0, 0],   # root
                                      [0, 1, 1, 0, 1, 1, 0, 0],   # node 0
                                      [0, 1, 1, 0, 0, 0, 1, 0],   # dummy: prefix and itself
                                      [0, 1, 1, 0, 0, 0, 0, 1]]
    assert seen[1, 2].int().tolist() == [1, 1, 1, 1, 1, 1, 1, 0]  # node 1 under node 0


def test_keep_row_slots_moves_each_rows_path_to_the_front():
    from transformers import DynamicCache

    from opttree.hf import kv_cache

    cache = DynamicCache()
    keys = torch.arange(2 * 6, dtype=torch.float32).view(2, 1, 6, 1)  # [B, H, slots, D]: value = slot id
    cache.update(keys, keys.clone(), 0)
    kv_cache.keep_row_slots(cache, 2, torch.tensor([[2, 5], [3, 3]]))  # row 0 keeps 2 slots, row 1 one
    assert cache.get_seq_length() == 4
    assert cache.layers[0].keys[:, 0, :, 0].tolist() == [[0, 1, 2, 5], [6, 7, 9, 9]]  # row 1: a hole at the end
    kv_cache.select(cache, torch.tensor([1]), torch.tensor([0, 2]))
    assert cache.layers[0].keys[:, 0, :, 0].tolist() == [[6, 9]]


def test_compact_rows_right_aligns_each_rows_slots():
    from transformers import DynamicCache

    from opttree.hf import kv_cache

    cache = DynamicCache()
    keys = torch.arange(2 * 5, dtype=torch.float32).view(2, 1, 5, 1)  # value = slot id
    cache.update(keys, keys.clone(), 0)
    valid = torch.tensor([[False, True, False, True, True], [True, False, True, False, False]])
    order = kv_cache.compact_rows(cache, valid)  # where each kept slot came from
    assert order[0].tolist() == [1, 3, 4] and order[1, 1:].tolist() == [0, 2]  # (row 1's first: a hole)
    assert valid.gather(1, order).tolist() == [[True, True, True], [False, True, True]]
    assert cache.layers[0].keys[:, 0, :, 0].tolist()[0] == [1, 3, 4]
    assert cache.layers[0].keys[:, 0, 1:, 0].tolist()[1] == [5, 7]  # (its first slot: a hole)
    assert cache.get_seq_length() == 3


# ---------------------------------------------------------------------------------------------
# a prompt that holds the pad token's id: generate() masks it out where no mask is given


@pytest.mark.parametrize("family, where", [("llama", [3]), ("llama", [0, 4]), ("gemma", [2, 5]), ("gpt2", [4])])
def test_a_single_prompt_holding_the_pad_id_runs_as_plain(family, where):
    """One unpadded prompt with the pad id inside it (before: refused as "needs LEFT padding"). plain
    generate() infers a mask that hides those tokens; opttree hides them too, and places the rest by the
    mask as plain does. Negative control: the same prompt with nothing hidden gives other tokens."""
    from test_contract import ways

    target = peaked(tiny_model(family), 30.0)
    target.generation_config.eos_token_id = None
    pad = target.generation_config.pad_token_id
    ids = torch.randint(3, 90, (1, 9), generator=torch.Generator().manual_seed(5))
    ids[0, where] = pad
    kw = dict(max_new_tokens=16, do_sample=False, output_logits=True, return_dict_in_generate=True)
    plain = target.generate(ids, **kw)
    unhidden = target.generate(ids, attention_mask=torch.ones_like(ids), **kw)

    def gap(out) -> float:  # the largest logit difference from plain's, relative to plain's largest logit
        scale = max(float(b.abs().max()) for b in plain.logits)
        return max(float((a - b).abs().max()) for a, b in zip(out.logits, plain.logits)) / scale

    assert gap(unhidden) > 1e-4  # the hidden tokens matter (ten times the tolerance below; gemma: 4e-4)
    for way, run in ways(target, partly_agreeing(target)).items():
        out = run(input_ids=ids, nodes=8, threshold=0.0, **kw)
        assert torch.equal(out.sequences, plain.sequences) and gap(out) < 1e-5, way


def test_a_pad_id_inside_a_prompt_past_a_sliding_window(monkeypatch):
    """The window counts the hidden tokens' slots, as plain's cache does (a token's index in the row, not
    its rotary position): exact past the window too. Negative control: windows counted in rotary
    positions leave plain's logits."""
    from models import windowed_model

    target = peaked(windowed_model("gemma3", 8), 30.0)
    ids = torch.randint(3, 90, (1, 12), generator=torch.Generator().manual_seed(5))
    ids[0, [2, 9]] = target.generation_config.pad_token_id
    kw = dict(max_new_tokens=30, do_sample=False, output_logits=True, return_dict_in_generate=True)
    plain = target.generate(ids, **kw)

    def gap(out) -> float:
        scale = max(float(b.abs().max()) for b in plain.logits)
        return max(float((a - b).abs().max()) for a, b in zip(out.logits, plain.logits)) / scale

    def run(draft):
        return target.generate(ids, custom_generate=speculative_generate, draft_model=draft, nodes=8, threshold=0.0,
                               **kw)

    for draft in (target, windowed_model("gemma3", 8, seed=1)):
        out = run(draft)
        assert torch.equal(out.sequences, plain.sequences) and gap(out) < 1e-5
    of = slots_module.Slots.of.__func__

    def by_position(cls, mask, padding, layout, kv_len, holes):
        slots = of(cls, mask, padding, layout, kv_len, holes)
        slots.index = mask[:, :-1].long().cumsum(1) - 1
        return slots

    monkeypatch.setattr(rows_module.Row, "root_index", property(lambda row: row.root_position))
    monkeypatch.setattr(rows_module.Row, "root_position",
                        property(lambda row: len(row.sequence) - row.pad - 1 - row.hidden))
    monkeypatch.setattr(slots_module.Slots, "of", classmethod(by_position))
    assert gap(run(target)) > 1e-3


def test_a_prompt_ending_with_the_pad_id_is_refused_with_a_fix_that_works():
    target = peaked(tiny_model("llama"), 30.0)
    target.generation_config.eos_token_id = None
    ids = torch.randint(3, 90, (1, 7), generator=torch.Generator().manual_seed(1))
    ids[0, -1] = target.generation_config.pad_token_id
    kw = dict(max_new_tokens=8, do_sample=False, custom_generate=speculative_generate, draft_model=target, nodes=4)
    with pytest.raises(ValueError, match=r"attention_mask=torch.ones_like\(input_ids\)"):
        target.generate(ids, **kw)
    mask = torch.ones_like(ids)  # the fix
    assert torch.equal(target.generate(ids, attention_mask=mask, **kw),
                       target.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False))
