"""Which target layers an EAGLE-3 head reads, as the engines read its ``config.json``
(:func:`tap_ids`), and the fields :mod:`.eagle_export` writes so that vLLM and SGLang tap the same
layers (:func:`written_ids`). Rule and sources: DESIGN.md, "EAGLE heads", Taps.

- vLLM 0.32 (``v1/worker/gpu_model_runner.py`` ``_get_eagle3_aux_layers_from_config``): the
  top-level ``eagle_aux_hidden_state_layer_ids`` if it is a non-empty list, else
  ``eagle_config.eagle_aux_hidden_state_layer_ids``, else (2, L//2, L-3). Id k is the state
  entering layer k (``hidden_states + residual`` before layer k; k = L: the last layer's output
  before the final norm); the ids are tapped once each, low to high (``EagleModelMixin``:
  ``tuple(sorted(set(layers)))``). Its ``fc`` reads as many states as ``eagle_config``'s list names,
  else 3 (``llama_eagle3.py``). A ``speculators`` config's top-level ids are lifted onto its
  ``transformer_layer_config`` (``speculators/algos.py`` ``update_eagle3``). Its V2 model runner
  (the GPU default; ``v1/worker/gpu/spec_decode/eagle/eagle3_utils.py``) reads the top level only:
  a folder whose ids are nested alone is tapped at the default layers there.
- SGLang 0.5.23 reads ``eagle_config``'s list alone and adds 1 to explicit ids on Llama, Qwen,
  Mistral, Gemma targets (``models/llama.py`` ``set_eagle3_layers_to_capture``): its id k is the
  output of layer k, vLLM's k + 1. On DeepSeek-V2 and GLM-4-MoE-Lite targets it adds 1 only when
  the first id is 1 (``deepseek_v2.py``), on gpt-oss unless the last id is L (``gpt_oss.py``); its
  defaults are vLLM's. The export cannot know the target's family: on those two, its nested list
  reads right only when the first tap is 2.

Id k is transformers' ``output_hidden_states[k]`` for k < L; its entry L is after the final norm,
so vLLM's id L is refused as not supported.
"""

from __future__ import annotations

from pathlib import Path

from ..drafters.head.eagle import default_taps

IDS = "eagle_aux_hidden_state_layer_ids"
NESTED = "eagle_config"
#: opttree's own record in an exported config.json (no engine reads it): the target's layer count
RECORD = "opttree"
RECORD_LAYERS = "target_num_hidden_layers"


def nested_config(view: dict, file: Path) -> dict:
    """``view``'s ``eagle_config`` ({} when absent); refused unless a JSON object (vLLM's
    ``llama_eagle3.py`` calls ``.get`` on it)."""
    nested = view.get(NESTED)
    if nested is None:
        return {}
    if not isinstance(nested, dict):
        raise ValueError(f"{file}: {NESTED!r} must be a JSON object, got {nested!r}")
    return nested


def listed(value, name: str, file: Path) -> list | None:
    """A field of layer ids: a list, or None where absent or empty (vLLM reads an empty one as absent)."""
    if value is None or value == []:
        return None
    if not isinstance(value, list):
        raise ValueError(f"{file}: {name} must be a list of layer ids, got {value!r}")
    return value


def check_ids(ids: list, name: str, layers: int, states: int, file: Path) -> None:
    """Each id an int in [0, layers), each once, ``states`` of them (the states vLLM's fc reads)."""
    for i in ids:
        if not isinstance(i, int) or isinstance(i, bool):
            raise ValueError(f"{file}: {name} {ids}: {i!r} is not a layer id (an integer); restore the head's "
                             "config.json")
        if i == layers:
            raise ValueError(f"{file}: {name} {ids}: id {i} is the target's last layer's output before the final "
                             f"norm (this target has {layers} layers); opttree does not support it yet: it reads "
                             f"transformers' output_hidden_states, whose entry {layers} is after the final norm")
        if not 0 <= i < layers:
            raise ValueError(f"{file}: {name} {ids}: id {i} is outside this target's {layers} layers (vLLM's id k is "
                             f"the state entering layer k, 0 <= k <= {layers}); pass the target this head was "
                             "trained for")
    twice = sorted({i for i in ids if ids.count(i) > 1})
    if twice:
        raise ValueError(f"{file}: {name} {ids} names layer {twice[0]} twice (the target has {layers} layers): vLLM "
                         f"taps each layer once, so its fc would read {len(set(ids))} states of the {states} it is "
                         "built for; restore the head's config.json")
    if len(ids) != states:
        raise ValueError(f"{file}: {name} {ids} names {len(ids)} layers (the target has {layers}), but vLLM builds "
                         f"the head's fc for {states} states ({NESTED}.{IDS}'s count, else 3); write the same "
                         f"count in both")


def tap_ids(view: dict, layers: int, file: Path) -> tuple[int, ...]:
    """The ``output_hidden_states`` indices, low to high, that vLLM taps for this head on a target of
    ``layers`` layers (module doc); anything vLLM would not tap as its fc reads it is refused by name.
    ``view``: the config as vLLM sees it (EAGLE-3: config.json; speculators: :func:`speculators_view`)."""
    nested = nested_config(view, file)
    if nested.get("use_aux_hidden_state") is False:
        raise ValueError(f"{file}: 'use_aux_hidden_state': false (an EAGLE-3 head on the last hidden state alone) is "
                         "not supported")
    top = listed(view.get(IDS), IDS, file)
    inner = listed(nested.get(IDS), f"{NESTED}.{IDS}", file)
    states = len(inner) if inner else 3
    if top or inner:
        name, ids = (IDS, top) if top else (f"{NESTED}.{IDS}", inner)
        check_ids(ids, name, layers, states, file)
        return tuple(sorted(ids))
    taps = default_taps(layers)
    if len(set(taps)) != 3 or not all(0 <= t < layers for t in taps):
        raise ValueError(f"{file}: the target has {layers} layers: the default taps 2, L//2, L-3 {list(taps)} are "
                         f"not three distinct layers of it; a head for this target names its layers in {IDS}")
    return default_ids(layers)


def default_ids(layers: int) -> tuple[int, ...]:
    """Both engines' default taps (2, L//2, L-3), low to high as vLLM taps them."""
    return tuple(sorted(default_taps(layers)))


def speculators_view(raw: dict, layer: dict) -> dict:
    """A speculators config as vLLM sees it: its ``transformer_layer_config`` with the top-level ids
    lifted onto it where non-empty (vLLM ``speculators/algos.py`` ``update_eagle3``)."""
    return {**layer, IDS: raw[IDS]} if raw.get(IDS) else layer


def check_record(raw: dict, layers: int, file: Path) -> None:
    """An opttree export's record of its target's layer count (absent elsewhere) must be this target's."""
    record = raw.get(RECORD)
    if record is None:
        return
    count = record.get(RECORD_LAYERS) if isinstance(record, dict) else None
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ValueError(f"{file}: {RECORD}.{RECORD_LAYERS} must be a positive integer, got {count!r}; restore the "
                         "head's config.json")
    if count != layers:
        raise ValueError(f"{file}: this head was exported for a target of {count} layers ({RECORD}.{RECORD_LAYERS}), "
                         f"but this target has {layers}: pass the target it was exported for")


def written_ids(taps: tuple[int, ...], layers: int) -> dict:
    """The config.json fields that make vLLM and SGLang tap ``taps`` (vLLM's ids) of a target of
    ``layers`` layers: none for the default taps (both engines' default); else vLLM's ids at the top
    level (both vLLM runners read them first, its V2 runner only them) and, under ``eagle_config``,
    each id less 1 (SGLang reads that list alone and adds 1), which also gives vLLM's fc its count."""
    if tuple(taps) == default_ids(layers):
        return {}
    return explicit_ids(taps, layers)


def explicit_ids(taps: tuple[int, ...], layers: int) -> dict:
    """:func:`written_ids`' fields even where ``taps`` are the default ones (a head whose taps are
    not chosen by the default rule, e.g. an inflated target's: :mod:`opttree.bench.inflate_head`)."""
    if max(taps) >= layers:
        raise ValueError(f"layer id {max(taps)} of a target of {layers} layers: SGLang taps only states entering a "
                         "layer (0 to L-1), so it would misread this head; it cannot be exported")
    return {IDS: list(taps), NESTED: {IDS: [t - 1 for t in taps], "use_aux_hidden_state": True}}


__all__ = ["IDS", "RECORD", "RECORD_LAYERS", "check_record", "explicit_ids", "speculators_view", "tap_ids", "written_ids"]
