"""The three ways in: custom_generate=, generate(draft_model=...) via speculative(), SpeculativeGenerator."""

import pytest
import torch
import transformers as tf

from models import peaked, tiny_model
from opttree import GenerationStats, SpeculativeGenerator, speculative, speculative_generate


def setup_pair():
    target = peaked(tiny_model("llama", seed=0), scale=30.0)
    draft = tiny_model("llama", seed=2, layers=1)
    ids = torch.randint(3, 90, (1, 8), generator=torch.Generator().manual_seed(0))
    return target, draft, ids


def test_custom_generate_on_an_untouched_model():
    target, draft, ids = setup_pair()
    ref = target.generate(ids, max_new_tokens=15, do_sample=False)
    out = target.generate(ids, max_new_tokens=15, do_sample=False, custom_generate=speculative_generate,
                          draft_model=target, nodes=12, threshold=0.2)
    assert torch.equal(out, ref)


def test_speculative_model_generate_with_draft_model():
    target, draft, ids = setup_pair()
    ref = target.generate(ids, max_new_tokens=15, do_sample=False)
    model = speculative(target)
    assert model is target and type(model).__name__ == "LlamaForCausalLM"
    assert torch.equal(model.generate(ids, max_new_tokens=15, do_sample=False), ref)  # untouched without a draft
    out = model.generate(ids, max_new_tokens=15, do_sample=False, draft_model=draft, nodes=20, threshold=0.5,
                         max_depth=4, return_dict_in_generate=True)
    assert torch.equal(out.sequences, ref)
    assert isinstance(out.stats, GenerationStats)
    assert out.stats.target_forwards == len(out.stats.steps) + 1
    assert len(out.stats.expected_lengths) == len(out.stats.accept_lengths) == len(out.stats.tree_sizes)


def test_speculative_generator_reports_stats():
    target, draft, ids = setup_pair()
    ref = target.generate(ids, max_new_tokens=20, do_sample=False)
    gen = SpeculativeGenerator(target, target, nodes=10, threshold=0.0)
    out = gen.generate(ids, max_new_tokens=20, do_sample=False)
    assert torch.equal(out, ref)
    stats = gen.last_stats
    assert stats.new_tokens == 20
    assert sum(stats.accept_lengths) == 20
    assert stats.mean_accepted_tokens > 1.5  # the draft is the target: long paths are accepted
    assert "τ=" in stats.summary()


def test_attention_mask_and_dict_inputs_pass_through():
    target, draft, ids = setup_pair()
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    ref = target.generate(**inputs, max_new_tokens=10, do_sample=False)
    out = SpeculativeGenerator(target, draft).generate(**inputs, max_new_tokens=10, do_sample=False)
    assert torch.equal(out, ref)


class CharTokenizer(tf.PreTrainedTokenizer):
    """A tiny tokenizer so a real pipeline can run on the tiny models."""

    def __init__(self, **kwargs):
        self.alphabet = [chr(c) for c in range(32, 32 + 90)]
        super().__init__(eos_token="~", pad_token=" ", **kwargs)

    @property
    def vocab_size(self):
        return 96

    def get_vocab(self):
        return {ch: i + 3 for i, ch in enumerate(self.alphabet)}

    def _tokenize(self, text):
        return [ch for ch in text if ch in self.alphabet]

    def _convert_token_to_id(self, token):
        return self.alphabet.index(token) + 3 if token in self.alphabet else 0

    def _convert_id_to_token(self, index):
        return self.alphabet[index - 3] if 3 <= index < 93 else " "


def test_text_generation_pipeline_with_draft_model(monkeypatch):
    import opttree.integration.decoding as integration

    calls = []
    real = integration.speculative_decode
    monkeypatch.setattr(integration, "speculative_decode", lambda *a, **k: calls.append(1) or real(*a, **k))
    target, draft, _ = setup_pair()
    tok = CharTokenizer()
    model = speculative(target)
    pipe = tf.pipeline("text-generation", model=model, tokenizer=tok, device="cpu")
    ref = pipe("hello world", max_new_tokens=12, do_sample=False)[0]["generated_text"]
    out = pipe("hello world", max_new_tokens=12, do_sample=False, draft_model=target, nodes=8)[0]["generated_text"]
    assert out == ref and len(out) > len("hello world")
    assert calls == [1]  # the pipeline really went through opttree


@pytest.mark.parametrize("strategy,nodes", [("opt", 8), ("opt", 60), ("chain", 6), ("heap", 8)])
def test_step_stats_describe_the_verified_tree(strategy, nodes):
    """tree_depth and E(A) read without host reads (from the walk, the builder) equal the tree's own."""
    target = peaked(tiny_model("llama"), scale=300.0)
    gen = SpeculativeGenerator(target, target, nodes=nodes, threshold=0.5, max_depth=10, strategy=strategy)
    gen.generate(torch.tensor([[5, 17, 33, 2, 41]]), max_new_tokens=40)
    for step in gen.last_stats.steps:
        assert step.tree_depth == (int(step.tree.depths().max()) if len(step.tree) else 0)
        assert step.expected_length == pytest.approx(float(step.tree.path_probs.sum()), rel=1e-5)
        assert step.tree_size == len(step.tree)


def test_the_drafter_names_the_readme_uses_come_from_opttree_itself():
    import subprocess
    import sys

    import opttree
    from opttree import Drafter, MixedDrafter, load_draft
    from opttree.drafters import Drafter as BaseDrafter, MixedDrafter as Mixed
    from opttree.loading import load_draft as runtime_load_draft

    assert (Drafter, MixedDrafter, load_draft) == (BaseDrafter, Mixed, runtime_load_draft)
    assert {"Drafter", "MixedDrafter", "load_draft"} <= set(opttree.__all__)
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        opttree.no_such_name
    # load_draft is the runtime's: importing opttree does not import the distillation package
    code = "import sys, opttree; assert 'opttree.distill' not in sys.modules; from opttree import *; print(load_draft)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0 and "load_draft" in done.stdout, done.stderr
