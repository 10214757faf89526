"""A head written as a folder that vLLM's and SGLang's EAGLE loaders read (:func:`export_draft`), and
read back by :mod:`.eagle_folder` to the same q, bit for bit.

``layout="eagle3"`` writes ``config.json`` (``LlamaForCausalLMEagle3``, the head's own shapes,
``draft_vocab_size``, ``norm_before_residual`` always written, ``target_hidden_size`` where H != h,
layer ids only where the taps differ from the default (2, L//2, L-3): vLLM's at the top level and
SGLang's, each less 1, in ``eagle_config`` (:func:`~.layer_ids.written_ids`), the target's layer
count under ``opttree``) and ``model.safetensors`` with
``midlayer.*`` names (SGLang's loader knows only those; vLLM renames them), ``fc``, ``norm``,
``lm_head``, ``d2t`` and ``t2d`` (and ``embed_tokens`` where the head has its own); a scaled RoPE's
fields (``rope_scaling`` or ``rope_parameters``, ``max_position_embeddings``...) as they were read.
``layout="eagle1"`` writes an EAGLE-1/2 head as EAGLE's own folder (``LlamaForCausalLM``, ``fc``,
``layers.N.*``). Weights in the dtype of the folder the head was read from, or the one asked for; into a
new or empty folder only, written whole (a stale file beside them would be read instead). opttree's own
feature head has no such form: refused, naming each part that has none.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..drafters.head.feature_head import FeatureHead
from ..drafters.head.eagle import EAGLE1, EAGLE3, EagleConfig, EagleHead
from .eagle_folder import CONFIG_FILE, SAFETENSORS
from .layer_ids import RECORD, RECORD_LAYERS, written_ids
from .files import check_new_folder, written_whole

LAYOUTS = (EAGLE3, EAGLE1)


def unrepresentable(head: FeatureHead) -> list[str]:
    """What an opttree feature head has that neither EAGLE layout can hold."""
    c = head.c
    parts = ["its entry mixes the embedding and the feature in fc and reads the mixture through the layer's "
             "input norm, with the mixture as the residual (EAGLE-3 norms the embedding and the feature apart "
             "inside q/k/v, the feature alone the residual; EAGLE-1 has no input norm)",
             "it feeds back the normed prediction and reads it with the target's output rows (EAGLE-3 feeds "
             "back the pre-norm output and has its own lm_head)"]
    if c.out_rank is not None:
        parts.append("its trained correction of the target's output rows"
                     + (f" (rank {c.out_rank})" if c.out_rank else " (full)"))
    if bool(head.out_bias.detach().ne(0).any()):
        parts.append("its output bias")
    if c.num_layers > 1:
        parts.append(f"its {c.num_layers} decoder layers")
    return parts


def eagle3_config(c: EagleConfig, dtype: torch.dtype) -> dict:
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": c.hidden_size,
              "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim,
              "intermediate_size": c.intermediate_size, "num_hidden_layers": 1, "vocab_size": c.vocab_size,
              "draft_vocab_size": c.draft_vocab_size, "rms_norm_eps": c.rms_eps, "rope_theta": c.rope_theta,
              "hidden_act": "silu", "attention_bias": c.qkv_bias, "tie_word_embeddings": False,
              "norm_before_residual": c.norm_before_residual, "torch_dtype": str(dtype).removeprefix("torch.")}
    config.update(rope_settings(c))
    if c.target_hidden_size != c.hidden_size:
        config["target_hidden_size"] = c.target_hidden_size
    config.update(written_ids(c.taps, c.target_layers))
    config[RECORD] = {RECORD_LAYERS: c.target_layers}  # the engines ignore it; the loader checks it
    return config


def eagle1_config(c: EagleConfig, dtype: torch.dtype) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": c.hidden_size,
            "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim,
            "intermediate_size": c.intermediate_size, "num_hidden_layers": c.num_layers, "vocab_size": c.vocab_size,
            "rms_norm_eps": c.rms_eps, "rope_theta": c.rope_theta, "hidden_act": "silu", "bias": c.fc_bias,
            "qkv_bias": c.qkv_bias, "torch_dtype": str(dtype).removeprefix("torch."), **rope_settings(c)}


def rope_settings(c: EagleConfig) -> dict:
    """A scaled RoPE's config.json fields as the head's folder held them (none for the default RoPE)."""
    return json.loads(c.rope_settings) if c.rope_settings else {}


#: the dtypes export writes
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def export_dtype(head: EagleHead, dtype: torch.dtype | str | None) -> torch.dtype:
    """``dtype`` (a name of :data:`DTYPES`, or its torch dtype); None: the dtype of the folder ``head`` was
    read from (``c.stored_dtype``), else the head's own. Any other is refused by name."""
    name = str(dtype or head.c.stored_dtype or head.dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise ValueError(f"dtype {name!r}: export writes {', '.join(DTYPES)}")
    return DTYPES[name]


def exported_state(head: EagleHead, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The head's tensors under the published names, floating ones in ``dtype`` (refused where a value
    exceeds its range), plus EAGLE-3's ``t2d`` [V] bool (the kept target ids)."""
    state = {}
    for key, value in head.state_dict().items():
        value = value.detach().cpu()
        if value.is_floating_point():
            cast = value.to(dtype)
            if bool((torch.isfinite(value) & ~torch.isfinite(cast)).any()):
                raise ValueError(f"{key!r} holds values beyond {str(dtype).removeprefix('torch.')}'s range (largest "
                                 f"{torch.finfo(dtype).max:g}); export it as bfloat16 or float32")
            value = cast
        state[key] = value.contiguous()
    if head.c.layout == EAGLE3:
        t2d = torch.zeros(head.c.vocab_size, dtype=torch.bool)
        t2d[head.token_ids.cpu()] = True
        state["t2d"] = t2d
    return state


def check_exportable(head, layout: str) -> None:
    """ValueError (TypeError for no head) naming why ``head`` has no form in ``layout``."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r}: export writes {' or '.join(map(repr, LAYOUTS))}")
    if isinstance(head, FeatureHead):
        raise ValueError("this opttree feature head has no EAGLE form: " + "; ".join(unrepresentable(head))
                         + ". A head must be trained in the EAGLE-3 layout to export (its export is then a rename)")
    if not isinstance(head, EagleHead):
        raise TypeError(f"export_draft takes a head returned by opttree.load_draft, not a {type(head).__name__}")
    if head.c.layout != layout:
        raise ValueError(f"this is an {head.c.layout} head: it exports as layout={head.c.layout!r}, not {layout!r}")


def exported(head, layout: str, dtype: torch.dtype | str | None) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config.json's object, the weights) of ``head`` in ``layout`` and ``dtype`` (:func:`export_draft`)."""
    check_exportable(head, layout)
    dtype = export_dtype(head, dtype)
    return (eagle3_config if layout == EAGLE3 else eagle1_config)(head.c, dtype), exported_state(head, dtype)


def write_files(folder: Path, config: dict, state: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file

    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    save_file(state, str(folder / SAFETENSORS), metadata={"format": "pt"})


def export_draft(head, folder: str | Path, layout: str = EAGLE3, dtype: torch.dtype | str | None = None) -> Path:
    """Write ``head`` (an EAGLE head loaded by :func:`opttree.load_draft`) to ``folder`` in ``layout``
    (``"eagle3"``: what vLLM and SGLang serve; ``"eagle1"``: an EAGLE-1/2 head), in ``dtype``
    (float32, bfloat16 or float16; None: the dtype of the folder it was read from). ``folder`` must be
    new or empty, and is written whole or not at all. An opttree feature head is refused, naming the
    parts no EAGLE layout holds. Returns the folder."""
    folder = Path(folder)
    check_new_folder(folder)
    config, state = exported(head, layout, dtype)
    with written_whole(folder) as partial:
        write_files(partial, config, state)
    return folder


def write_eagle_folder(head, folder: str | Path, layout: str = EAGLE3, dtype: torch.dtype | str | None = None) -> Path:
    """:func:`export_draft`'s files written into ``folder`` as it is (made where missing, other files
    left): a trainer's own output folder (``opttree distill --kind eagle3``)."""
    folder = Path(folder)
    config, state = exported(head, layout, dtype)
    folder.mkdir(parents=True, exist_ok=True)
    write_files(folder, config, state)
    return folder


__all__ = ["DTYPES", "LAYOUTS", "check_exportable", "export_draft", "unrepresentable", "write_eagle_folder"]
