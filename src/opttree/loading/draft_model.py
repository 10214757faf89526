"""A draft model's folder: a few of the target's own layers, its frozen embedding, a reduced head.

Architecture (a plain ``transformers.LlamaForCausalLM`` with ``lm_head`` replaced):

- ``model.embed_tokens``: the target's input embedding, FROZEN and shared (never saved);
- ``model.layers``: ``len(init_layers)`` decoder layers, initialised from the target's layers
  ``init_layers`` and trained;
- ``model.norm``: the target's final norm, trained;
- ``lm_head``: :class:`ReducedVocabHead` — logits only for the K tokens the target actually
  emits (rows of the target's tied embedding, frozen, plus a trained bias), scattered into a
  full-vocabulary tensor filled with ``finfo.min``. The draft therefore still returns
  ``[batch, q, vocab_size]`` logits and works with 4D tree masks like any HF causal LM, at a
  fraction of the cost of the full 49152-row head.

Saved files (see :func:`save_draft`): ``config.json`` (the draft's LlamaConfig),
``opttree_draft.json`` (what to take from the target) and ``model.safetensors`` holding only
what cannot be rebuilt from the target: the layers, the norm, the head's bias and token ids.
:func:`load_model_draft` rebuilds the rest from the target it is given. Training makes one with
:func:`opttree.distill.train.model.init_draft`.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from .files import (COUNT, INDEXES, META_FILE, NUMBER, TEXT, WEIGHTS_FILE, check_format, embedding_matches, first_problem,
                    parse_meta, read_weights, weights_mismatch)
from ..hf.width import carried_embedding, carried_rows, carried_width
from .head_file import HEAD_FORMATS

logger = logging.getLogger(__name__)

FORMAT = "opttree-reduced-vocab-draft/1"


class ReducedVocabHead(nn.Module):
    """Output head over K of the V vocabulary tokens.

    ``weight`` [K, H] (frozen rows of the target's output embedding), ``bias`` [K] (trained),
    ``token_ids`` [K] long (the full-vocabulary id of each row).
    """

    def __init__(self, weight: torch.Tensor, token_ids: torch.Tensor, vocab_size: int):
        super().__init__()
        self.weight = nn.Parameter(weight.detach().clone(), requires_grad=False)  # [K, H]
        self.bias = nn.Parameter(torch.zeros(weight.shape[0], dtype=weight.dtype))  # [K]
        self.register_buffer("token_ids", token_ids.to(torch.long), persistent=True)  # [K]
        self.vocab_size = vocab_size

    def reduced_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden`` [..., H] → logits over the K kept tokens [..., K]."""
        return nn.functional.linear(hidden, self.weight, self.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden`` [..., H] → full-vocabulary logits [..., V]; dropped tokens get finfo.min."""
        small = self.reduced_logits(hidden)  # [..., K]
        full = small.new_full((*small.shape[:-1], self.vocab_size), torch.finfo(small.dtype).min)
        return full.index_copy_(-1, self.token_ids, small)  # [..., V]


@dataclass(frozen=True)
class DraftMeta:
    """What :func:`load_draft` must take from the target to complete a saved draft."""

    format: str
    init_layers: list[int]
    num_kept_tokens: int
    target_vocab_size: int
    target_hidden_size: int
    target_embedding_checksum: float
    target_name: str = ""


# what each key of a draft's META_FILE must hold
META_KINDS = {"format": TEXT, "init_layers": INDEXES, "num_kept_tokens": COUNT, "target_vocab_size": COUNT,
              "target_hidden_size": COUNT, "target_embedding_checksum": NUMBER, "target_name": TEXT}


def draft_config(target_config, num_layers: int):
    """The draft's LlamaConfig: the target's shapes with ``num_layers`` layers, untied head."""
    from transformers import LlamaConfig

    values = target_config.to_dict()
    for key in ("quantization_config", "_name_or_path", "architectures", "auto_map", "layer_types"):
        values.pop(key, None)
    values.update(num_hidden_layers=num_layers, tie_word_embeddings=False, model_type="llama")
    return LlamaConfig(**values, attn_implementation="sdpa")


def build_draft(target, meta: DraftMeta, config=None, token_ids: torch.Tensor | None = None):
    """A draft wired to ``target``: shared frozen embedding, head rows from the embedding.

    ``config`` defaults to :func:`draft_config`; ``token_ids`` [K] (the kept tokens) must be
    given unless the caller loads them from a checkpoint right after.
    """
    from transformers import LlamaForCausalLM

    config = config or draft_config(target.config, len(meta.init_layers))
    embed = carried_embedding(target)
    draft = LlamaForCausalLM(config).to(embed.weight.dtype)
    draft.model.embed_tokens = embed  # shared with the target, frozen below
    ids = token_ids if token_ids is not None else torch.arange(meta.num_kept_tokens)
    output = carried_rows(target.get_output_embeddings().weight, target.config)  # [V, H] (tied to embed on SmolLM2)
    draft.lm_head = ReducedVocabHead(output[ids], ids, config.vocab_size)
    draft.model.embed_tokens.weight.requires_grad_(False)
    return draft


def trainable_state(draft) -> dict[str, torch.Tensor]:
    """The tensors that a saved draft stores (everything but what the target provides)."""
    state = {}
    for name, tensor in draft.state_dict().items():
        if name.startswith("model.embed_tokens") or name == "lm_head.weight":
            continue
        state[name] = tensor
    return state


def save_draft(draft, meta: DraftMeta, path: str | Path, dtype: torch.dtype | None = None) -> Path:
    """Write config.json, opttree_draft.json and model.safetensors (new weights only)."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    draft.config.save_pretrained(path)
    (path / META_FILE).write_text(json.dumps(asdict(meta), indent=2) + "\n")
    state = {}
    for name, tensor in trainable_state(draft).items():
        cast = dtype is not None and tensor.is_floating_point()
        state[name] = (tensor.to(dtype) if cast else tensor).detach().contiguous().cpu()
    save_file(state, str(path / WEIGHTS_FILE), metadata={"format": FORMAT})
    return path


def load_model_draft(path: Path, target, data: dict):
    """The draft model saved by :func:`save_draft` in ``path`` (whose META_FILE holds ``data``),
    completed from ``target``: it shares the target's input embedding and rebuilds its head rows
    from the target's output embedding, so ``target`` must be the model the draft was distilled
    from (a mismatch is logged as a warning). An eval-mode ``LlamaForCausalLM`` in the target's
    dtype with ``config._attn_implementation == "sdpa"``; ValueError naming the file for a folder
    whose files do not describe one draft."""
    from transformers import LlamaConfig

    meta = parse_meta(DraftMeta, data, META_KINDS, str(path / META_FILE))
    check_format(meta.format, (FORMAT, *HEAD_FORMATS), path)
    width = carried_width(target.config)
    if (meta.target_vocab_size, meta.target_hidden_size) != (target.config.vocab_size, width):
        raise ValueError(
            f"{path} was distilled from a target with vocab {meta.target_vocab_size} and hidden "
            f"size {meta.target_hidden_size}; this target has {target.config.vocab_size} and {width}: "
            "pass the target it was distilled from"
        )
    if not embedding_matches(target, meta.target_embedding_checksum):
        logger.warning("%s: the target's embedding differs from the one it was distilled from", path)
    config = LlamaConfig.from_pretrained(path, attn_implementation="sdpa")
    state = read_weights(path)
    ids = state.get("lm_head.token_ids")
    if ids is None or ids.dim() != 1 or len(ids) == 0 or int(ids.min()) < 0 or int(ids.max()) >= config.vocab_size:
        raise weights_mismatch(path, f"'lm_head.token_ids' must list kept tokens of the {config.vocab_size}-token "
                                     "vocabulary")
    draft = build_draft(target, meta, config=config, token_ids=ids)
    target_dtype = target.get_input_embeddings().weight.dtype
    try:
        missing, unexpected = draft.load_state_dict(
            {k: v.to(target_dtype) if v.is_floating_point() else v for k, v in state.items()},
            strict=False,
        )
    except RuntimeError as error:  # shapes that config.json does not describe
        raise weights_mismatch(path, first_problem(error)) from None
    missing = [m for m in missing if not (m.startswith("model.embed_tokens") or m == "lm_head.weight")]
    if missing or unexpected:
        raise weights_mismatch(path, f"missing {missing}, unexpected {unexpected}")
    return draft.eval()
