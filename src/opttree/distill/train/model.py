"""A new draft model to train: some of the target's layers copied, a kept vocabulary
(:func:`init_draft`). Its folder's format (save, load) and its modules are the runtime's:
:mod:`opttree.loading.draft_model`.
"""

from __future__ import annotations

import torch

from ...loading import draft_model, files


def init_draft(target, init_layers: list[int], token_ids: torch.Tensor):
    """A new draft: target layers ``init_layers`` copied, kept vocabulary ``token_ids`` [K]."""
    meta = draft_model.DraftMeta(
        format=draft_model.FORMAT, init_layers=list(init_layers), num_kept_tokens=int(token_ids.numel()),
        target_vocab_size=target.config.vocab_size, target_hidden_size=target.config.hidden_size,
        target_embedding_checksum=files.embedding_checksum(target),
        target_name=str(getattr(target.config, "_name_or_path", "")),
    )
    draft = draft_model.build_draft(target, meta, token_ids=token_ids)
    for j, i in enumerate(init_layers):
        draft.model.layers[j].load_state_dict(target.model.layers[i].state_dict())
    draft.model.norm.load_state_dict(target.model.norm.state_dict())
    return draft, meta


__all__ = ["init_draft"]
