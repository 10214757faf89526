"""speculators' EAGLE-3 folder (:class:`SpeculatorsHead`): ``architectures`` ``Eagle3Speculator``
(or ``speculators_model_type`` ``"eagle3"``), the layer's shapes under ``transformer_layer_config``
(a ``llama`` layer), its own ``embed_tokens``, the layer ids read as vLLM reads them
(:func:`~opttree.loading.layer_ids.speculators_view`), ``norm_before_residual`` true unless the
config says false (vLLM's rule), keys as EAGLE-3's. The forward is EAGLE-3's; so is its export
(vLLM ``speculators/algos.py``, speculators c05b95b ``model_definitions.py``).
"""

from __future__ import annotations

from pathlib import Path

from ..layer_ids import speculators_view
from .eagle3 import Eagle3Head
from .fields import CONFIG_FILE


class SpeculatorsHead(Eagle3Head):
    """An EAGLE-3 head read from a speculators folder (it exports as EAGLE-3)."""

    norm_before_residual = True

    @classmethod
    def marked_by(cls, raw: dict) -> bool:
        return raw.get("speculators_model_type") == "eagle3"

    @classmethod
    def layer_config(cls, raw: dict, path: Path) -> dict:
        """``transformer_layer_config``: a JSON object of a ``llama`` layer."""
        layer = raw.get("transformer_layer_config")
        if not isinstance(layer, dict):
            raise ValueError(f"{path / CONFIG_FILE}: 'transformer_layer_config' must be a JSON object")
        if layer.get("model_type", "llama") != "llama":
            raise ValueError(f"{path / CONFIG_FILE}: a speculators head on a {layer.get('model_type')!r} layer is "
                             "not supported yet (its q/k norms); only 'llama' layers")
        return layer

    @classmethod
    def ids_view(cls, raw: dict, layer: dict) -> dict:
        return speculators_view(raw, layer)


__all__ = ["SpeculatorsHead"]
