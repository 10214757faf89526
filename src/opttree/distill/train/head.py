"""Make a :class:`~opttree.drafters.head.feature_head.FeatureHead` to train (:func:`new_head`), go on
training a saved one (:func:`continued_head`), or widen and grow one. Its folder's format (save,
load) is the runtime's: :mod:`opttree.loading.head_file`.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from ...drafters.head.feature_head import FeatureHead, HeadConfig
from ...loading import files, head_file


def new_head(target, token_ids: torch.Tensor | None = None, init_layer: int | None = None,
             num_layers: int = 1, feature_layers: tuple[int, ...] = (-1,),
             out_rank: int | None = None) -> tuple[FeatureHead, head_file.HeadMeta]:
    """An untrained head for ``target`` over ``token_ids`` [K] (default: the whole vocabulary).

    ``init_layer``: copy that decoder layer of the target into the head's last layer, and the
    ones before it into its earlier layers (Llama-style targets, whose layers have the same
    parameter names and shapes); None = random init. ``num_layers``, ``feature_layers``,
    ``out_rank``: see :class:`HeadConfig` (a fused head starts as the plain one:
    :meth:`FeatureHead.fuse`; trained output rows start as the target's).
    """
    c = replace(HeadConfig.for_target(target.config), num_layers=num_layers, feature_layers=tuple(feature_layers),
                out_rank=out_rank)
    ids = torch.arange(c.vocab_size) if token_ids is None else token_ids.cpu().long()
    head = FeatureHead(c, target.get_input_embeddings(), head_file.output_rows(target, ids), ids)
    with torch.no_grad():  # fc starts as "take the feature" (identity on that half): a sane start
        head.fc.weight.zero_()
        head.fc.weight[:, c.hidden_size:].copy_(torch.eye(c.hidden_size))
        head.fc.bias.zero_()
    if init_layer is not None:
        layers = target.get_decoder().layers
        first = init_layer % len(layers) - (num_layers - 1)
        for i, layer in enumerate([head.layer, *head.more_layers]):
            source = layers[max(first + i, 0)]
            layer.load_state_dict({k: v.float() for k, v in source.state_dict().items()})
        norm = getattr(target.get_decoder(), "norm", None)
        if norm is not None:
            head.norm.weight.data.copy_(norm.weight.detach().float())
    meta = head_file.HeadMeta(head_file.HEAD_FORMAT, c.to_dict(), init_layer, files.embedding_checksum(target),
                              str(getattr(target.config, "_name_or_path", "")))
    return head, meta


def continued_head(path: str | Path, target) -> tuple[FeatureHead, head_file.HeadMeta]:
    """A saved head and its metadata, to go on training it (float32, train mode)."""
    meta, _ = head_file.read_head_meta(Path(path))
    return head_file.load_head(path, target).train(), meta


ROW_STATE = ("out_bias", "token_ids", "out_delta", "out_delta_a")  # one row per kept token


def widened(head: FeatureHead, target, extra_ids: torch.Tensor) -> FeatureHead:
    """``head`` with ``extra_ids`` [E] added to its kept tokens: the same weights; the new
    tokens' output bias starts at the 5th percentile of the old ones (rare, not impossible) and
    their rows' trained correction (if any) at zero: the target's own rows."""
    old = head.token_ids.cpu()
    extra = extra_ids.cpu().long().unique()
    extra = extra[~torch.isin(extra, old)]
    ids, order = torch.cat([old, extra]).sort()  # kept ids stay sorted ascending
    wide = FeatureHead(head.c, head.embed[0], head_file.output_rows(target, ids), ids)
    state = {k: v for k, v in head.state_dict().items() if k not in ROW_STATE}
    wide.load_state_dict(state, strict=False)
    with torch.no_grad():
        low = torch.quantile(head.out_bias.detach().float().cpu(), 0.05)
        bias = torch.cat([head.out_bias.detach().float().cpu(), low.expand(len(extra))])
        wide.out_bias.copy_(bias[order])
        for name in ROW_STATE[2:]:
            if hasattr(head, name):
                rows = getattr(head, name).detach().float().cpu()  # [K, ...]
                getattr(wide, name).copy_(torch.cat([rows, rows.new_zeros(len(extra), *rows.shape[1:])])[order])
    return wide.to(head.device).train(head.training)


def with_trained_rows(head: FeatureHead, meta: head_file.HeadMeta, out_rank: int | None) -> tuple[FeatureHead, head_file.HeadMeta]:
    """``head`` given a trained correction of its output rows (``HeadConfig.out_rank``), starting
    at zero: it computes exactly what it did. Unchanged when ``out_rank`` is already its own;
    a head's trained rows are never dropped nor changed in shape (ValueError)."""
    c = head.c
    if out_rank == c.out_rank:
        return head, meta
    if c.out_rank is not None:
        raise ValueError(f"this head's output rows are trained with out_rank {c.out_rank}; it cannot become "
                         f"one with out_rank {out_rank}")
    new_c = replace(c, out_rank=out_rank)
    out = FeatureHead(new_c, head.embed[0], head.out_weight, head.token_ids)
    out.load_state_dict(head.state_dict(), strict=False)
    return out.to(head.device).train(head.training), replace(meta, config=new_c.to_dict())


def grown(head: FeatureHead, meta: head_file.HeadMeta, target, num_layers: int,
          feature_layers: tuple[int, ...]) -> tuple[FeatureHead, head_file.HeadMeta]:
    """``head`` with more layers and/or more fused target layers, computing exactly what it did:
    each added layer is a copy of the last one with its output projections (``o_proj``,
    ``down_proj``) zeroed, so it starts as the identity; the fusion starts at zero
    (:meth:`FeatureHead.fuse`). Unchanged when the shape already matches; never shrinks."""
    c = head.c
    feature_layers = tuple(feature_layers)
    if (num_layers, feature_layers) == (c.num_layers, c.feature_layers):
        return head, meta
    if num_layers < c.num_layers or (feature_layers != c.feature_layers and len(c.feature_layers) > 1):
        raise ValueError(f"cannot turn a head of {c.num_layers} layers reading {c.feature_layers} into "
                         f"one of {num_layers} layers reading {feature_layers}")
    new_c = replace(c, num_layers=num_layers, feature_layers=feature_layers)
    big = FeatureHead(new_c, head.embed[0], head.out_weight, head.token_ids)
    big.load_state_dict(head.state_dict(), strict=False)
    last = [head.layer, *head.more_layers][-1]
    with torch.no_grad():
        for layer in list(big.more_layers)[c.num_layers - 1:]:
            layer.load_state_dict(last.state_dict())
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    return big.to(head.device).train(head.training), replace(meta, config=new_c.to_dict())


__all__ = ["continued_head", "grown", "new_head", "widened", "with_trained_rows"]
