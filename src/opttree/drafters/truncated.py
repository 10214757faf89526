"""A weak stand-in draft: the target's own first layers (plus its final norm and LM head).

Untrained, such a draft agrees with the target only a few percent of the time (DESIGN-NOTES:
2 / 4 / 8 layers of SmolLM2-135M: 3.5 / 3.9 / 4.5 %); it exists for tests and as a baseline.
Weights are copied from the target, so the draft is independent of it afterwards.
"""

from __future__ import annotations

import copy

import torch
from transformers import AutoModelForCausalLM


def truncated_draft(target, num_layers: int):
    """A new model of the target's class with only its first ``num_layers`` decoder layers."""
    config = copy.deepcopy(target.config)
    layers_attr = next((a for a in ("num_hidden_layers", "n_layer", "num_layers") if hasattr(config, a)), None)
    if layers_attr is None or not 1 <= num_layers <= getattr(config, layers_attr):
        count = f" ({getattr(config, layers_attr)})" if layers_attr else ""
        raise ValueError(f"num_layers must be between 1 and the target's layer count{count}, got {num_layers}")
    setattr(config, layers_attr, num_layers)
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:num_layers]
    draft = AutoModelForCausalLM.from_config(config, dtype=target.dtype, attn_implementation="sdpa")
    own = draft.state_dict()
    with torch.no_grad():
        for name, tensor in target.state_dict().items():
            if name in own and own[name].shape == tensor.shape:
                own[name].copy_(tensor)
    return draft.to(target.device).eval()
