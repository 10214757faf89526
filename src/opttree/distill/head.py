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
from .files import (COUNT, INDEX_OR_NULL, INTEGERS, META_FILE, NUMBER, OBJECT, POSITIVE, TEXT, WEIGHTS_FILE,
                    check_format, embedding_checksum, embedding_matches, first_problem, parse_meta, read_meta, read_weights,
                    weights_mismatch)

logger = logging.getLogger(__name__)

HEAD_FORMAT = "opttree-feature-head/1"


@dataclass(frozen=True)
class HeadMeta:
    format: str
    config: dict  # HeadConfig fields
    init_layer: int | None
    target_embedding_checksum: float
    target_name: str = ""


# what each key of a head's META_FILE (and of its "config" object) must hold
META_KINDS = {"format": TEXT, "config": OBJECT, "init_layer": INDEX_OR_NULL, "target_embedding_checksum": NUMBER,
              "target_name": TEXT}
CONFIG_KINDS = {"hidden_size": COUNT, "num_heads": COUNT, "num_kv_heads": COUNT, "head_dim": COUNT,
                "intermediate_size": COUNT, "vocab_size": COUNT, "rms_eps": POSITIVE, "rope_theta": POSITIVE,
                "num_layers": COUNT, "feature_layers": INTEGERS}


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
    """Whether ``path`` is a saved head (by its META_FILE's format; ValueError if that file is junk)."""
    path = Path(path)
    return (path / META_FILE).is_file() and read_meta(path).get("format") == HEAD_FORMAT


def read_head_meta(path: Path) -> tuple[HeadMeta, HeadConfig]:
    """A saved head's metadata and shapes, every key checked (ValueError naming the file)."""
    meta = parse_meta(HeadMeta, read_meta(path), META_KINDS, str(path / META_FILE))
    check_format(meta.format, (HEAD_FORMAT,), path)
    return meta, parse_meta(HeadConfig, meta.config, CONFIG_KINDS, f"{path / META_FILE} ('config')")


def load_head(path: str | Path, target) -> FeatureHead:
    """A saved head completed from ``target`` (its embedding and output rows), eval, float32,
    on the device of the target's input embedding."""
    path = Path(path)
    meta, c = read_head_meta(path)
    config = target.config.get_text_config() if hasattr(target.config, "get_text_config") else target.config
    if (config.hidden_size, config.vocab_size) != (c.hidden_size, c.vocab_size):
        raise ValueError(
            f"{path} is a feature head for a target with hidden size {c.hidden_size} and vocabulary "
            f"{c.vocab_size}; this target has {config.hidden_size} and {config.vocab_size}: pass the "
            "target it was trained on, or train one for this target with `opttree distill --kind head`"
        )
    if not embedding_matches(target, meta.target_embedding_checksum):
        logger.warning("%s: the target's embedding differs from the one the head was trained on", path)
    state = read_weights(path)
    ids = state.get("token_ids")
    if ids is None or ids.dim() != 1 or len(ids) == 0 or int(ids.min()) < 0 or int(ids.max()) >= c.vocab_size:
        raise weights_mismatch(path, f"'token_ids' must list kept tokens of the {c.vocab_size}-token vocabulary")
    ids = ids.long()
    head = FeatureHead(c, target.get_input_embeddings(), output_rows(target, ids), ids)
    try:
        head.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()})
    except RuntimeError as error:  # shapes or names that the metadata does not describe
        raise weights_mismatch(path, first_problem(error)) from None
    return head.to(target.get_input_embeddings().weight.device).eval()


def continued_head(path: str | Path, target) -> tuple[FeatureHead, HeadMeta]:
    """A saved head and its metadata, to go on training it (float32, train mode)."""
    meta, _ = read_head_meta(Path(path))
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
