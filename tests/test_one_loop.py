"""One decoding loop for every batch size, behind the declared Drafter interface: every drafter,
``nodes="auto"`` and ``output_scores``/``output_logits`` at batch 1, 2 and 4, equal row by row
to the target's own (batched) greedy generate(); a drafter written from the docs alone works."""

from __future__ import annotations

import textwrap

import pytest
import torch
from transformers import LogitsProcessorList, TemperatureLogitsWarper

from models import partly_agreeing, peaked, tiny_model
from opttree import speculative_generate
from opttree.distill.train.head import new_head
from opttree.drafters import Drafter, MixedDrafter, ModelDrafter, base, make_drafter
from opttree.drafters.base import PerRow
from opttree.drafters.batch_model import BatchModelDrafter
from opttree.verify.sampling import draft_to_probs
from test_batch import padded

LENGTHS = {1: [7], 2: [7, 3], 4: [5, 9, 2, 6]}


def prompts(batch: int, seed: int = 0, pad: int = 0):
    """Left-padded prompts: (input_ids [B, T], attention_mask [B, T] or None for one prompt)."""
    ids, mask = padded(LENGTHS[batch], seed=seed, pad=pad)
    return ids, (None if batch == 1 else mask)


def docs_example() -> type:
    """The drafter that opttree.drafters.base's docstring shows, run as written there."""
    text = base.__doc__.split("::\n", 1)[1]
    code = textwrap.dedent(text.split("\n\n    model.generate", 1)[0])
    scope = {"Drafter": Drafter}
    exec(code, scope)
    return scope["Unigram"]


Unigram = docs_example()


class LastTokenEcho(Drafter):
    """A user's drafter WITH per-call state (the committed text): each batch row needs its own."""

    def __init__(self, vocab: int):
        self.vocab = vocab
        self.seen: list[int] = []
        self.forwards = 0

    def bind(self, target, to_probs):
        return LastTokenEcho(self.vocab)

    def root_probs(self, sequence):
        self.seen = sequence.tolist()
        self.forwards += 1
        return self._after(self.seen[-1], sequence.device)

    def expand(self, pool, frontier):
        tokens = pool.tokens[frontier].tolist()
        return torch.stack([self._after(t, pool.tokens.device) for t in tokens])

    def commit(self, accepted_pool_ids):
        pass

    def _after(self, token: int, device) -> torch.Tensor:  # "the token that followed it last time"
        probs = torch.full((self.vocab,), 1e-3, device=device)
        follows = [b for a, b in zip(self.seen, self.seen[1:]) if a == token]
        probs[follows[-1] if follows else token] = 1.0
        return probs / probs.sum()


def drafts(target):
    head = new_head(target, init_layer=0)[0]
    vocab = target.config.vocab_size
    return {
        "model": partly_agreeing(target),
        "head": head,
        "prompt_lookup": "prompt_lookup",
        "mixed": MixedDrafter(head),
        "user": Unigram(torch.softmax(torch.randn(vocab, generator=torch.Generator().manual_seed(3)), -1)),
        "user_stateful": LastTokenEcho(vocab),
    }


def run(target, draft, ids, mask, **kw):
    return target.generate(ids, attention_mask=mask, do_sample=False, custom_generate=speculative_generate,
                           draft_model=draft, return_dict_in_generate=True, **kw)


@pytest.mark.parametrize("batch", [1, 2, 4])
@pytest.mark.parametrize("kind", ["model", "head", "prompt_lookup", "mixed", "user", "user_stateful"])
def test_every_drafter_at_every_batch_size_equals_generate_row_by_row(kind, batch):
    target = peaked(tiny_model("llama", seed=0), scale=30.0)
    draft = drafts(target)[kind]
    ids, mask = prompts(batch, seed=batch, pad=target.generation_config.pad_token_id or 0)
    ref = target.generate(ids, attention_mask=mask, max_new_tokens=14, do_sample=False)
    out = run(target, draft, ids, mask, max_new_tokens=14, nodes=6, threshold=0.0)
    assert torch.equal(out.sequences, ref), kind
    if batch > 1:
        assert len(out.stats.rows) == batch
        assert sum(r.new_tokens for r in out.stats.rows) == out.stats.new_tokens


@pytest.mark.parametrize("batch", [1, 2, 4])
@pytest.mark.parametrize("kind", ["model", "mixed"])
def test_auto_at_every_batch_size(kind, batch):
    target = peaked(tiny_model("llama", seed=0), scale=30.0)
    draft = drafts(target)[kind]
    ids, mask = prompts(batch, seed=10 + batch, pad=target.generation_config.pad_token_id or 0)
    ref = target.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False)
    out = run(target, draft, ids, mask, max_new_tokens=12, nodes="auto", threshold="auto")
    assert torch.equal(out.sequences, ref)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_scores_and_logits_per_row_equal_generates(family):
    """No EOS, so no row finishes early: every [B, vocab] entry is comparable with generate()'s."""
    target = peaked(tiny_model(family, seed=0), scale=30.0)
    target.generation_config.eos_token_id = None
    ids, mask = prompts(2, seed=4, pad=target.generation_config.pad_token_id or 0)
    kw = dict(max_new_tokens=10, output_scores=True, output_logits=True, return_dict_in_generate=True)
    ref = target.generate(ids, attention_mask=mask, do_sample=False, **kw)
    for draft in (partly_agreeing(target), new_head(target)[0]):
        out = target.generate(ids, attention_mask=mask, do_sample=False, custom_generate=speculative_generate,
                              draft_model=draft, nodes=6, threshold=0.0, **kw)
        assert torch.equal(out.sequences, ref.sequences)
        assert len(out.scores) == len(ref.scores) == len(out.logits) == 10
        for mine, theirs in zip(out.scores + out.logits, ref.scores + ref.logits):
            assert mine.shape == theirs.shape == (2, target.config.vocab_size)
            torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-4)


def test_a_row_that_finished_early_has_nan_scores_after_its_end():
    target = peaked(tiny_model("llama", seed=0), scale=30.0)
    ids, mask = prompts(2, seed=4)
    ref = target.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False)
    eos = int(ref[0, ids.shape[1] + 1])  # row 0 ends after its second new token
    target.generation_config.eos_token_id = eos
    target.generation_config.pad_token_id = 0
    out = run(target, partly_agreeing(target), ids, mask, max_new_tokens=12, nodes=6, threshold=0.0,
              output_scores=True)
    assert torch.equal(out.sequences, target.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False))
    if out.sequences.shape[1] - ids.shape[1] > 2:  # row 1 went on
        assert torch.isnan(out.scores[2][0]).all() and not torch.isnan(out.scores[2][1]).any()


def test_per_row_stats_split_the_shared_phases():
    target = peaked(tiny_model("llama", seed=0), scale=30.0)
    ids, mask = prompts(2, seed=5)
    out = run(target, partly_agreeing(target), ids, mask, max_new_tokens=8, nodes=6, threshold=0.0)
    first = out.stats.steps[0]
    rows = [r.steps[0] for r in out.stats.rows]
    assert first.rows == 2
    assert sum(r.draft_seconds for r in rows) == pytest.approx(first.draft_seconds)
    assert sum(r.verify_seconds for r in rows) == pytest.approx(first.verify_seconds)
    assert first.accepted == sum(r.accepted for r in rows)


def test_rows_view_per_drafter():
    target = tiny_model("llama", seed=0)
    model = make_drafter(partly_agreeing(target), target)
    assert isinstance(model.rows(1), PerRow) and model.rows(1).drafters == [model]
    assert isinstance(model.rows(3), BatchModelDrafter)  # one draft forward per layer for all rows
    head = make_drafter(new_head(target)[0], target)
    rows = head.rows(3)
    assert isinstance(rows, PerRow) and len({id(d) for d in rows.drafters}) == 3
    assert all(d.head is head.head for d in rows.drafters)  # fresh state, the same weights


def test_a_drafter_that_does_not_subclass_drafter_is_refused_with_the_fix():
    class Duck:
        def root_probs(self, sequence): ...
        def expand(self, pool, frontier): ...
        def commit(self, ids): ...

    target = tiny_model("llama", seed=0)
    with pytest.raises(TypeError, match="must subclass Drafter"):
        run(target, Duck(), torch.tensor([[3, 4, 5]]), None, max_new_tokens=3, nodes=4)


def test_sampling_warpers_reach_every_model_inside_a_mixed_drafter():
    """bind() hands generate()'s warpers to the drafter: a MixedDrafter's model drafter builds its
    sampled trees from the warped q (before: unwarped, only ModelDrafter/FeatureHeadDrafter got them)."""
    target = tiny_model("llama", seed=0)
    to_probs = draft_to_probs(LogitsProcessorList([TemperatureLogitsWarper(0.5)]))
    head = new_head(target)[0]
    for inner in (partly_agreeing(target), head):
        mixed = make_drafter(MixedDrafter(inner), target, to_probs)
        assert mixed.model_drafter.to_probs is to_probs
    assert make_drafter(MixedDrafter(head), target, None).model_drafter.to_probs is None  # greedy: plain softmax
    assert isinstance(make_drafter(partly_agreeing(target), target, to_probs), ModelDrafter)


def test_each_drafter_declares_the_modules_it_runs():
    from models import tiny_model
    from opttree.distill.train.head import new_head
    from opttree.drafters import MixedDrafter
    from opttree.drafters.make import make_drafter

    target, draft = tiny_model("llama", seed=0), tiny_model("llama", seed=1)
    head, _ = new_head(target)
    assert make_drafter(draft, target, None).modules() == [draft]
    assert make_drafter(head, target, None).modules() == [head]
    assert make_drafter("prompt_lookup", target, None).modules() == []
    assert make_drafter(MixedDrafter(head), target, None).modules() == [head]
