"""A model's widths: its logits' (:func:`vocab_size`, the rows of its output layer) and its carried
width, how many leading entries of its residual stream carry its function.

Any target's config may carry :data:`CARRIED_WIDTH`; a model widened with zeros (the bench's cost
stand-ins) computes its source's function in the first entries of a wider stream, and records there
how many. Drafts made for the source (a feature head, a draft model sharing the embedding) read the
target's embedding, output rows and hidden states through that width and draft exactly as they do
against the source. A config without the field carries its whole hidden size.
"""

from __future__ import annotations

import torch

CARRIED_WIDTH = "opttree_carried_width"  # the config field: an int, at most the hidden size


def text_config(config):
    """The text model's config (a multimodal config's text part; else the config itself)."""
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def vocab_size(model) -> int:
    """Rows of the model's output layer (the logits' last dimension)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and hasattr(head, "out_features"):
        return int(head.out_features)
    return int(text_config(model.config).vocab_size)


def carried_width(config) -> int:
    """How many entries of the model's residual stream carry its function: the config's
    :data:`CARRIED_WIDTH` where it has one, else its hidden size."""
    text = text_config(config)
    width = text.to_dict().get(CARRIED_WIDTH)
    return int(width) if width is not None else int(text.hidden_size)


def carried_embedding(target) -> torch.nn.Module:
    """The target's input embedding as its drafts read it: the module itself, or where the target
    carries fewer entries than its width a frozen ``nn.Embedding`` over the first
    :func:`carried_width` columns of its weight (a view: nothing is copied)."""
    embedding = target.get_input_embeddings()
    width = carried_width(target.config)
    if width == embedding.weight.shape[1]:
        return embedding
    return torch.nn.Embedding.from_pretrained(embedding.weight.detach()[:, :width], freeze=True,
                                              padding_idx=embedding.padding_idx)


def carried_rows(weight: torch.Tensor, config) -> torch.Tensor:
    """Rows of a target's output embedding [..., H] as its drafts read them: [..., carried width]."""
    width = carried_width(config)
    return weight if width == weight.shape[-1] else weight[..., :width]


__all__ = ["CARRIED_WIDTH", "carried_embedding", "carried_rows", "carried_width", "text_config", "vocab_size"]
