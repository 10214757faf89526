"""A target inflated by :func:`opttree.inflate.inflate`: what the runtime reads of it.

An inflated model computes exactly what its source computes, in the first ``hidden_size`` entries
of a wider residual stream; the rest stay zero. Its config records the source's shape under
:data:`INFLATED_FROM`, so drafts made for the source (a feature head, a draft model sharing the
embedding) read the target's embedding, output rows and hidden states through that width
(:func:`carried_width`) and draft exactly as they do against the source.
"""

from __future__ import annotations

import torch

INFLATED_FROM = "opttree_inflated_from"  # the config attribute: the source's shape (a dict of its config fields)


def text_config(config):
    """The text model's config (a multimodal config's text part; else the config itself)."""
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def inflated_from(config) -> dict | None:
    """The source's shape recorded on an inflated model's config (None: not an inflated model)."""
    value = text_config(config).to_dict().get(INFLATED_FROM)
    return dict(value) if isinstance(value, dict) else None


def carried_width(config) -> int:
    """How many entries of the model's residual stream carry its function: the hidden size, or
    for an inflated model, its source's."""
    source = inflated_from(config)
    return int(source["hidden_size"]) if source is not None else int(text_config(config).hidden_size)


def carried_embedding(target) -> torch.nn.Module:
    """The target's input embedding as its drafts read it: the module itself, or for an inflated
    target a frozen ``nn.Embedding`` over the first :func:`carried_width` columns of its weight (a
    view: nothing is copied)."""
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


__all__ = ["INFLATED_FROM", "carried_embedding", "carried_rows", "carried_width", "inflated_from", "text_config"]
