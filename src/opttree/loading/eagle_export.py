"""A head written as a folder that vLLM's and SGLang's EAGLE loaders read (:func:`export_draft`), and
read back by :mod:`.eagle_folder` to the same q, bit for bit. What a layout writes (``config.json``'s
object and the weights' published names) is its class's (:mod:`.eagle`: ``layout="eagle3"``, what
the engines serve, ``layout="eagle1"``, EAGLE's own EAGLE-1/2 folder); here the folder is written.
opttree's own feature head has no such form: refused, naming each part that has none.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..drafters.head.feature_head import FeatureHead
from .eagle import PublishedHead, export_layouts
from .eagle_folder import CONFIG_FILE, SAFETENSORS


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


def export_draft(head, folder: str | Path, layout: str = "eagle3") -> Path:
    """Write ``head`` (an EAGLE head loaded by :func:`opttree.load_draft`) to ``folder`` in ``layout``
    (``"eagle3"``: what vLLM and SGLang serve; ``"eagle1"``: an EAGLE-1/2 head; the registry's,
    :func:`~.eagle.export_layouts`), as its class writes it. An opttree feature head is refused, naming
    the parts no EAGLE layout holds. Returns the folder."""
    layouts = export_layouts()
    if layout not in layouts:
        raise ValueError(f"layout={layout!r}: export writes {' or '.join(map(repr, layouts))}")
    if isinstance(head, FeatureHead):
        raise ValueError("this opttree feature head has no EAGLE form: " + "; ".join(unrepresentable(head))
                         + ". A head must be trained in the EAGLE-3 layout to export (its export is then a rename)")
    if not isinstance(head, PublishedHead):
        raise TypeError(f"export_draft takes a head returned by opttree.load_draft, not a {type(head).__name__}")
    config, state = head.export_form(layout)  # another layout than the head's, or one with no export: refused
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    save_file(state, str(folder / SAFETENSORS), metadata={"format": "pt"})
    return folder


__all__ = ["export_draft", "unrepresentable"]
