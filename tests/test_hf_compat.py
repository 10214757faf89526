"""Following transformers as it moves: the cache's name (hf_compat), no deprecation warning from
opttree's own calls, the streamer on every entry point, the Hub's custom_generate folder, and
tree arguments per call."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import pytest
import torch
from transformers.generation.streamers import BaseStreamer
from transformers.utils import logging as hf_logging

from models import peaked, tiny_model
from opttree import SpeculativeGenerator, speculative, speculative_generate
from opttree.drafters import Drafter, ModelDrafter
from opttree.hf.compat import GENERATE_CACHE_NAME, NEW_CACHE_NAME, OLD_CACHE_NAME, forward_cache_name

HUB_FOLDER = str(Path(__file__).resolve().parents[1] / "hub")


def pair(family="llama"):
    target = peaked(tiny_model(family, seed=0), scale=30.0)
    draft = tiny_model(family, seed=2, layers=1)
    ids = torch.randint(3, 90, (1, 7), generator=torch.Generator().manual_seed(1))
    return target, draft, ids


# --- the cache's name ---------------------------------------------------------------------------


class _NewName:
    def forward(self, input_ids=None, cache=None, use_cache=None): ...


class _OldName:
    def forward(self, input_ids=None, past_key_values=None, use_cache=None): ...


class _KwargsOnly:
    def forward(self, **kwargs): ...


def test_each_model_class_gets_the_name_its_forward_declares():
    assert forward_cache_name(_NewName) == NEW_CACHE_NAME
    assert forward_cache_name(_OldName) == OLD_CACHE_NAME  # e.g. a remote-code model on a new transformers
    assert forward_cache_name(_KwargsOnly) == GENERATE_CACHE_NAME


def test_the_installed_models_take_generates_name():
    target, _, _ = pair()
    assert forward_cache_name(type(target)) == GENERATE_CACHE_NAME


# --- no deprecation warning from opttree's calls --------------------------------------------------


class _Warnings:
    """Python warnings of the deprecation kinds, and transformers' own logged deprecations."""

    def __init__(self, caplog):
        self.caplog = caplog

    def __enter__(self):
        self._catch = warnings.catch_warnings(record=True)
        self.caught = self._catch.__enter__()
        warnings.simplefilter("always")
        hf_logging.get_logger().warning_once.cache_clear()  # a logged deprecation shows once per process
        self.caplog.clear()
        self.caplog.set_level(logging.WARNING, logger="transformers")
        return self

    def __exit__(self, *exc):
        self._catch.__exit__(*exc)

    def deprecations(self) -> list[str]:
        found = [str(w.message) for w in self.caught if issubclass(w.category, (FutureWarning, DeprecationWarning))]
        found += [r.getMessage() for r in self.caplog.records
                  if r.name.startswith("transformers") and "deprecat" in r.getMessage().lower()]
        return found


def _entry_points(target, draft, ids):
    kw = dict(max_new_tokens=12, do_sample=False)
    yield "custom_generate", lambda: target.generate(ids, custom_generate=speculative_generate, draft_model=draft,
                                                     nodes=8, threshold=0.1, **kw)
    yield "speculative()", lambda: speculative(target).generate(ids, draft_model=draft, nodes=8, **kw)
    yield "SpeculativeGenerator", lambda: SpeculativeGenerator(target, draft, nodes=8).generate(ids, **kw)
    yield "auto", lambda: target.generate(ids, custom_generate=speculative_generate, draft_model=draft, **kw)
    yield "batch", lambda: target.generate(ids.repeat(2, 1), custom_generate=speculative_generate,
                                           draft_model=draft, nodes=8, **kw)
    yield "sampling", lambda: target.generate(ids, custom_generate=speculative_generate, draft_model=draft,
                                              nodes=8, max_new_tokens=12, do_sample=True, top_k=5)
    yield "prompt_lookup", lambda: target.generate(ids, custom_generate=speculative_generate,
                                                   draft_model="prompt_lookup", nodes=8, **kw)
    yield "hub folder", lambda: target.generate(ids, custom_generate=HUB_FOLDER, trust_remote_code=True,
                                                draft_model=draft, nodes=8, **kw)


@pytest.mark.parametrize("family", ["llama", "gpt2", "qwen3"])
def test_opttree_calls_trigger_no_deprecation_warning(family, caplog):
    target, draft, ids = pair(family)
    for name, call in _entry_points(target, draft, ids):
        with _Warnings(caplog) as seen:
            call()
        assert seen.deprecations() == [], f"{name}: {seen.deprecations()}"


class _WarnsOnce(Drafter):
    """Negative control: a drafter that warns as a deprecated transformers call would."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def bind(self, target, to_probs):
        self.inner.bind(target, to_probs)
        return self

    def caches(self):
        return self.inner.caches()

    def root_probs(self, sequence):
        warnings.warn("`past_key_values` is deprecated", FutureWarning)
        return self.inner.root_probs(sequence)

    def expand(self, tree, parents):
        return self.inner.expand(tree, parents)

    def commit(self, accepted_pool_ids):
        self.inner.commit(accepted_pool_ids)


def test_the_warning_check_catches_a_deprecation_inside_a_call(caplog):
    target, draft, ids = pair()
    with _Warnings(caplog) as seen:
        target.generate(ids, custom_generate=speculative_generate, draft_model=_WarnsOnce(ModelDrafter(draft)),
                        nodes=8, max_new_tokens=6, do_sample=False)
    assert seen.deprecations()


# --- the streamer on every entry point ------------------------------------------------------------


class Recording(BaseStreamer):
    def __init__(self):
        self.chunks: list[list[int]] = []
        self.ends = 0

    def put(self, value):
        self.chunks.append(value.reshape(-1).tolist())

    def end(self):
        self.ends += 1


def _streamed_calls(target, draft):
    kw = dict(max_new_tokens=14, do_sample=False)
    yield "custom_generate", lambda ids, s: target.generate(ids, custom_generate=speculative_generate,
                                                            draft_model=draft, nodes=8, streamer=s, **kw)
    yield "speculative()", lambda ids, s: speculative(target).generate(ids, draft_model=draft, nodes=8, streamer=s,
                                                                       **kw)
    yield "SpeculativeGenerator", lambda ids, s: SpeculativeGenerator(target, draft, nodes=8).generate(
        ids, streamer=s, **kw)
    yield "hub folder", lambda ids, s: target.generate(ids, custom_generate=HUB_FOLDER, trust_remote_code=True,
                                                       draft_model=draft, nodes=8, streamer=s, **kw)


def test_every_entry_point_streams_the_prompt_once_then_every_new_token_then_ends():
    target, draft, ids = pair()
    plain = Recording()
    ref = target.generate(ids, max_new_tokens=14, do_sample=False, streamer=plain)
    for name, call in _streamed_calls(target, draft):
        streamer = Recording()
        out = call(ids, streamer)
        assert torch.equal(out, ref), name
        assert streamer.chunks[0] == ids[0].tolist(), name
        assert sum(streamer.chunks[1:], []) == ref[0, ids.shape[1]:].tolist(), name
        assert sum(streamer.chunks, []) == sum(plain.chunks, []), name
        assert streamer.ends == 1, name


# --- the Hub's custom_generate folder --------------------------------------------------------------


def test_the_hub_folder_equals_plain_greedy_and_passes_the_tree_arguments(monkeypatch):
    from opttree.integration import entry as integration

    target, draft, ids = pair()
    ref = target.generate(ids, max_new_tokens=15, do_sample=False)
    seen = {}
    real = integration.prepare

    def spy(model, call, options):
        seen.update(options.tree.given, draft=options.draft_model)
        return real(model, call, options)

    monkeypatch.setattr(integration, "prepare", spy)
    out = target.generate(ids, custom_generate=HUB_FOLDER, trust_remote_code=True, draft_model=draft,
                          nodes=9, threshold=0.3, max_new_tokens=15, do_sample=False)
    assert torch.equal(out, ref)
    assert seen == {"nodes": 9, "threshold": 0.3, "draft": draft}


def test_the_hub_folder_needs_a_draft_and_trust():
    target, _, ids = pair()
    with pytest.raises(ValueError, match="draft_model="):
        target.generate(ids, custom_generate=HUB_FOLDER, trust_remote_code=True, max_new_tokens=4)
    with pytest.raises(ValueError, match="trust_remote_code"):
        target.generate(ids, custom_generate=HUB_FOLDER, draft_model="prompt_lookup", max_new_tokens=4)


def test_the_hub_folder_is_a_model_card_with_transformers_front_matter():
    card = (Path(HUB_FOLDER) / "README.md").read_text()
    front = card.split("---")[1]
    assert "library_name: transformers" in front and "custom_generate" in front
    assert (Path(HUB_FOLDER) / "custom_generate" / "requirements.txt").read_text().strip().startswith("opttree")


# --- tree arguments per call ------------------------------------------------------------------------


@pytest.mark.parametrize("wrap", [False, True])
def test_a_generator_takes_tree_arguments_per_call(wrap, monkeypatch):
    from opttree.integration import entry as integration

    target, draft, ids = pair()
    ref = target.generate(ids, max_new_tokens=10, do_sample=False)
    if wrap:
        speculative(target)
    seen = {}
    real = integration.prepare
    monkeypatch.setattr(integration, "prepare",
                        lambda model, call, options: seen.update(options.tree.given) or real(model, call, options))
    gen = SpeculativeGenerator(target, draft, nodes=20, threshold=0.5)
    out = gen.generate(ids, nodes=4, max_new_tokens=10, do_sample=False)
    assert torch.equal(out, ref)
    assert seen == {"nodes": 4, "threshold": 0.5}  # the call's nodes over the constructor's
    with pytest.raises(ValueError, match="nodes"):
        gen.generate(ids, nodes=-3, max_new_tokens=4)
    with pytest.raises(ValueError, match="constructor"):
        gen.generate(ids, draft_model=draft, max_new_tokens=4)
