"""generate()'s whole contract (opttree.integration.contract): every argument plain generate() takes,
read from transformers itself, is honoured, refused by name, or documented as not applying; each
refusal comes before any forward, on every way in. Negative controls: a new transformers field is
reported unplaced, a name placed twice too, and without draft_model= stock generate() takes what
opttree refuses."""

from __future__ import annotations

import copy
import importlib
import inspect
import traceback
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
import transformers as tf

from models import FAMILIES, peaked, tiny_model
from opttree import SpeculativeGenerator, speculative, speculative_generate
from opttree.integration import contract
from opttree.integration.contract import HONOURED, NOT_APPLYING, REFUSED, generate_arguments, unplaced

HUB_FOLDER = str(Path(__file__).resolve().parents[1] / "hub")


def prompt(n=6, seed=0):
    return torch.randint(3, 90, (1, n), generator=torch.Generator().manual_seed(seed))


def ways(target, draft) -> dict:
    """generate() with a draft, each way in: name -> call(**generate()'s keyword arguments)."""
    model = speculative(copy.deepcopy(target))
    return {
        "custom_generate": lambda **kw: target.generate(custom_generate=speculative_generate, draft_model=draft, **kw),
        "draft_model": lambda **kw: model.generate(draft_model=draft, **kw),
        "SpeculativeGenerator": lambda **kw: SpeculativeGenerator(target, draft).generate(**kw),
        "hub": lambda **kw: target.generate(custom_generate=HUB_FOLDER, trust_remote_code=True, draft_model=draft,
                                            **kw),
    }


@contextmanager
def counted_forwards(*models):
    """Counts the forwards of ``models`` (and their copies' classes' instances passed here) in the block."""
    calls = []
    hooks = [m.register_forward_pre_hook(lambda *_: calls.append(1)) for m in models]
    try:
        yield calls
    finally:
        for hook in hooks:
            hook.remove()


# ---------------------------------------------------------------------------------------------
# every argument placed, from transformers itself


@pytest.mark.parametrize("family", FAMILIES)
def test_every_argument_plain_generate_takes_is_placed_exactly_once(family):
    names = generate_arguments(tiny_model(family))
    assert {"max_new_tokens", "do_sample", "prefix_allowed_tokens_fn", "tokenizer", "inputs_embeds",
            "output_attentions", "attention_mask"} <= names  # read from transformers, not typed here
    assert unplaced(names) == set(), sorted(unplaced(names))
    assert not (set(HONOURED) & set(REFUSED) or set(HONOURED) & set(NOT_APPLYING) or set(REFUSED) & set(NOT_APPLYING))


def _source(function) -> str:
    return inspect.getsource(inspect.unwrap(function))


@pytest.mark.parametrize("family", FAMILIES)
def test_the_declared_generate_facts_are_the_installed_transformers(family):
    """contract.py declares what generate() takes itself instead of parsing transformers' source at run
    time; this reads the installed transformers (5.18.0 and 5.24.0 in CI) and fails where they part."""
    import re

    from transformers.generation.utils import GenerationMixin

    generate = GenerationMixin.generate
    assert set(inspect.signature(generate).parameters) - {"self", "kwargs"} == set(contract.GENERATE_PARAMETERS)
    popped = set()
    for function in (generate, GenerationMixin._extract_generation_mode_kwargs):
        popped |= set(re.findall(r"kwargs\.pop\(\s*[\"'](\w+)[\"']", _source(function)))
    assert popped == set(contract.POPPED_BY_GENERATE)
    renamed = re.findall(r"deprecate_kwarg\(\s*[\"'](\w+)[\"']\s*,[^)]*new_name=[\"']cache[\"']",
                         inspect.getsource(generate))
    assert set(renamed) == set(contract.RENAMED_TO_CACHE), tf.__version__
    listed = re.search(r"key not in \[([^\]]*)\]", _source(type(tiny_model(family))._validate_model_kwargs))
    assert listed and set(re.findall(r"[\"'](\w+)[\"']", listed.group(1))) == set(contract.ALWAYS_ACCEPTED)


def test_a_drift_in_the_declared_facts_is_caught(monkeypatch):
    """Negative control: a declaration that lacks a keyword generate() pops loses the name and fails the
    drift test."""
    monkeypatch.setattr(contract, "POPPED_BY_GENERATE", ("trust_remote_code", "input_ids", "tokenizer"))
    assert "assistant_tokenizer" not in generate_arguments(tiny_model("llama"))
    with pytest.raises(AssertionError):
        test_the_declared_generate_facts_are_the_installed_transformers("llama")


def test_src_reads_no_source_and_no_frame_of_transformers():
    """Issue 59: no inspect.getsource and no sys._getframe in src/ (the one frame read is hf/generate_call.py's)."""
    src = Path(__file__).resolve().parents[1] / "src"
    for path in src.rglob("*.py"):
        text = path.read_text()
        assert "getsource" not in text and "_getframe" not in text, path
        if "currentframe" in text or "f_back" in text:
            assert path.relative_to(src).as_posix() == "opttree/hf/generate_call.py", path


def test_gpt2s_own_model_inputs_are_read_from_its_forward():
    assert {"token_type_ids", "encoder_hidden_states"} <= generate_arguments(tiny_model("gpt2"))
    assert "token_type_ids" not in generate_arguments(tiny_model("llama"))


def test_a_new_generation_config_field_is_reported_unplaced(monkeypatch):
    class NewerConfig(tf.GenerationConfig):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.brand_new_option = None

    monkeypatch.setattr(contract, "GenerationConfig", NewerConfig)
    assert unplaced(generate_arguments(tiny_model("llama"))) == {"brand_new_option"}


def test_a_new_model_input_is_reported_unplaced():
    class NewerLlama(tf.LlamaForCausalLM):
        def forward(self, input_ids=None, attention_mask=None, fresh_input=None, **kwargs):
            return super().forward(input_ids=input_ids, attention_mask=attention_mask, **kwargs)

    model = NewerLlama(tiny_model("llama").config)
    assert unplaced(generate_arguments(model)) == {"fresh_input"}


def test_a_name_placed_twice_is_reported(monkeypatch):
    monkeypatch.setitem(HONOURED, "num_beams", "placed twice")
    assert unplaced(generate_arguments(tiny_model("llama"))) == {"num_beams"}


def test_every_refusal_names_its_fix_and_how_it_is_checked():
    for name, refusal in REFUSED.items():
        assert refusal.fix and refusal.refuses is not None, name
        for check in refusal.checked_by:  # each resolves: an opttree module's function, under its own name there
            module = importlib.import_module(check.__module__)
            assert module.__name__.startswith("opttree.") and getattr(module, check.__name__) is check, (name, check)
        if refusal.example is not None:
            assert refusal.refuses(refusal.example), name


# ---------------------------------------------------------------------------------------------
# each refusal: by name, before any forward, on every way in

EXTRA = {"penalty_alpha": {"top_k": 4}}  # what the example needs beside it


def filled_cache(target):
    out = target(prompt(3, seed=9), use_cache=True)
    return out.cache if "cache" in out else out.past_key_values


TENSOR_EXAMPLES = {  # refused values the contract cannot hold as constants: made per target
    "cache": filled_cache,
    "encoder_hidden_states": lambda target: torch.zeros(1, 4, 32),
    "encoder_attention_mask": lambda target: torch.ones(1, 4, dtype=torch.long),
    "cu_seq_lens_q": lambda target: torch.tensor([0, 6], dtype=torch.int32),
    "cu_seq_lens_k": lambda target: torch.tensor([0, 6], dtype=torch.int32),
    "seq_idx": lambda target: torch.zeros(1, 6, dtype=torch.int32),
    "mm_encoder_outputs": lambda target: torch.zeros(1, 4, 32),
}
EXAMPLES = sorted({name for name, refusal in REFUSED.items() if refusal.example is not None} | set(TENSOR_EXAMPLES))


BUILT_BEFORE_THE_CALLABLE = {"cache_implementation"}  # generate() builds the cache, then calls a custom_generate callable


def preparation_error(target, kw: dict) -> Exception | None:
    """What generate() without a draft raises on this machine for ``kw`` before its first forward (None:
    nothing): the preparation a custom_generate callable runs after."""
    with counted_forwards(target) as calls:
        try:
            target.generate(input_ids=prompt(), max_new_tokens=1, do_sample=False, **kw)
        except Exception as error:  # noqa: BLE001 - whatever stock raises there, the callable way meets first
            return error if not calls else None
    return None


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("name", EXAMPLES)
def test_each_refused_value_is_refused_by_name_before_any_forward(name, family):
    target, draft = tiny_model(family), tiny_model(family, seed=1)
    example = TENSOR_EXAMPLES[name](target) if name in TENSOR_EXAMPLES else REFUSED[name].example
    kw = {name: example, **EXTRA.get(name, {})}
    for way, run in ways(target, draft).items():
        stock = preparation_error(target, kw) if way == "custom_generate" and name in BUILT_BEFORE_THE_CALLABLE else None
        if stock is not None:  # e.g. an offloaded cache with a CUDA build of torch and no driver (CI's torch
            with pytest.raises(type(stock)):  # 2.14.1): torch.Stream() fails in generate() itself, before opttree
                run(input_ids=prompt(), max_new_tokens=4, do_sample=False, **kw)
            continue
        with counted_forwards(target, draft) as calls:
            with pytest.raises((ValueError, NotImplementedError, TypeError)) as error:
                run(input_ids=prompt(), max_new_tokens=4, do_sample=False, **kw)
        assert name in str(error.value), (way, str(error.value))
        assert calls == [], way


CONTEXT_EXAMPLES = {  # refusals whose check reads more than the value: a value they refuse
    "synced_gpus": lambda target: True,
    "position_ids": lambda target: torch.arange(6)[None] + 5,
}


@pytest.mark.parametrize("name", sorted(set(EXAMPLES) | set(CONTEXT_EXAMPLES)))
def test_each_refusal_is_raised_inside_the_checks_it_names(name):
    """``checked_by`` is where the error comes from; a refusal that names none is refused by the value
    check of every call (arguments.check_call and the model kwargs it checks)."""
    from opttree.integration import arguments

    target, draft = tiny_model("gpt2"), tiny_model("gpt2", seed=1)  # gpt2 takes cross-attention inputs: opttree refuses them
    makers = {**TENSOR_EXAMPLES, **CONTEXT_EXAMPLES}
    example = makers[name](target) if name in makers else REFUSED[name].example
    if name not in generate_arguments(target):  # a later transformers' name (cache=): this one's
        for run in (ways(target, draft)["draft_model"], target.generate):  # generate() refuses it itself, as
            with pytest.raises(ValueError, match="not used by the model"):  # it does without a draft
                run(input_ids=prompt(), max_new_tokens=4, do_sample=False, **{name: example})
        return
    with pytest.raises((ValueError, NotImplementedError, TypeError)) as error:
        ways(target, draft)["draft_model"](input_ids=prompt(), max_new_tokens=4, do_sample=False,
                                           **{name: example, **EXTRA.get(name, {})})
    raised_in = {frame.f_code for frame, _ in traceback.walk_tb(error.tb)}
    checks = REFUSED[name].checked_by or (arguments.check_call, arguments.check_model_kwargs)
    assert raised_in & {check.__code__ for check in checks}, (name, str(error.value))


def test_refused_options_are_stock_generate_s_without_a_draft():
    """Negative control: the refusals are opttree's; stock generate() takes the same values."""
    target = tiny_model("llama")
    for kw in (dict(output_attentions=True, return_dict_in_generate=True), dict(guidance_scale=1.5),
               dict(prefill_chunk_size=2)):
        out = speculative(copy.deepcopy(target)).generate(prompt(), max_new_tokens=3, do_sample=False, **kw)
        assert out is not None
    out = target.generate(prompt(), max_new_tokens=3, output_attentions=True, output_hidden_states=True,
                          return_dict_in_generate=True)
    assert out.attentions is not None and out.hidden_states is not None


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_output_attentions_and_hidden_states_are_refused_by_name(family):
    """Issue 35: they came back None without a word. Refused now, naming the way to get them."""
    target, draft = tiny_model(family), tiny_model(family, seed=1)
    for name in ("output_attentions", "output_hidden_states"):
        for way, run in ways(target, draft).items():
            with counted_forwards(target, draft) as calls, pytest.raises(ValueError) as error:
                run(input_ids=prompt(), max_new_tokens=4, return_dict_in_generate=True, **{name: True})
            assert f"{name}=True" in str(error.value) and "without draft_model=" in str(error.value), way
            assert calls == []


def test_a_synthid_watermark_and_a_stateful_processor_are_refused():
    target, draft = tiny_model("llama"), tiny_model("llama", seed=1)
    synthid = tf.SynthIDTextWatermarkingConfig(keys=[3, 7, 11, 13], ngram_len=2)
    for way, run in ways(target, draft).items():
        with pytest.raises(ValueError, match="watermarking_config="):
            run(input_ids=prompt(), max_new_tokens=4, watermarking_config=synthid)
    stateful = tf.generation.logits_process.UnbatchedClassifierFreeGuidanceLogitsProcessor(1.5, target)
    with pytest.raises(ValueError, match="UnbatchedClassifierFreeGuidanceLogitsProcessor.*keeps a state"):
        ways(target, draft)["custom_generate"](input_ids=prompt(), max_new_tokens=4,
                                               logits_processor=tf.LogitsProcessorList([stateful]))
    # a stateless watermark is honoured
    plain_wm = tf.WatermarkingConfig(bias=2.0, context_width=2)
    ids = prompt()
    ref = target.generate(ids, max_new_tokens=6, do_sample=False, watermarking_config=plain_wm)
    for way, run in ways(target, draft).items():
        assert torch.equal(run(input_ids=ids, max_new_tokens=6, do_sample=False, watermarking_config=plain_wm), ref), way


def test_assistant_model_and_synced_gpus_are_refused_on_every_way_in():
    """generate() hands a custom_generate callable neither: the third way reads them from generate()'s
    frame (before: an assistant_model= given with custom_generate= was dropped in silence)."""
    target, draft = tiny_model("llama"), tiny_model("llama", seed=1)
    for way, run in ways(target, draft).items():
        with pytest.raises(ValueError, match="assistant_model="):
            run(input_ids=prompt(), max_new_tokens=4, assistant_model=draft)
        with pytest.raises(ValueError, match="synced_gpus=True"):
            run(input_ids=prompt(), max_new_tokens=4, synced_gpus=True)


def test_token_healing_and_paged_caches_are_refused_where_opttree_sees_them(capsys):
    """generate() heals tokens (with a tokenizer it drops before a callable) and hands a paged cache to
    generate_batch() before opttree runs: refused where opttree sees the call's arguments; the third way
    gets transformers' own token-healing error, and its paged batch runs stock, without opttree."""
    from test_api import CharTokenizer

    target, draft = tiny_model("llama"), tiny_model("llama", seed=1)
    for way, run in ways(target, draft).items():
        if way == "custom_generate":
            with pytest.raises(ValueError, match="token healing"):
                run(input_ids=prompt(), max_new_tokens=4, token_healing=True, tokenizer=CharTokenizer())
            continue
        with pytest.raises(ValueError, match=r"token_healing=True: .*heal_tokens"):
            run(input_ids=prompt(), max_new_tokens=4, token_healing=True, tokenizer=CharTokenizer())
        with pytest.raises(ValueError, match="cache_implementation='paged'"):
            run(input_ids=prompt(), max_new_tokens=4, cache_implementation="paged")


def test_position_ids_other_than_generate_s_own_are_refused():
    target, draft = peaked(tiny_model("llama"), 30.0), tiny_model("llama", seed=1)
    ids = prompt(7)
    ref = target.generate(ids, max_new_tokens=8, do_sample=False)
    for way, run in ways(target, draft).items():
        with pytest.raises(ValueError, match="position_ids=.*drop position_ids="):
            run(input_ids=ids, max_new_tokens=8, position_ids=torch.arange(7)[None] + 5)
        # negative control: the positions generate() would derive itself are honoured
        assert torch.equal(run(input_ids=ids, max_new_tokens=8, do_sample=False, position_ids=torch.arange(7)[None]),
                           ref), way


def test_an_unplaced_model_input_reaching_opttree_is_refused_by_name(monkeypatch):
    """Safety net for a model input that no test placed: refused, never dropped."""
    from opttree.integration import arguments

    monkeypatch.delitem(NOT_APPLYING, "labels")
    target, draft = tiny_model("llama"), tiny_model("llama", seed=1)
    with pytest.raises(ValueError, match="labels=: opttree's forwards do not pass this model input on"):
        ways(target, draft)["custom_generate"](input_ids=prompt(), max_new_tokens=4, labels=prompt())
    assert arguments  # the module that refused it
