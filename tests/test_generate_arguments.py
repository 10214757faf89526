"""Issue 35's table, row by row: arguments that were dropped in silence or broke deep inside, now
honoured (output equal to plain generate()'s; sampled: inside each row's own law) or refused by name.
Each row has its negative control: the old behaviour (monkeypatched back) gives another output or the
old error, or plain's output really depends on the argument."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers as tf

from models import peaked, tiny_model
from opttree import SpeculativeGenerator, speculative, speculative_generate
from opttree.loop import generation
from opttree.loop.model_inputs import ModelInputs
from test_api import CharTokenizer
from test_batch import padded
from test_contract import ways


def spec(target, draft, **kw):
    return target.generate(custom_generate=speculative_generate, draft_model=draft, nodes=6, threshold=0.0,
                           max_depth=4, **kw)


def row_alone(monkeypatch):
    """The old behaviour: every row's processors called on the row alone ([1, L], batch index 0)."""
    monkeypatch.setattr(generation, "processing",
                        lambda processors, rows, pad: lambda b, own, scores: processors(own[None], scores[None])[0])


def batch(family, lengths=(3, 9, 5), seed=1):
    target = peaked(tiny_model(family, seed=0), scale=30.0)
    ids, mask = padded(list(lengths), seed=seed, pad=target.generation_config.pad_token_id)
    return target, tiny_model(family, seed=1), ids, mask


# ---------------------------------------------------------------------------------------------
# prefix_allowed_tokens_fn with a batch: every row its own allowed set

ALLOWED = {0: range(10, 40), 1: range(40, 70), 2: range(62, 92)}


def allowed(batch_id: int, sentence: torch.Tensor) -> list[int]:
    return list(ALLOWED[batch_id % 3])


@pytest.mark.parametrize("family", ["llama", "gpt2", "qwen2"])
def test_prefix_allowed_tokens_fn_greedy_batch_equals_plain(family, monkeypatch):
    target, draft, ids, mask = batch(family)
    ref = target.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False, prefix_allowed_tokens_fn=allowed)
    for b in range(3):  # plain keeps every row in its own set
        assert set(ref[b, ids.shape[1]:].tolist()) <= set(ALLOWED[b])
    for d in (draft, target):
        out = spec(target, d, input_ids=ids, attention_mask=mask, max_new_tokens=10, do_sample=False,
                   prefix_allowed_tokens_fn=allowed)
        assert torch.equal(out, ref), (family, out, ref)
    row_alone(monkeypatch)  # negative control: issue 35's output, rows 1 and 2 in row 0's set
    out = spec(target, draft, input_ids=ids, attention_mask=mask, max_new_tokens=10, do_sample=False,
               prefix_allowed_tokens_fn=allowed)
    assert not torch.equal(out, ref)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("verifier", ["match", "rrs"])
def test_prefix_allowed_tokens_fn_sampled_draws_stay_in_each_rows_set(family, verifier, monkeypatch):
    """Sampling (not equal to plain's draws): every drawn token inside its row's set; with
    num_return_sequences=2 too, each row with the batch_id plain's own processor gives it (prompt
    r // 2 from transformers 5.2x, the row's own index before)."""
    target, draft, ids, mask = batch(family)
    target = tiny_model(family, seed=0)  # unsharpened: the draft's tokens often fall outside a row's set
    g = torch.Generator().manual_seed(0)
    for _ in range(4):
        out = spec(target, draft, input_ids=ids, attention_mask=mask, max_new_tokens=8, do_sample=True,
                   prefix_allowed_tokens_fn=allowed, verifier=verifier, generator=g, temperature=1.5)
        for b in range(3):
            assert set(out[b, ids.shape[1]:].tolist()) <= set(ALLOWED[b]), (b, out[b])
    two = spec(target, draft, input_ids=ids[:2], attention_mask=mask[:2], max_new_tokens=8, do_sample=True,
               num_return_sequences=2, prefix_allowed_tokens_fn=allowed, verifier=verifier, generator=g)
    seen = []  # the batch_id plain's processor gives each of the 4 rows in its first step, in row order
    target.generate(ids[:2], attention_mask=mask[:2], max_new_tokens=1, do_sample=True, num_return_sequences=2,
                    prefix_allowed_tokens_fn=lambda b, sentence: seen.append(b) or allowed(b, sentence))
    assert len(seen) == 4
    for r in range(4):
        assert set(two[r, ids.shape[1]:].tolist()) <= set(ALLOWED[seen[r] % 3]), (r, seen, two[r])
    row_alone(monkeypatch)  # negative control: issue 35 drew tokens outside their row's set
    outside = 0
    for _ in range(4):
        out = spec(target, draft, input_ids=ids, attention_mask=mask, max_new_tokens=8, do_sample=True,
                   prefix_allowed_tokens_fn=allowed, verifier=verifier, generator=g, temperature=1.5)
        outside += sum(len(set(out[b, ids.shape[1]:].tolist()) - set(ALLOWED[b])) for b in (1, 2))
    assert outside > 0


@pytest.mark.parametrize("verifier,strategy", [("match", "opt"), ("rrs", "sampled")])
def test_a_per_row_allowed_set_keeps_each_rows_law(verifier, strategy):
    """The first two sampled tokens of each of three left-padded rows follow plain's law for that row:
    the target's softmax (temperature 0.8) over the row's own allowed set (chi-square, 1e-6)."""
    from collections import Counter

    from test_sampling import VOCAB, chi_square, tiny_lm
    from opttree import TreeConfig
    from opttree.drafters.batch_model import BatchModelDrafter
    from opttree.hf import kv_cache
    from opttree.loop.generation import speculative_decode
    from opttree.loop.settings import DecodeSettings
    from opttree.verify.sampling import draft_to_probs

    target, draft = tiny_lm(0, scale=4.0), tiny_lm(5, scale=4.0)
    sets = {0: [0, 1, 2, 3, 4, 5, 6], 1: [3, 4, 5, 6, 7, 8, 9, 10, 11], 2: [0, 2, 4, 6, 8, 10]}
    procs = tf.LogitsProcessorList([tf.PrefixConstrainedLogitsProcessor(lambda b, sent: sets[b], 1),
                                    tf.TemperatureLogitsWarper(0.8)])
    prompts = [[3, 7, 1], [5], [9, 2]]

    def step_law(b, context):  # [VOCAB]: plain's law for row b after ``context``
        with torch.no_grad():
            logits = target(torch.tensor([context])).logits[0, -1].double() / 0.8
        masked = torch.full_like(logits, -float("inf"))
        masked[sets[b]] = logits[sets[b]]
        return torch.softmax(masked, -1)

    def law(b):
        first = step_law(b, prompts[b])
        return {(x, y): float(first[x]) * float(step_law(b, prompts[b] + [x])[y])
                for x in range(VOCAB) for y in range(VOCAB)}

    laws = [law(b) for b in range(3)]
    ids = torch.tensor([[3, 7, 1], [0, 0, 5], [0, 9, 2]])
    mask = torch.tensor([[1, 1, 1], [0, 0, 1], [0, 1, 1]])
    config = TreeConfig(nodes=6, max_depth=3, threshold=0.0, strategy=strategy, verifier=verifier)
    stop = tf.StoppingCriteriaList([tf.MaxLengthCriteria(max_length=5)])
    g = torch.Generator().manual_seed(0)
    counts, n = [Counter() for _ in range(3)], 400
    with torch.inference_mode():
        for _ in range(n):
            rows = BatchModelDrafter(draft, draft_to_probs(procs), rows=3)
            settings = DecodeSettings(config, procs, stop, max_length=5, context_length=64, pad_token_id=0,
                                      do_sample=True, generator=g)
            result = speculative_decode(target, rows, ids, kv_cache.new_cache(target), settings, attention_mask=mask)
            for b in range(3):
                counts[b][tuple(result.sequences[b, 3:].tolist())] += 1
    for b in range(3):
        assert set(x for pair in counts[b] for x in pair) <= set(sets[b])
        stat, critical = chi_square(counts[b], laws[b], n)
        assert stat < critical, (b, stat, critical)
    stat, critical = chi_square(counts[2], laws[0], n)  # another row's law fails
    assert stat > critical


def test_a_user_processor_with_batch_state_sees_each_row_at_its_index():
    """Any processor opttree does not know (a user's) gets the whole batch with row b at index b."""

    class PerRowBan(tf.LogitsProcessor):  # bans a different token in each row of the batch
        def __call__(self, input_ids, scores):
            scores = scores.clone()
            for b in range(input_ids.shape[0]):
                scores[b, int(input_ids[b, -1]) % 7 + 10 * b] = -float("inf")
            return scores

    target, draft, ids, mask = batch("llama")
    processors = tf.LogitsProcessorList([PerRowBan()])
    ref = target.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False, logits_processor=processors)
    out = spec(target, draft, input_ids=ids, attention_mask=mask, max_new_tokens=10, do_sample=False,
               logits_processor=processors)
    assert torch.equal(out, ref)


# ---------------------------------------------------------------------------------------------
# repetition_penalty with a left-padded batch: each row's prompt_ignore_length


@pytest.mark.parametrize("family", ["llama", "opt"])
def test_repetition_penalty_with_a_left_padded_batch(family, monkeypatch):
    target, draft, ids, mask = batch(family)
    ref = target.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False, repetition_penalty=1.5)
    out = spec(target, draft, input_ids=ids, attention_mask=mask, max_new_tokens=10, do_sample=False,
               repetition_penalty=1.5)
    assert torch.equal(out, ref)
    sampled = spec(target, draft, input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=True,
                   repetition_penalty=1.5, generator=torch.Generator().manual_seed(0))
    assert sampled.shape == (3, ids.shape[1] + 6)
    given = []  # what generate() builds its penalty with: per-row prompt_ignore_length from transformers 5.2x
    with monkeypatch.context() as m:
        real = tf.RepetitionPenaltyLogitsProcessor.__init__
        m.setattr(tf.RepetitionPenaltyLogitsProcessor, "__init__",
                  lambda self, penalty, prompt_ignore_length=None: given.append(prompt_ignore_length)
                  or real(self, penalty, prompt_ignore_length))
        target.generate(ids, attention_mask=mask, max_new_tokens=1, do_sample=False, repetition_penalty=1.5)
    if isinstance(given[0], torch.Tensor):  # per-row state: issue 35's error without the batch context
        row_alone(monkeypatch)  # negative control
        with pytest.raises(ValueError, match="Incompatible `prompt_ignore_length` batch size"):
            spec(target, draft, input_ids=ids, attention_mask=mask, max_new_tokens=10, do_sample=False,
                 repetition_penalty=1.5)


PROCESSOR_OPTIONS = [
    dict(repetition_penalty=1.5), dict(encoder_repetition_penalty=1.5), dict(encoder_no_repeat_ngram_size=2),
    dict(no_repeat_ngram_size=2), dict(bad_words_ids=[[20], [30, 31]]), dict(sequence_bias={(40,): 5.0}),
    dict(min_new_tokens=4, eos_token_id=50), dict(suppress_tokens=[41, 42]), dict(begin_suppress_tokens=[43]),
    dict(exponential_decay_length_penalty=(2, 1.5), eos_token_id=44), dict(forced_eos_token_id=45),
    dict(renormalize_logits=True, remove_invalid_values=True),
    dict(watermarking_config=tf.WatermarkingConfig(bias=2.0, context_width=2)),
]


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_generate_s_processor_options_in_a_left_padded_batch_equal_plain(family):
    """Each row through every processor generate() builds from its options, row-wise or batch-aware."""
    target, draft, ids, mask = batch(family)
    for options in PROCESSOR_OPTIONS:
        ref = target.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False, **options)
        out = spec(target, draft, input_ids=ids, attention_mask=mask, max_new_tokens=10, do_sample=False, **options)
        assert torch.equal(out, ref), (family, options)


# ---------------------------------------------------------------------------------------------
# inputs_embeds next to input_ids; alone


def other_embeddings(target, ids, seed=5):
    """Embeddings of ANOTHER prompt of the same shape, slightly moved: plain reads the prompt from
    them, so its output is not that of ``ids``."""
    other = torch.randint(3, 90, ids.shape, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        embeds = target.get_input_embeddings()(other)
    return embeds + 0.01 * torch.randn(embeds.shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma", "opt"])
def test_inputs_embeds_next_to_input_ids_equal_plain(family, monkeypatch):
    target, draft, ids, mask = batch(family)
    one = ids[1:2]  # the unpadded row
    for inputs in (dict(input_ids=one), dict(input_ids=ids, attention_mask=mask)):
        embeds = other_embeddings(target, inputs["input_ids"])
        plain_ids = target.generate(**inputs, max_new_tokens=10, do_sample=False)
        ref = target.generate(**inputs, inputs_embeds=embeds, max_new_tokens=10, do_sample=False)
        assert not torch.equal(ref, plain_ids)  # plain's output depends on the embeddings
        for d in (draft, target):
            out = spec(target, d, **inputs, inputs_embeds=embeds, max_new_tokens=10, do_sample=False)
            assert torch.equal(out, ref), (family, list(inputs))
        with monkeypatch.context() as m:  # negative control: issue 35, the embeddings ignored
            m.setattr(ModelInputs, "of", classmethod(lambda cls, kwargs: None))
            out = spec(target, draft, **inputs, inputs_embeds=embeds, max_new_tokens=10, do_sample=False)
            assert torch.equal(out, plain_ids) and not torch.equal(out, ref)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_inputs_embeds_alone_is_refused_by_name(family):
    target, draft = tiny_model(family), tiny_model(family, seed=1)
    ids = torch.randint(3, 90, (1, 6), generator=torch.Generator().manual_seed(0))
    embeds = other_embeddings(target, ids)
    for way, run in ways(target, draft).items():
        with pytest.raises(ValueError, match=r"inputs_embeds= without input_ids=.*pass input_ids="):
            run(inputs_embeds=embeds, max_new_tokens=4)
        run(input_ids=ids, inputs_embeds=embeds, max_new_tokens=4)  # negative control: with the ids it runs


# ---------------------------------------------------------------------------------------------
# token_type_ids (GPT-2): the prompt's, then each row's last value for every new token


def test_token_type_ids_equal_plain_on_gpt2(monkeypatch):
    target, draft, ids, mask = batch("gpt2")
    types = torch.randint(0, 96, ids.shape, generator=torch.Generator().manual_seed(4))
    for inputs in (dict(input_ids=ids[1:2], token_type_ids=types[1:2]),
                   dict(input_ids=ids, attention_mask=mask, token_type_ids=types)):
        without = {k: v for k, v in inputs.items() if k != "token_type_ids"}
        plain_without = target.generate(**without, max_new_tokens=10, do_sample=False)
        ref = target.generate(**inputs, max_new_tokens=10, do_sample=False)
        assert not torch.equal(ref, plain_without)  # plain's output depends on them
        for d in (draft, target):
            assert torch.equal(spec(target, d, **inputs, max_new_tokens=10, do_sample=False), ref), list(inputs)
        with monkeypatch.context() as m:  # negative control: issue 35, the token types ignored
            m.setattr(ModelInputs, "of", classmethod(lambda cls, kwargs: None))
            assert torch.equal(spec(target, draft, **inputs, max_new_tokens=10, do_sample=False), plain_without)


def test_token_type_ids_on_a_model_without_them_are_refused_by_name():
    """Llama's forward takes no token_type_ids: generate() itself names them, before opttree runs."""
    target, draft = tiny_model("llama"), tiny_model("llama", seed=1)
    ids = torch.randint(3, 90, (1, 6), generator=torch.Generator().manual_seed(0))
    for way, run in ways(target, draft).items():
        with pytest.raises(ValueError, match="token_type_ids"):
            run(input_ids=ids, token_type_ids=torch.zeros_like(ids), max_new_tokens=4)


# ---------------------------------------------------------------------------------------------
# stop_strings with tokenizer=


class StopTokenizer(CharTokenizer):
    """CharTokenizer whose tokens join without spaces (what StopStringCriteria reads the vocabulary with)."""

    def convert_tokens_to_string(self, tokens):
        return "".join(tokens)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_stop_strings_with_a_tokenizer_equal_plain(family, monkeypatch):
    target, draft = tiny_model(family), tiny_model(family, seed=1)
    tok = StopTokenizer()
    ids = torch.randint(3, 90, (1, 6), generator=torch.Generator().manual_seed(0))
    full = target.generate(ids, max_new_tokens=30, do_sample=False)
    text = tok.decode(full[0, 6:])
    stop = text[8:10]  # a string the text reaches after 8 tokens
    ref = target.generate(ids, max_new_tokens=30, do_sample=False, stop_strings=[stop], tokenizer=tok)
    assert ref.shape[1] < full.shape[1]  # plain stops there
    for way, run in ways(target, draft).items():
        if way == "custom_generate":  # generate() drops tokenizer= before a callable and refuses itself
            with pytest.raises(ValueError, match="could not locate a tokenizer"):
                run(input_ids=ids, max_new_tokens=30, do_sample=False, stop_strings=[stop], tokenizer=tok)
            criteria = tf.StoppingCriteriaList([tf.StopStringCriteria(tokenizer=tok, stop_strings=[stop])])
            out = run(input_ids=ids, max_new_tokens=30, do_sample=False, stopping_criteria=criteria)
        else:
            out = run(input_ids=ids, max_new_tokens=30, do_sample=False, stop_strings=[stop], tokenizer=tok)
        assert torch.equal(out, ref), way
    # the model's own generation_config may hold them too
    model = speculative(copy.deepcopy(target))
    model.generation_config.stop_strings = [stop]
    assert torch.equal(model.generate(ids, max_new_tokens=30, do_sample=False, tokenizer=tok, draft_model=draft), ref)
    config = tf.GenerationConfig(max_new_tokens=30, do_sample=False, stop_strings=[stop])
    assert torch.equal(SpeculativeGenerator(target, draft).generate(ids, generation_config=config, tokenizer=tok), ref)
    from opttree.integration import precheck  # negative control: issue 35's error where the criterion is not made first

    monkeypatch.setattr(precheck, "stop_strings_criterion", lambda model, kwargs: None)
    with pytest.raises(ValueError, match="could not locate a tokenizer"):
        ways(target, draft)["draft_model"](input_ids=ids, max_new_tokens=30, stop_strings=[stop], tokenizer=tok)


# ---------------------------------------------------------------------------------------------
# a draft that cannot serve as one


@pytest.mark.parametrize("family", ["llama", "gpt2", "opt"])
def test_a_base_model_without_an_lm_head_is_refused_as_a_draft_at_the_start(family):
    target = tiny_model(family)
    base = tf.AutoModel.from_config(target.config)
    causal = type(tiny_model(family)).__name__
    ids = torch.randint(3, 90, (1, 6), generator=torch.Generator().manual_seed(0))
    calls = []
    hook = target.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        for way, run in ways(target, base).items():
            if way == "SpeculativeGenerator":
                with pytest.raises(TypeError, match=f"without an LM head.*AutoModelForCausalLM.*{causal}"):
                    SpeculativeGenerator(target, base)
                continue
            with pytest.raises(TypeError, match=f"the draft model is a {type(base).__name__}, a base model without"):
                run(input_ids=ids, max_new_tokens=4)
    finally:
        hook.remove()
    assert calls == []
    with pytest.raises(TypeError, match="not a transformers model"):
        spec(target, torch.nn.Linear(4, 4), input_ids=ids, max_new_tokens=4)
    out = spec(target, tiny_model(family, seed=1), input_ids=ids, max_new_tokens=4)  # negative control
    assert out.shape == (1, 10)
