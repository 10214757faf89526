"""A new user's first hour: the default tree, options that are refused rather than dropped,
draft folders passed as paths, pickling, and the errors that name the fix."""

import copy
import io
import pickle

import pytest
import torch
import transformers as tf

import opttree.integration.prepare as integration  # the preparation: where a call meets its policy
from models import peaked, tiny_model
from opttree import SpeculativeGenerator, TreeConfig, speculative, speculative_generate
from opttree.budget.policy import AutoPolicy
from opttree.tree.plan import FixedPolicy
from opttree.integration.defaults import TreeArguments, resolve


def pair():
    target = peaked(tiny_model("llama", seed=0), scale=30.0)
    draft = tiny_model("llama", seed=2, layers=1)
    ids = torch.randint(3, 90, (1, 8), generator=torch.Generator().manual_seed(0))
    return target, draft, ids


@pytest.fixture
def policies(monkeypatch):
    """Every policy generate() makes, in order (the real ones: the run goes on)."""
    made = []
    real = integration.calibration.policy_maker

    def spy(config, *args, **kwargs):
        maker = real(config, *args, **kwargs)

        def make():
            policy = maker()
            made.append((config, policy))
            return policy

        return make

    monkeypatch.setattr(integration.calibration, "policy_maker", spy)
    return made


# ---------------------------------------------------------------------------------------------
# the default tree


def test_no_tree_arguments_means_auto_and_stays_lossless(policies):
    target, draft, ids = pair()
    ref = target.generate(ids, max_new_tokens=12, do_sample=False)
    out = speculative(target).generate(ids, max_new_tokens=12, do_sample=False, draft_model=draft)
    assert torch.equal(out, ref)
    config, policy = policies[-1]
    assert (config.nodes, config.threshold) == ("auto", "auto") and isinstance(policy, AutoPolicy)


@pytest.mark.parametrize("given, expected", [
    (dict(nodes=60, threshold=0.5), (60, 0.5)),
    (dict(nodes=7), (7, 0.5)),  # a given argument keeps its exact meaning, the other TreeConfig's default
    (dict(threshold=0.2), (60, 0.2)),
    (dict(nodes="auto"), ("auto", 0.5)),
])
def test_explicit_tree_arguments_keep_their_meaning(policies, given, expected):
    target, draft, ids = pair()
    ref = target.generate(ids, max_new_tokens=8, do_sample=False)
    out = target.generate(ids, max_new_tokens=8, do_sample=False, custom_generate=speculative_generate,
                          draft_model=draft, **given)
    assert torch.equal(out, ref)
    config, policy = policies[-1]
    assert (config.nodes, config.threshold) == expected
    assert isinstance(policy, AutoPolicy if "auto" in expected else FixedPolicy)


def test_where_auto_cannot_run_the_defaults_are_the_fixed_ones():
    none = TreeArguments.of()
    assert resolve(none) == TreeConfig(nodes="auto", threshold="auto")
    assert resolve(none, can_calibrate=False) == TreeConfig()
    assert resolve(TreeArguments.of(strategy="sampled")) == TreeConfig(strategy="sampled")
    assert resolve(TreeArguments.of(verifier="rrs")) == TreeConfig(verifier="rrs")
    assert resolve(TreeArguments.of(strategy="chain")) == TreeConfig(strategy="chain", nodes="auto", threshold="auto")
    assert TreeConfig().nodes == 60 and TreeConfig().threshold == 0.5  # the fixed defaults themselves


def test_a_batch_without_tree_arguments_runs_with_the_fixed_defaults():
    target, draft, _ = pair()
    ids = torch.randint(3, 90, (2, 6), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    ref = target.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
    out = speculative(target).generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, draft_model=draft)
    assert torch.equal(out, ref)


# ---------------------------------------------------------------------------------------------
# options that are refused, not dropped


def three_ways(target, draft):
    """The three entry points as callables taking generate()'s keyword arguments."""
    plain = copy.deepcopy(target)
    model = speculative(copy.deepcopy(target))
    return {
        "custom_generate": lambda ids, **kw: plain.generate(ids, custom_generate=speculative_generate,
                                                            draft_model=draft, **kw),
        "draft_model": lambda ids, **kw: model.generate(ids, draft_model=draft, **kw),
        "SpeculativeGenerator": lambda ids, **kw: SpeculativeGenerator(plain, draft).generate(ids, **kw),
    }


@pytest.mark.parametrize("kw, error, match", [
    (dict(num_beams=2), NotImplementedError, "cannot run beam search.*num_beams=1"),
    (dict(num_beams=2, num_return_sequences=2), NotImplementedError, "beam search"),
    (dict(num_return_sequences=2), ValueError, "num_return_sequences"),
    (dict(prompt_lookup_num_tokens=3), ValueError, "two speculative methods.*draft_model='prompt_lookup'"),
    (dict(penalty_alpha=0.6, top_k=4), NotImplementedError, "contrastive search"),
])
def test_generation_modes_opttree_cannot_run_are_refused(kw, error, match):
    target, draft, ids = pair()
    for name, run in three_ways(target, draft).items():
        with pytest.raises(error, match=match):
            run(ids, max_new_tokens=4, do_sample=False, **kw)


def test_stock_beam_search_is_untouched_without_a_draft():  # negative control: only draft_model= is refused
    target, _, ids = pair()
    ref = target.generate(ids, max_new_tokens=4, do_sample=False, num_beams=2)
    assert torch.equal(speculative(copy.deepcopy(target)).generate(ids, max_new_tokens=4, do_sample=False,
                                                                   num_beams=2), ref)


def test_several_samples_per_prompt_are_a_supported_path():
    target, draft, ids = pair()
    out = speculative(target).generate(ids, draft_model=draft, do_sample=True, num_return_sequences=3,
                                       max_new_tokens=5, nodes=8, generator=torch.Generator().manual_seed(0))
    assert out.shape == (3, ids.shape[1] + 5)


def test_assistant_model_next_to_draft_model_is_refused():
    target, draft, ids = pair()
    with pytest.raises(ValueError, match="draft_model= and assistant_model="):
        speculative(target).generate(ids, max_new_tokens=4, draft_model=draft, assistant_model=draft)


def test_another_custom_generate_next_to_draft_model_is_refused_but_ours_is_fine():
    target, draft, ids = pair()
    ref = target.generate(ids, max_new_tokens=8, do_sample=False)
    model = speculative(target)
    out = model.generate(ids, max_new_tokens=8, do_sample=False, draft_model=draft,
                         custom_generate=speculative_generate)  # the README's third way after the second
    assert torch.equal(out, ref)
    with pytest.raises(ValueError, match="not both"):
        model.generate(ids, max_new_tokens=8, draft_model=draft, custom_generate=lambda *a, **k: None)


def test_an_empty_prompt_gets_an_error_that_names_the_fix():
    target, draft, _ = pair()
    empty = torch.zeros(1, 0, dtype=torch.long)
    for name, run in three_ways(target, draft).items():
        with pytest.raises(ValueError, match="prompt is empty.*at least one token"):
            run(empty, max_new_tokens=4, do_sample=False)


# ---------------------------------------------------------------------------------------------
# drafts given as folders


@pytest.fixture
def draft_folder(tmp_path):
    from opttree.distill.train.model import init_draft
    from opttree.loading.draft_model import save_draft

    target, _, _ = pair()
    draft, meta = init_draft(target, [0], torch.arange(2, 90))
    return save_draft(draft, meta, tmp_path / "draft", dtype=torch.float32)


def test_a_distilled_draft_folder_is_accepted_as_draft_model(draft_folder):
    target, _, ids = pair()
    ref = target.generate(ids, max_new_tokens=10, do_sample=False)
    for draft in (str(draft_folder), draft_folder):
        for name, run in three_ways(target, draft).items():
            assert torch.equal(run(ids, max_new_tokens=10, do_sample=False), ref), name


def test_a_distilled_head_folder_is_accepted_as_draft_model(tmp_path):
    from opttree.distill.train.head import new_head
    from opttree.loading.head_file import save_head

    target, _, ids = pair()
    head, meta = new_head(target, init_layer=0)
    save_head(head, meta, tmp_path / "head")
    ref = target.generate(ids, max_new_tokens=8, do_sample=False)
    out = speculative(target).generate(ids, max_new_tokens=8, do_sample=False, draft_model=str(tmp_path / "head"))
    assert torch.equal(out, ref)


def test_a_string_that_is_no_draft_folder_names_what_to_pass(tmp_path):
    target, _, ids = pair()
    with pytest.raises(ValueError, match="'prompt_lookup' or a folder written by `opttree distill`"):
        speculative(target).generate(ids, max_new_tokens=4, draft_model=str(tmp_path))
    with pytest.raises(ValueError, match="'prompt_lookup' or a folder"):
        SpeculativeGenerator(target, "drafts/nowhere")


def test_a_distilled_draft_loaded_with_from_pretrained_is_refused(draft_folder):
    target, _, ids = pair()
    broken = tf.AutoModelForCausalLM.from_pretrained(draft_folder, attn_implementation="sdpa")  # random embedding
    with pytest.raises(ValueError, match="opttree draft.*load_draft\\(path, target\\)"):
        speculative(target).generate(ids, max_new_tokens=4, draft_model=broken)
    with pytest.raises(ValueError, match="load_draft"):
        SpeculativeGenerator(target, broken)
    from opttree import load_draft

    good = load_draft(draft_folder, target)  # negative control: the one right way passes the check
    SpeculativeGenerator(target, good)


# ---------------------------------------------------------------------------------------------
# the objects themselves


def test_a_speculative_model_pickles_and_saves_whole():
    target, draft, ids = pair()
    ref = target.generate(ids, max_new_tokens=8, do_sample=False)
    model = speculative(target)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    for again in (torch.load(buffer, weights_only=False), pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
        assert type(again) is type(model) and type(again).__name__ == "LlamaForCausalLM"
        assert torch.equal(again.generate(ids, max_new_tokens=8, do_sample=False, draft_model=draft), ref)
        assert torch.equal(again.generate(ids, max_new_tokens=8, do_sample=False), ref)


def test_speculative_generator_takes_a_generator():
    target, draft, ids = pair()

    def sample(seed):
        gen = SpeculativeGenerator(target, draft, nodes=8, generator=torch.Generator().manual_seed(seed))
        return gen.generate(ids, max_new_tokens=12, do_sample=True, temperature=2.0)

    assert torch.equal(sample(3), sample(3))
    assert any(not torch.equal(sample(3), sample(s)) for s in (4, 5, 6))  # the generator is really used
