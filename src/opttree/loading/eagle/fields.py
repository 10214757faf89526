"""The config.json fields every EAGLE layout reads alike: a checked number (:func:`field`) and the
head's own RoPE (:func:`rope`, written back by :func:`rope_settings`). Rules: DESIGN.md, "EAGLE heads"."""

from __future__ import annotations

import json
import math
from pathlib import Path

from ...hf.compat import STATIC_ROPE_TYPES, scaled_rope

CONFIG_FILE = "config.json"
#: the config.json fields that set a scaled RoPE beside rope_theta and the shapes (export writes them back)
ROPE_SETTINGS = ("rope_scaling", "rope_parameters", "max_position_embeddings", "original_max_position_embeddings",
                 "partial_rotary_factor")


#: what a field() of each kind must be, as its refusal says it
KIND_WORDS = {bool: "a JSON boolean (true or false, unquoted)", int: "a whole number >= 1",
              float: "a finite number > 0"}


def field(config: dict, name: str, path: Path, default=None, kind=int):
    """``config[name]`` checked to be a ``kind`` (:data:`KIND_WORDS`; a missing one: ``default``, or refused
    when None)."""
    value = config.get(name)
    if value is None:
        if default is None:
            raise ValueError(f"{path / CONFIG_FILE}: missing {name!r}; restore the head's config.json")
        return default
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
    else:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    if not ok:
        raise ValueError(f"{path / CONFIG_FILE}: {name!r} must be {KIND_WORDS[kind]}, got {json.dumps(value)}; "
                         "correct the head's config.json")
    return kind(value)


def rope(config: dict, head_dim: int, path: Path) -> dict:
    """The head's own RoPE as EagleConfig fields (never the target's): ``rope_theta`` (default 10000,
    LlamaConfig's and EAGLE's); a static scaled type (linear, llama3, yarn: read as transformers reads it,
    ``rope_scaling`` before ``rope_parameters``, ``rope_type`` before ``type``) adds the frequencies and
    cos/sin scaling transformers' Llama rotary embedding computes from this config
    (:func:`opttree.hf.compat.scaled_rope`) and the fields as read. Any other type is refused by name."""
    parameters = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or parameters
    if not isinstance(parameters, dict) or not isinstance(scaling, dict):
        raise ValueError(f"{path / CONFIG_FILE}: 'rope_scaling' and 'rope_parameters' must be JSON objects")
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    theta = {"rope_theta": float(parameters.get("rope_theta", config.get("rope_theta") or 10000.0))}
    if kind == "default":
        return theta
    if kind not in STATIC_ROPE_TYPES:
        raise ValueError(f"{path / CONFIG_FILE}: RoPE of type {kind!r} is not supported for a draft head (opttree "
                         f"loads 'default', {', '.join(map(repr, STATIC_ROPE_TYPES))}; 'dynamic' and 'longrope' "
                         "change their frequencies with the sequence length at run time)")
    try:
        frequencies, attention_scaling = scaled_rope(config)
    except (ValueError, TypeError, KeyError, ZeroDivisionError) as error:
        raise ValueError(f"{path / CONFIG_FILE}: its {kind!r} RoPE settings are incomplete or invalid "
                         f"({type(error).__name__}: {error}); restore the head's config.json") from None
    if len(frequencies) != head_dim // 2:
        raise ValueError(f"{path / CONFIG_FILE}: RoPE over {2 * len(frequencies)} of the head's {head_dim} "
                         "dimensions (partial_rotary_factor) is not supported; only the whole head")
    settings = {k: config[k] for k in ROPE_SETTINGS if config.get(k) is not None}
    return dict(theta, rope_frequencies=frequencies, rope_attention_scaling=attention_scaling,
                rope_settings=json.dumps(settings))


def rope_settings(c) -> dict:
    """A scaled RoPE's config.json fields as the head's folder held them (none for the default RoPE);
    ``c``: an EagleConfig."""
    return json.loads(c.rope_settings) if c.rope_settings else {}


__all__ = ["CONFIG_FILE", "KIND_WORDS", "ROPE_SETTINGS", "field", "rope", "rope_settings"]
