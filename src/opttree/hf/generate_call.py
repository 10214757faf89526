"""The one seam with transformers' generate() that no argument and no documented API covers: what
generate() was called with but does not hand a ``custom_generate`` callable.

transformers 5.18.0 to 5.24.0 hand a callable the prompt's ids, the prepared logits processors, stopping
criteria and generation config, the model kwargs, and of generate()'s own keywords only those the
callable's signature adds to ``_sample``'s (``_extract_generation_mode_kwargs`` replaces the mode kwargs
by them). So the ``streamer`` (into which generate() has already put the prompt), ``assistant_model``,
``synced_gpus`` and ``tokenizer`` never reach the callable, and a cache object the caller passed arrives
like one generate() made.

The ways in that see the call's arguments before generate() (``speculative()``'s generate,
``SpeculativeGenerator``, the Hub folder) take them there and never come here. Only
``custom_generate=speculative_generate`` on a plain model cannot: :func:`dropped_by_generate` reads them
from generate()'s own frame (found by its code object, read only), the names in :data:`READ`. A
transformers whose generate() no longer holds one of them fails here with an error naming its version
and the way in that needs no adapter. ``tests/test_generate_call.py`` runs it on the lowest and the
newest supported transformers.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field

import transformers
from transformers.generation.utils import GenerationMixin

#: generate()'s locals read here: its own parameters, and its ``**kwargs`` as it holds them when it calls
#: the callable (its pops done: trust_remote_code, tokenizer, the callable's own keywords)
READ = ("streamer", "assistant_model", "synced_gpus", "kwargs")
TESTED = ("5.18.0", "5.24.0")  # the transformers versions the adapter's test runs on (pyproject's range)


@dataclass(frozen=True)
class DroppedArguments:
    """What generate() was called with but kept from a custom_generate callable (all None / empty
    when the callable was not called by generate())."""

    streamer: object | None = None  # generate() has already put the prompt into it
    assistant_model: object | None = None
    synced_gpus: bool | None = None
    keywords: dict = field(default_factory=dict)  # generate()'s remaining **kwargs (a cache passed by name)


@functools.lru_cache(maxsize=1)
def _generate_code():
    """The code object of GenerationMixin.generate's own body (under its decorators)."""
    return inspect.unwrap(GenerationMixin.generate).__code__


def dropped_by_generate(max_depth: int = 5) -> DroppedArguments:
    """For a custom_generate callable, called from its own body: the arguments of the generate() call
    at most ``max_depth`` frames above it that generate() did not hand it (see the module docstring)."""
    frame = inspect.currentframe()
    code = _generate_code()
    for _ in range(max_depth + 1):
        frame = frame.f_back if frame is not None else None
        if frame is None:
            return DroppedArguments()
        if frame.f_code is code:
            return _read(frame.f_locals)
    return DroppedArguments()


def _read(local: dict) -> DroppedArguments:
    missing = [name for name in READ if name not in local]
    if missing:
        raise RuntimeError(
            f"transformers {transformers.__version__}'s generate() no longer holds {', '.join(missing)} where "
            f"opttree reads what it keeps from a custom_generate callable (tested on {' and '.join(TESTED)}): "
            f"call speculative(model).generate(..., draft_model=...) or SpeculativeGenerator instead")
    return DroppedArguments(local["streamer"], local["assistant_model"], local["synced_gpus"],
                            dict(local["kwargs"] or {}))


__all__ = ["READ", "TESTED", "DroppedArguments", "dropped_by_generate"]
