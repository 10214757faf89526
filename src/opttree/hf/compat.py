"""The one place that knows how transformers names things that moved between its versions.

transformers 5.24 renamed a model's cache argument and generate()'s cache from ``past_key_values``
to ``cache`` (the old name still works there, with a FutureWarning on every forward). opttree calls
models and reads generate()'s model kwargs only through this module, so it passes whichever name
the installed transformers (and the model class: a remote-code model may keep the old name)
declares, and no version check lives anywhere else.

``Cache.crop`` takes a negative count since 5.23 (``kv_cache`` only ever passes one). HF assisted
generation runs on a static cache from 5.24 (before, it raises): the one thing read from the version
(:func:`assisted_takes_static_cache`; the bench's ``assisted-compiled``).

A draft head's scaled RoPE (:func:`scaled_rope`) is computed by transformers' own
``ROPE_INIT_FUNCTIONS[rope_type](config, device)`` on a ``LlamaConfig`` of the head's config.json
fields. 5.18 and 5.24 agree on both (the function's signature; ``LlamaConfig`` taking the legacy
``rope_scaling`` or ``rope_parameters``, read into ``config.rope_parameters``, ``rope_scaling`` first);
a later move of either is met here.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect

import torch
import transformers
from transformers.generation.utils import GenerateDecoderOnlyOutput

OLD_CACHE_NAME = "past_key_values"
NEW_CACHE_NAME = "cache"
ASSISTED_STATIC_FROM = "5.24.0"  # the first transformers whose assisted generation takes a static cache


def assisted_takes_static_cache() -> bool:
    """Whether this transformers' assisted generation runs on a static cache."""
    from packaging.version import Version

    return Version(transformers.__version__) >= Version(ASSISTED_STATIC_FROM)


#: generate()'s name for the cache in its model kwargs and in its output dataclasses.
GENERATE_CACHE_NAME = (
    NEW_CACHE_NAME
    if NEW_CACHE_NAME in {field.name for field in dataclasses.fields(GenerateDecoderOnlyOutput)}
    else OLD_CACHE_NAME
)

TRANSFORMERS_VERSION: str = transformers.__version__


@functools.lru_cache(maxsize=None)
def forward_cache_name(model_class: type) -> str:
    """The keyword a model class's ``forward`` takes its cache under (its declared signature
    decides; a forward that takes only ``**kwargs`` gets generate()'s name)."""
    parameters = inspect.signature(model_class.forward).parameters
    for name in (NEW_CACHE_NAME, OLD_CACHE_NAME):
        if name in parameters:
            return name
    return GENERATE_CACHE_NAME


def with_cache(model, cache) -> dict:
    """``{name: cache}`` for ``model(**inputs, **with_cache(model, cache))``."""
    return {forward_cache_name(type(model)): cache}


def cache_from_generate(model_kwargs: dict):
    """The cache a user handed to generate() (``past_key_values=`` or ``cache=``; generate()
    itself keeps it under :data:`GENERATE_CACHE_NAME`), or None."""
    for name in (GENERATE_CACHE_NAME, NEW_CACHE_NAME, OLD_CACHE_NAME):
        if model_kwargs.get(name) is not None:
            return model_kwargs[name]
    return None


USER_CACHE_NAMES = (NEW_CACHE_NAME, OLD_CACHE_NAME, "cache_params")  # what a user may hand generate() a cache as


def cache_passed(arguments: dict) -> bool:
    """Whether generate()'s keyword ``arguments`` (the user's) hand it a cache object."""
    return any(arguments.get(name) is not None for name in USER_CACHE_NAMES)


def output_cache(cache) -> dict:
    """``{name: cache}`` for generate()'s output dataclasses."""
    return {GENERATE_CACHE_NAME: cache}


#: RoPE types whose frequencies transformers computes once from the config (never from the run's length)
STATIC_ROPE_TYPES = ("linear", "llama3", "yarn")
#: the config.json fields transformers' Llama rotary embedding reads
ROPE_FIELDS = ("hidden_size", "num_attention_heads", "head_dim", "max_position_embeddings", "rope_theta",
               "rope_scaling", "rope_parameters", "partial_rotary_factor", "original_max_position_embeddings")


def scaled_rope(fields: dict) -> tuple[tuple[float, ...], float]:
    """(inverse frequencies [head_dim/2] float32, as floats; the attention scaling that multiplies cos and
    sin) that transformers' Llama rotary embedding computes for a config.json of ``fields`` (a static
    type of :data:`STATIC_ROPE_TYPES`; another is a ValueError naming it). ``fields`` is not modified."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = LlamaConfig(**{k: copy.deepcopy(fields[k]) for k in ROPE_FIELDS if fields.get(k) is not None})
    kind = (config.rope_parameters or {}).get("rope_type", "default")
    if kind not in STATIC_ROPE_TYPES:
        raise ValueError(f"RoPE of type {kind!r} has no static frequencies ({', '.join(STATIC_ROPE_TYPES)} have)")
    inverse, scaling = ROPE_INIT_FUNCTIONS[kind](config, torch.device("cpu"))
    return tuple(inverse.float().tolist()), float(scaling)


def prepared_pad_token_id(generation_config) -> int | None:
    """The pad token id generate() prepared for this call: ``_prepare_special_tokens`` resolves
    ``pad_token_id`` (the config's, else the first EOS id, with its warning) into the private
    ``_pad_token_tensor`` (transformers 5.18.0 to 5.24.0), the one generate() itself pads with."""
    pad = generation_config._pad_token_tensor
    return None if pad is None else int(pad)
