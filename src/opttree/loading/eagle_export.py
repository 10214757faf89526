"""A head written as a folder that vLLM's and SGLang's EAGLE loaders read (:func:`export_draft`), and
read back by :mod:`.eagle_folder` to the same q, bit for bit. What a layout writes (``config.json``'s
object and the weights' published names) is its class's (:mod:`.eagle`: ``layout="eagle3"``, what
the engines serve, ``layout="eagle1"``, EAGLE's own EAGLE-1/2 folder); here the folder is written.
Weights in the dtype of the folder the head was read from, or the one asked for; into a new or empty
folder only, written whole (a stale file beside them would be read instead). opttree's own feature
head has no such form: refused, naming each part that has none.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..drafters.head.feature_head import FeatureHead
from .eagle import PublishedHead, export_layouts
from .eagle_folder import CONFIG_FILE, SAFETENSORS
from .files import check_new_folder, written_whole


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


#: the dtypes export writes
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def export_dtype(head: PublishedHead, dtype: torch.dtype | str | None) -> torch.dtype:
    """``dtype`` (a name of :data:`DTYPES`, or its torch dtype); None: the dtype of the folder ``head`` was
    read from (``c.stored_dtype``), else the head's own. Any other is refused by name."""
    name = str(dtype or head.c.stored_dtype or head.dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise ValueError(f"dtype {name!r}: export writes {', '.join(DTYPES)}")
    return DTYPES[name]


def cast_state(state: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The published weights, floating ones in ``dtype`` (refused where a value exceeds its range)."""
    out = {}
    for key, value in state.items():
        value = value.detach().cpu()
        if value.is_floating_point():
            cast = value.to(dtype)
            if bool((torch.isfinite(value) & ~torch.isfinite(cast)).any()):
                raise ValueError(f"{key!r} holds values beyond {str(dtype).removeprefix('torch.')}'s range (largest "
                                 f"{torch.finfo(dtype).max:g}); export it as bfloat16 or float32")
            value = cast
        out[key] = value.contiguous()
    return out


def check_exportable(head, layout: str) -> None:
    """ValueError (TypeError for no head) naming why ``head`` has no form in ``layout``."""
    layouts = export_layouts()
    if layout not in layouts:
        raise ValueError(f"layout={layout!r}: export writes {' or '.join(map(repr, layouts))}")
    if isinstance(head, FeatureHead):
        raise ValueError("this opttree feature head has no EAGLE form: " + "; ".join(unrepresentable(head))
                         + ". A head must be trained in the EAGLE-3 layout to export (its export is then a rename)")
    if not isinstance(head, PublishedHead):
        raise TypeError(f"export_draft takes a head returned by opttree.load_draft, not a {type(head).__name__}")
    head.check_export(layout)  # another layout than the head's, or one with no export: refused by name


def exported(head, layout: str, dtype: torch.dtype | str | None) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config.json's object, the weights) of ``head`` in ``layout`` and ``dtype`` (:func:`export_draft`)."""
    check_exportable(head, layout)
    dtype = export_dtype(head, dtype)
    config, state = head.exported(dtype)  # the class's: config.json's object, the weights' published names
    return config, cast_state(state, dtype)


def write_files(folder: Path, config: dict, state: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file

    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    save_file(state, str(folder / SAFETENSORS), metadata={"format": "pt"})


def export_draft(head, folder: str | Path, layout: str = "eagle3", dtype: torch.dtype | str | None = None) -> Path:
    """Write ``head`` (an EAGLE head loaded by :func:`opttree.load_draft`) to ``folder`` in ``layout``
    (``"eagle3"``: what vLLM and SGLang serve; ``"eagle1"``: an EAGLE-1/2 head; the registry's,
    :func:`~.eagle.export_layouts`), as its class writes it, in ``dtype``
    (float32, bfloat16 or float16; None: the dtype of the folder it was read from). ``folder`` must be
    new or empty, and is written whole or not at all. An opttree feature head is refused, naming the
    parts no EAGLE layout holds. Returns the folder."""
    folder = Path(folder)
    check_new_folder(folder)
    config, state = exported(head, layout, dtype)
    with written_whole(folder) as partial:
        write_files(partial, config, state)
    return folder


def write_eagle_folder(head, folder: str | Path, layout: str = "eagle3", dtype: torch.dtype | str | None = None) -> Path:
    """:func:`export_draft`'s files written into ``folder`` as it is (made where missing, other files
    left): a trainer's own output folder (``opttree distill --kind eagle3``)."""
    folder = Path(folder)
    config, state = exported(head, layout, dtype)
    folder.mkdir(parents=True, exist_ok=True)
    write_files(folder, config, state)
    return folder


__all__ = ["DTYPES", "check_exportable", "export_draft", "unrepresentable", "write_eagle_folder"]
