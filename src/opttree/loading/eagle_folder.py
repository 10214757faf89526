"""A published EAGLE head's folder read (:func:`load_eagle`): ``config.json`` and ``model.safetensors``
(or ``pytorch_model.bin``, read with ``torch.load(weights_only=True)``: nothing runs) -> an
:class:`~opttree.drafters.head.eagle.EagleHead` completed from the target. Three layouts:

- EAGLE-3: ``architectures`` ``LlamaForCausalLMEagle3`` or ``Eagle3LlamaForCausalLM``; keys
  ``midlayer.*`` or ``layers.0.*``; ``norm_before_residual`` false unless the config says true;
- ``speculators``: ``Eagle3Speculator`` with ``transformer_layer_config`` (the layer's shapes) and
  its own ``embed_tokens``; ``norm_before_residual`` true unless the config says false (vLLM's rule);
- EAGLE-1/2: a plain ``*ForCausalLM`` config with ``fc.weight`` [h, 2h] and ``layers.N.*``.

Rules and sources: DESIGN.md, "EAGLE heads". Everything that does not fit is a ValueError that names
the file, the key or the field, and the fix.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import torch

from ..drafters.head.eagle import EAGLE1, EAGLE3, EagleConfig, EagleHead
from ..hf.compat import STATIC_ROPE_TYPES, scaled_rope
from ..hf.width import text_config
from .layer_ids import check_record, speculators_view, tap_ids
from .pickled import read_pickled

CONFIG_FILE = "config.json"
SAFETENSORS = "model.safetensors"
PICKLED = "pytorch_model.bin"
EAGLE3_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")
SPECULATORS_ARCHITECTURE = "Eagle3Speculator"
SPECULATORS = "speculators"  # the folder's layout; the head's is EAGLE3
PLAIN_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM", "Qwen3ForCausalLM")
KNOWN = (*EAGLE3_ARCHITECTURES, SPECULATORS_ARCHITECTURE, *(f"{a} (EAGLE-1/2)" for a in PLAIN_ARCHITECTURES))


def is_eagle_folder(path: Path) -> bool:
    """Whether ``path`` is a folder with a ``config.json`` (read here, not by the opttree formats)."""
    return (path / CONFIG_FILE).is_file()


def is_eagle_head(path: Path) -> bool:
    """Whether ``path`` is a folder of a head this module reads (its config.json names an EAGLE layout,
    or a plain architecture whose weights are an EAGLE-1/2 head's); False for any other folder."""
    if not is_eagle_folder(path):
        return False
    try:
        raw = read_config(path)
        layout = folder_layout(raw, path)
        return layout != EAGLE1 or folder_layout(raw, path, weight_names(path)) == EAGLE1
    except ValueError:
        return False


def weight_names(path: Path) -> dict:
    """The weights' names (values None) read from the safetensors header alone, else the whole pickle."""
    if (path / SAFETENSORS).is_file():
        from safetensors import safe_open

        with safe_open(str(path / SAFETENSORS), framework="pt") as f:
            return dict.fromkeys(f.keys())
    return read_state(path)


def read_config(path: Path) -> dict:
    """The JSON object in ``path``'s config.json; ValueError naming the file otherwise."""
    file = path / CONFIG_FILE
    try:
        data = json.loads(file.read_text())
    except FileNotFoundError:
        raise ValueError(f"{file} is missing: {path} is not an EAGLE head's folder") from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as error:
        raise ValueError(f"could not read {file} as JSON ({error}); restore the head's config.json") from None
    if not isinstance(data, dict):
        raise ValueError(f"{file} must hold a JSON object; restore the head's config.json")
    return data


def read_state(path: Path) -> dict[str, torch.Tensor]:
    """The head's tensors: model.safetensors, else pytorch_model.bin (:func:`.pickled.read_pickled`: through
    ``torch.load(weights_only=True)``, a file of another kind, or a pickle of more than tensors, refused by name)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if (path / SAFETENSORS).is_file():
        try:
            return load_file(str(path / SAFETENSORS))
        except (OSError, SafetensorError) as error:
            raise ValueError(f"could not read {path / SAFETENSORS} ({error}); restore the head's weights") from None
    if not (path / PICKLED).is_file():
        raise ValueError(f"{path} holds neither {SAFETENSORS} nor {PICKLED}: an EAGLE head's folder needs its weights")
    return read_pickled(path / PICKLED)


def folder_layout(raw: dict, path: Path, state: dict | None = None) -> str:
    """EAGLE3, SPECULATORS or EAGLE1, from the config's architectures (and, for a plain
    architecture, the weights: an EAGLE-1/2 head has ``fc.weight`` and no ``lm_head``); an unknown
    one is refused by name. ``state`` None: the weights are not read yet (a plain architecture passes)."""
    architectures = raw.get("architectures") or []
    if SPECULATORS_ARCHITECTURE in architectures or raw.get("speculators_model_type") == "eagle3":
        return SPECULATORS
    if any(a in EAGLE3_ARCHITECTURES for a in architectures):
        return EAGLE3
    plain = any(a in PLAIN_ARCHITECTURES for a in architectures)
    if plain and (state is None or ("fc.weight" in state and "lm_head.weight" not in state)):
        return EAGLE1
    raise ValueError(f"{path / CONFIG_FILE}: {architectures!r} is no draft head's architecture (opttree reads "
                     f"{', '.join(KNOWN)}); a draft model's folder: load it yourself and pass the model, e.g. "
                     "AutoModelForCausalLM.from_pretrained(path, attn_implementation='sdpa')")


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


#: the config.json fields that set a scaled RoPE beside rope_theta and the shapes (export writes them back)
ROPE_SETTINGS = ("rope_scaling", "rope_parameters", "max_position_embeddings", "original_max_position_embeddings",
                 "partial_rotary_factor")


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


def eagle_config(raw: dict, layout: str, state: dict, target, path: Path) -> EagleConfig:
    """The head's shapes from its own config.json (never the target's), its taps resolved for ``target``."""
    layer = raw.get("transformer_layer_config") if layout == SPECULATORS else raw
    if not isinstance(layer, dict):
        raise ValueError(f"{path / CONFIG_FILE}: 'transformer_layer_config' must be a JSON object")
    if layout == SPECULATORS and layer.get("model_type", "llama") != "llama":
        raise ValueError(f"{path / CONFIG_FILE}: a speculators head on a {layer.get('model_type')!r} layer is not "
                         "supported yet (its q/k norms); only 'llama' layers")
    for flag in ("norm_before_fc", "fc_norm", "norm_output"):
        if raw.get(flag):
            raise ValueError(f"{path / CONFIG_FILE}: {flag!r}: true is not supported yet")
    if layer.get("hidden_act", "silu") != "silu":
        raise ValueError(f"{path / CONFIG_FILE}: hidden_act {layer.get('hidden_act')!r}: only 'silu' is supported")
    h = field(layer, "hidden_size", path)
    heads = field(layer, "num_attention_heads", path)
    vocab = field(layer, "vocab_size", path)
    tc = text_config(target.config)
    check_record(raw, tc.num_hidden_layers, path / CONFIG_FILE)
    head_layout = EAGLE1 if layout == EAGLE1 else EAGLE3
    view = speculators_view(raw, layer) if layout == SPECULATORS else raw
    num_layers = field(layer, "num_hidden_layers", path, default=1)
    if head_layout == EAGLE3 and num_layers != 1:
        raise ValueError(f"{path / CONFIG_FILE}: an EAGLE-3 head of {num_layers} layers is not supported (one layer)")
    bias = raw.get("bias", True)
    head_dim = field(layer, "head_dim", path, default=h // heads)
    return EagleConfig(
        layout=head_layout, hidden_size=h, num_heads=heads,
        num_kv_heads=field(layer, "num_key_value_heads", path, default=heads),
        head_dim=head_dim,
        intermediate_size=field(layer, "intermediate_size", path),
        vocab_size=vocab,
        draft_vocab_size=field(raw, "draft_vocab_size", path, default=vocab) if head_layout == EAGLE3 else vocab,
        target_hidden_size=field(raw, "target_hidden_size", path, default=h) if head_layout == EAGLE3 else h,
        target_layers=tc.num_hidden_layers,
        taps=tap_ids(view, tc.num_hidden_layers, path / CONFIG_FILE) if head_layout == EAGLE3 else (-1,),
        rms_eps=field(layer, "rms_norm_eps", path, default=1e-6, kind=float),
        norm_before_residual=field(raw, "norm_before_residual", path, default=layout == SPECULATORS, kind=bool),
        fc_bias=head_layout == EAGLE1 and bias is not False,
        qkv_bias=bool(layer.get("attention_bias") or layer.get("qkv_bias")),
        num_layers=num_layers,
        own_embedding="embed_tokens.weight" in state,
        **rope(layer, head_dim, path),
    )


def stored_dtype(state: dict[str, torch.Tensor]) -> str:
    """The one floating dtype of a folder's tensors ("float16", ...); "" where they mix dtypes."""
    kinds = {str(v.dtype).removeprefix("torch.") for v in state.values() if v.is_floating_point()}
    return kinds.pop() if len(kinds) == 1 else ""


def check_target(c: EagleConfig, target, path: Path) -> None:
    """The target's hidden size and vocabulary must be the head's (its layer count fits its taps,
    :func:`~.layer_ids.tap_ids`, and an export's record of it); an EAGLE-3 head on the target's
    embedding needs h == H."""
    tc = text_config(target.config)
    if (tc.hidden_size, tc.vocab_size) != (c.target_hidden_size, c.vocab_size):
        raise ValueError(f"{path} is an EAGLE head for a target with hidden size {c.target_hidden_size} and vocabulary "
                         f"{c.vocab_size}; this target has {tc.hidden_size} and {tc.vocab_size}: pass the target it was "
                         "trained for")
    if not c.own_embedding and c.hidden_size != tc.hidden_size:
        raise ValueError(f"{path}: the head's hidden size {c.hidden_size} differs from the target's {tc.hidden_size} and "
                         "the folder has no embed_tokens.weight of its own; restore the head's embedding")


def canonical(state: dict[str, torch.Tensor], layout: str) -> dict[str, torch.Tensor]:
    """The folder's key names -> the head's: EAGLE-3's ``layers.0.`` (ModelOpt, speculators, vLLM) ->
    ``midlayer.`` (EAGLE's own and SGLang's); ``t2d`` dropped (both engines ignore it: the columns
    are ``d2t``'s)."""
    out = {}
    for key, value in state.items():
        if key == "t2d":
            continue
        if layout != EAGLE1 and key.startswith("layers.0."):
            key = "midlayer." + key[len("layers.0."):]
        out[key] = value
    return out


def check_state(head: EagleHead, state: dict[str, torch.Tensor], path: Path) -> None:
    """Every key the head has, of its shape, and no other; ValueError naming the key (and both shapes)."""
    expected = head.state_dict()
    optional = {"d2t"} if head.c.draft_vocab_size == head.c.vocab_size else set()
    missing = sorted(set(expected) - set(state) - optional)
    if missing:
        raise ValueError(f"{path}: the head's weights lack {missing[0]!r}" + (f" (and {len(missing) - 1} more)"
                         if len(missing) > 1 else "") + "; restore the head's weights")
    unknown = sorted(set(state) - set(expected))
    if unknown:
        raise ValueError(f"{path}: unknown key {unknown[0]!r} in the head's weights (a {head.c.layout} head of this "
                         "config.json has none such); check the config.json matches the weights")
    for key, value in state.items():
        if tuple(value.shape) != tuple(expected[key].shape):
            raise ValueError(f"{path}: {key!r} has shape {list(value.shape)}, but the head its config.json describes "
                             f"needs {list(expected[key].shape)}; restore the matching config.json or weights")


def check_columns(c: EagleConfig, d2t: torch.Tensor, path: Path) -> None:
    """``d2t`` is an offset: target id = draft id + d2t[draft id], each in the vocabulary, all distinct."""
    ids = torch.arange(c.draft_vocab_size) + d2t.long()
    if int(ids.min()) < 0 or int(ids.max()) >= c.vocab_size or len(torch.unique(ids)) != len(ids):
        raise ValueError(f"{path}: 'd2t' must map each draft id j to a distinct target id j + d2t[j] in "
                         f"[0, {c.vocab_size}); restore the head's weights")


def load_eagle(path: str | Path, target) -> EagleHead:
    """The EAGLE head in folder ``path`` completed from ``target`` (its embedding, and EAGLE-1's output
    rows), eval, float32, on the device of the target's input embedding."""
    path = Path(path)
    raw = read_config(path)
    folder_layout(raw, path)  # an unknown architecture is refused before any weight is read
    state = read_state(path)
    layout = folder_layout(raw, path, state)
    c = eagle_config(raw, layout, state, target, path)
    c = replace(c, stored_dtype=stored_dtype(state))
    check_target(c, target, path)
    state = canonical(state, layout)
    if "d2t" in state:
        if tuple(state["d2t"].shape) != (c.draft_vocab_size,):
            raise ValueError(f"{path}: 'd2t' has shape {list(state['d2t'].shape)}, but the head its config.json "
                             f"describes needs [{c.draft_vocab_size}]; restore the matching config.json or weights")
        check_columns(c, state["d2t"], path)
    out_weight = None
    if c.layout == EAGLE1:
        lm_head = target.get_output_embeddings()
        if lm_head is None:
            raise ValueError("an EAGLE-1/2 head reads the target's lm_head, and this target has none")
        out_weight = lm_head.weight.detach()
    head = EagleHead(c, target.get_input_embeddings(), out_weight, state.get("d2t"))
    check_state(head, state, path)
    head.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()}, strict=False)
    return head.to(target.get_input_embeddings().weight.device).eval()


__all__ = ["CONFIG_FILE", "is_eagle_folder", "is_eagle_head", "load_eagle", "read_config", "read_state"]
