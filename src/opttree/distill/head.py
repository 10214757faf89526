"""Make, save and load a :class:`~opttree.drafters.feature_head.FeatureHead` (EAGLE-style draft).

A saved head is a folder with ``opttree_draft.json`` (format tag, shapes, target fingerprint) and
``model.safetensors`` holding only what the target cannot rebuild: fc, the layer, the norm, the
output bias and the kept token ids. The embedding and the output rows come from the target at
load time (:func:`load_head`, or :func:`opttree.distill.load_draft` which dispatches on the
format).
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from ..drafters.feature_head import FeatureHead, HeadConfig
from .files import META_FILE, WEIGHTS_FILE, embedding_checksum

logger = logging.getLogger(__name__)

HEAD_FORMAT = "opttree-feature-head/1"


@dataclass(frozen=True)
class HeadMeta:
    format: str
    config: dict  # HeadConfig fields
    init_layer: int | None
    target_embedding_checksum: float
    target_name: str = ""


def output_rows(target, token_ids: torch.Tensor) -> torch.Tensor:
    """Rows [K, H] of the target's output embedding for ``token_ids`` [K]."""
    head = target.get_output_embeddings()
    if head is None or getattr(head, "weight", None) is None:
        raise ValueError("a feature head needs a target with an output embedding (lm_head) to share")
    return head.weight[token_ids.to(head.weight.device)].detach().float().cpu()


def new_head(target, token_ids: torch.Tensor | None = None, init_layer: int | None = None,
             num_layers: int = 1, feature_layers: tuple[int, ...] = (-1,)) -> tuple[FeatureHead, HeadMeta]:
    """An untrained head for ``target`` over ``token_ids`` [K] (default: the whole vocabulary).

    ``init_layer``: copy that decoder layer of the target into the head's last layer, and the
    ones before it into its earlier layers (Llama-style targets, whose layers have the same
    parameter names and shapes); None = random init. ``num_layers``, ``feature_layers``: see
    :class:`HeadConfig` (a fused head starts as the plain one: :meth:`FeatureHead.fuse`).
    """
    c = replace(HeadConfig.for_target(target.config), num_layers=num_layers, feature_layers=tuple(feature_layers))
    ids = torch.arange(c.vocab_size) if token_ids is None else token_ids.cpu().long()
    head = FeatureHead(c, target.get_input_embeddings(), output_rows(target, ids), ids)
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
    meta = HeadMeta(HEAD_FORMAT, c.to_dict(), init_layer, embedding_checksum(target),
                    str(getattr(target.config, "_name_or_path", "")))
    return head, meta


def save_head(head: FeatureHead, meta: HeadMeta, path: str | Path, dtype: torch.dtype = torch.float16) -> Path:
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / META_FILE).write_text(json.dumps(asdict(meta), indent=2) + "\n")
    state = {k: (v.to(dtype) if v.is_floating_point() else v).detach().contiguous().cpu()
             for k, v in head.state_dict().items()}
    save_file(state, str(path / WEIGHTS_FILE), metadata={"format": HEAD_FORMAT})
    return path


def is_head(path: str | Path) -> bool:
    meta = Path(path) / META_FILE
    return meta.exists() and json.loads(meta.read_text()).get("format") == HEAD_FORMAT


def load_head(path: str | Path, target) -> FeatureHead:
    """A saved head completed from ``target`` (its embedding and output rows), eval, float32,
    on the device of the target's input embedding."""
    from safetensors.torch import load_file

    path = Path(path)
    meta = HeadMeta(**json.loads((path / META_FILE).read_text()))
    if meta.format != HEAD_FORMAT:
        raise ValueError(f"{path}: unknown format {meta.format!r} (expected {HEAD_FORMAT!r})")
    c = HeadConfig(**meta.config)
    config = target.config.get_text_config() if hasattr(target.config, "get_text_config") else target.config
    if (config.hidden_size, config.vocab_size) != (c.hidden_size, c.vocab_size):
        raise ValueError(
            f"{path} is a feature head for a target with hidden size {c.hidden_size} and vocabulary "
            f"{c.vocab_size}; this target has {config.hidden_size} and {config.vocab_size}: pass the "
            "target it was trained on, or train one for this target with `opttree distill --kind head`"
        )
    if abs(embedding_checksum(target) - meta.target_embedding_checksum) > 1e-3 * max(1.0, abs(meta.target_embedding_checksum)):
        logger.warning("%s: the target's embedding differs from the one the head was trained on", path)
    state = load_file(str(path / WEIGHTS_FILE))
    ids = state["token_ids"].long()
    head = FeatureHead(c, target.get_input_embeddings(), output_rows(target, ids), ids)
    head.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()})
    return head.to(target.get_input_embeddings().weight.device).eval()


def continued_head(path: str | Path, target) -> tuple[FeatureHead, HeadMeta]:
    """A saved head and its metadata, to go on training it (float32, train mode)."""
    meta = HeadMeta(**json.loads((Path(path) / META_FILE).read_text()))
    return load_head(path, target).train(), meta


def widened(head: FeatureHead, target, extra_ids: torch.Tensor) -> FeatureHead:
    """``head`` with ``extra_ids`` [E] added to its kept tokens: the same weights; the new
    tokens' output bias starts at the 5th percentile of the old ones (rare, not impossible)."""
    old = head.token_ids.cpu()
    extra = extra_ids.cpu().long().unique()
    extra = extra[~torch.isin(extra, old)]
    ids, order = torch.cat([old, extra]).sort()  # kept ids stay sorted ascending
    wide = FeatureHead(head.c, head.embed[0], output_rows(target, ids), ids)
    state = {k: v for k, v in head.state_dict().items() if k not in ("out_bias", "token_ids")}
    wide.load_state_dict(state, strict=False)
    with torch.no_grad():
        low = torch.quantile(head.out_bias.detach().float().cpu(), 0.05)
        bias = torch.cat([head.out_bias.detach().float().cpu(), low.expand(len(extra))])
        wide.out_bias.copy_(bias[order])
    return wide.to(head.device).train(head.training)


def grown(head: FeatureHead, meta: HeadMeta, target, num_layers: int,
          feature_layers: tuple[int, ...]) -> tuple[FeatureHead, HeadMeta]:
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
