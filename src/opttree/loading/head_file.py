"""A :class:`~opttree.drafters.head.feature_head.FeatureHead`'s folder (EAGLE-style draft): save and load.

A saved head is a folder with ``opttree_draft.json`` (format tag, shapes, target fingerprint) and
``model.safetensors`` holding only what the target cannot rebuild: fc, the layer, the norm, the
output bias and the kept token ids, and, for a head whose output rows were trained
(``HeadConfig.out_rank``), their correction. The embedding and the output rows come from the target
at load time. Format tags: ``/1`` for a head on the target's own rows (what every release has
written), ``/2`` for one with trained rows (older releases refuse it by its tag); both load (:func:`load_head`, or :func:`opttree.loading.load_draft` which dispatches on the
format). Training makes a head with :func:`opttree.distill.train.head.new_head`.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from ..drafters.head.feature_head import FeatureHead, HeadConfig
from ..hf.width import carried_embedding, carried_rows, carried_width, text_config
from .files import (COUNT, INDEX_OR_NULL, INTEGERS, META_FILE, NUMBER, OBJECT, POSITIVE, REWRITE, TEXT, WEIGHTS_FILE,
                    check_format, embedding_matches, first_problem, parse_meta, read_meta, read_weights, weights_mismatch)

logger = logging.getLogger(__name__)

HEAD_FORMAT = "opttree-feature-head/1"  # the target's own output rows
HEAD_FORMAT_ROWS = "opttree-feature-head/2"  # plus trained rows (HeadConfig.out_rank)
HEAD_FORMATS = (HEAD_FORMAT, HEAD_FORMAT_ROWS)


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
                "num_layers": COUNT, "feature_layers": INTEGERS, "out_rank": INDEX_OR_NULL}


def head_format(c: HeadConfig) -> str:
    """The format tag a head of config ``c`` is saved under: ``/2`` only where its rows were trained."""
    return HEAD_FORMAT if c.out_rank is None else HEAD_FORMAT_ROWS


def output_rows(target, token_ids: torch.Tensor) -> torch.Tensor:
    """Rows [K, H] of the target's output embedding for ``token_ids`` [K]."""
    head = target.get_output_embeddings()
    if head is None or getattr(head, "weight", None) is None:
        raise ValueError("a feature head needs a target with an output embedding (lm_head) to share")
    return carried_rows(head.weight[token_ids.to(head.weight.device)], target.config).detach().float().cpu()


def save_head(head: FeatureHead, meta: HeadMeta, path: str | Path, dtype: torch.dtype = torch.float16) -> Path:
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    meta = replace(meta, format=head_format(head.c), config=head.c.to_dict())
    config = {k: v for k, v in meta.config.items() if k != "out_rank" or v is not None}  # /1 as it always was
    (path / META_FILE).write_text(json.dumps(asdict(replace(meta, config=config)), indent=2) + "\n")
    state = {k: (v.to(dtype) if v.is_floating_point() else v).detach().contiguous().cpu()
             for k, v in head.state_dict().items()}
    save_file(state, str(path / WEIGHTS_FILE), metadata={"format": meta.format})
    return path


def is_feature_head_folder(path: Path) -> bool:
    """Whether ``path``'s META_FILE names a feature head's format (its keys are checked on load)."""
    try:
        return read_meta(path).get("format") in HEAD_FORMATS
    except ValueError:
        return False


def read_head_meta(path: Path) -> tuple[HeadMeta, HeadConfig]:
    """A saved head's metadata and shapes, every key checked (ValueError naming the file)."""
    meta = parse_meta(HeadMeta, read_meta(path), META_KINDS, str(path / META_FILE))
    check_format(meta.format, HEAD_FORMATS, path)
    c = parse_meta(HeadConfig, meta.config, CONFIG_KINDS, f"{path / META_FILE} ('config')")
    if meta.format != head_format(c):
        raise ValueError(f"{path / META_FILE}: format {meta.format!r} does not match its config (out_rank "
                         f"{c.out_rank}: {head_format(c)!r}); {REWRITE}")
    return meta, c


def load_head(path: str | Path, target) -> FeatureHead:
    """A saved head completed from ``target`` (its embedding and output rows), eval, float32,
    on the device of the target's input embedding."""
    path = Path(path)
    meta, c = read_head_meta(path)
    config = text_config(target.config)
    if (carried_width(config), config.vocab_size) != (c.hidden_size, c.vocab_size):
        raise ValueError(
            f"{path} is a feature head for a target with hidden size {c.hidden_size} and vocabulary "
            f"{c.vocab_size}; this target has {carried_width(config)} and {config.vocab_size}: pass the "
            "target it was trained on, or train one for this target with `opttree distill --kind head`"
        )
    if not embedding_matches(target, meta.target_embedding_checksum):
        logger.warning("%s: the target's embedding differs from the one the head was trained on", path)
    state = read_weights(path)
    ids = state.get("token_ids")
    if ids is None or ids.dim() != 1 or len(ids) == 0 or int(ids.min()) < 0 or int(ids.max()) >= c.vocab_size:
        raise weights_mismatch(path, f"'token_ids' must list kept tokens of the {c.vocab_size}-token vocabulary")
    ids = ids.long()
    head = FeatureHead(c, carried_embedding(target), output_rows(target, ids), ids)
    try:
        head.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()})
    except RuntimeError as error:  # shapes or names that the metadata does not describe
        raise weights_mismatch(path, first_problem(error)) from None
    return head.to(target.get_input_embeddings().weight.device).eval()
