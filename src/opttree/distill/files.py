"""What a saved draft folder holds, shared by both kinds of draft (model.py, head.py)."""

from __future__ import annotations

META_FILE = "opttree_draft.json"
WEIGHTS_FILE = "model.safetensors"


def embedding_checksum(target) -> float:
    """A cheap fingerprint of the target's input embedding (warns on the wrong target)."""
    weight = target.get_input_embeddings().weight
    return float(weight[:64].double().sum().item())
