"""What each published layout's class declares beside its forward (:class:`PublishedHead`): how its
config.json is read, its weights' names mapped to the head's, the head built from the target, and
its export (or why it has none); and the shapes every layout reads alike (:func:`read_shapes`).

A layout is matched by :mod:`opttree.loading.eagle`'s registry (config.json's ``architectures``),
read by :func:`opttree.loading.eagle_folder.load_eagle` and written by
:func:`opttree.loading.eagle_export.export_draft`, neither of which names a layout.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Collection
from pathlib import Path

import torch

from ...drafters.head.eagle import EagleConfig, EagleHead
from ...hf.width import text_config
from ..layer_ids import check_record
from .fields import CONFIG_FILE, field, rope


class PublishedHead(EagleHead):
    """An EAGLE head in one published layout: its forward (:class:`EagleHead`'s hooks) and its folder."""

    kind: str = ""
    """The layout's name in messages, and the ``layout=`` :func:`~opttree.loading.eagle_export.export_draft` writes."""
    cannot_export: str | None = None
    """None: :meth:`exported` writes the head; else why it has no exported form (refused by name)."""
    note: str = ""
    """Written after each of its architectures in the refusal of an unknown one (e.g. ``" (EAGLE-1/2)"``)."""

    @classmethod
    def marked_by(cls, raw: dict) -> bool:
        """Whether config.json names this layout by a field other than ``architectures``."""
        return False

    @classmethod
    def weights_fit(cls, names: Callable[[], Collection[str]]) -> bool:
        """Whether the folder's weights (``names()``: their names, read only where this asks) are this
        layout's, for an architecture it shares with other folders; True where the name alone decides."""
        return True

    @classmethod
    @abstractmethod
    def read_config(cls, raw: dict, names: Collection[str], target, path: Path) -> EagleConfig:
        """The head's shapes from its own config.json ``raw`` (never the target's), for ``target``;
        ``names``: the weights' names. ValueError naming the file and the field otherwise."""

    @classmethod
    def key_map(cls, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The folder's weight names -> the head's (its parameters'). Default: ``t2d`` dropped (both
        engines ignore it: the columns are ``d2t``'s), every other name kept."""
        return {key: value for key, value in state.items() if key != "t2d"}

    @classmethod
    def from_target(cls, c: EagleConfig, target, d2t: torch.Tensor | None) -> PublishedHead:
        """A head of shapes ``c`` reading ``target``'s embedding (weights not loaded yet)."""
        return cls(c, target.get_input_embeddings(), d2t)

    def exported(self, dtype: torch.dtype) -> tuple[dict, dict[str, torch.Tensor]]:
        """(config.json's object for weights in ``dtype``, the weights under the published names, as they are:
        the export casts them)."""
        raise NotImplementedError(f"{type(self).__name__} declares neither its export nor why it has none")

    def check_export(self, layout: str) -> None:
        """Refused by name unless ``layout`` is this head's and it has an exported form (:meth:`exported`)."""
        if self.cannot_export is not None:
            raise ValueError(f"a {self.kind} head cannot be exported: {self.cannot_export}")
        if layout != self.kind:
            raise ValueError(f"this is an {self.kind} head: it exports as layout={self.kind!r}, not {layout!r}")


def read_shapes(raw: dict, layer: dict, names: Collection[str], target, path: Path) -> dict:
    """The EagleConfig fields every layout reads alike: the layer's shapes from ``layer`` (config.json
    itself, or the part of it holding them), the unsupported flags of ``raw`` refused, an export's
    record of its target checked (:func:`~opttree.loading.layer_ids.check_record`), the head's own RoPE."""
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
    num_layers = field(layer, "num_hidden_layers", path, default=1)
    head_dim = field(layer, "head_dim", path, default=h // heads)
    return dict(
        hidden_size=h, num_heads=heads,
        num_kv_heads=field(layer, "num_key_value_heads", path, default=heads),
        head_dim=head_dim,
        intermediate_size=field(layer, "intermediate_size", path),
        vocab_size=vocab,
        target_layers=tc.num_hidden_layers,
        rms_eps=field(layer, "rms_norm_eps", path, default=1e-6, kind=float),
        qkv_bias=bool(layer.get("attention_bias") or layer.get("qkv_bias")),
        num_layers=num_layers,
        own_embedding="embed_tokens.weight" in names,
        **rope(layer, head_dim, path),
    )


__all__ = ["PublishedHead", "read_shapes"]
