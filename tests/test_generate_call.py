"""The one seam with generate() that no argument covers (opttree.hf.generate_call), on the installed
transformers (CI runs the lowest, 5.18.0, and the newest, 5.24.0): what generate() keeps from a
custom_generate callable is found where it holds it; a direct call finds nothing; a generate() that no
longer holds it fails with an error naming the transformers version."""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers import DynamicCache
from transformers.generation.streamers import BaseStreamer

from models import tiny_model
from opttree.hf import generate_call
from opttree.hf.compat import GENERATE_CACHE_NAME, cache_passed
from opttree.hf.generate_call import READ, DroppedArguments, dropped_by_generate


class Recording(BaseStreamer):
    def __init__(self):
        self.chunks = []

    def put(self, value):
        self.chunks.append(value.reshape(-1).tolist())

    def end(self):
        pass


def spy_on(seen: list):
    def custom_generate(model, input_ids, logits_processor, stopping_criteria, generation_config, **model_kwargs):
        seen.append(dropped_by_generate())
        return input_ids

    return custom_generate


def prompt():
    return torch.randint(3, 90, (1, 5), generator=torch.Generator().manual_seed(0))


def test_what_generate_keeps_from_a_callable_is_found():
    target, seen, streamer = tiny_model("llama"), [], Recording()
    ids = prompt()
    target.generate(ids, custom_generate=spy_on(seen), streamer=streamer, max_new_tokens=3, synced_gpus=False,
                    **{GENERATE_CACHE_NAME: DynamicCache(config=target.config)})
    (dropped,) = seen
    assert dropped.streamer is streamer and streamer.chunks == [ids[0].tolist()]  # the prompt, put by generate()
    assert dropped.synced_gpus is False and dropped.assistant_model is None
    assert dropped.keywords.get("max_new_tokens") == 3 and cache_passed(dropped.keywords)
    target.generate(ids, custom_generate=spy_on(seen), max_new_tokens=3)  # negative control: none given
    assert seen[1].streamer is None and not cache_passed(seen[1].keywords), transformers.__version__


def test_a_call_not_made_by_generate_finds_nothing():
    assert dropped_by_generate() == DroppedArguments()


def test_a_generate_that_no_longer_holds_the_names_fails_naming_the_version(monkeypatch):
    def generate(streamer=None):  # a generate() that lost assistant_model, synced_gpus and kwargs
        return dropped_by_generate()

    monkeypatch.setattr(generate_call, "_generate_code", lambda: generate.__code__)
    with pytest.raises(RuntimeError, match=f"transformers {transformers.__version__}'s generate\\(\\) no longer "
                                           "holds assistant_model, synced_gpus, kwargs.*speculative\\(model\\)"):
        generate()
    assert set(READ) == {"streamer", "assistant_model", "synced_gpus", "kwargs"}
