"""Checks that turn bad input into an error that names the fix."""

from __future__ import annotations

import torch

TREE_MASK_BACKENDS = ("sdpa", "eager")


def vocab_size(model) -> int:
    """Rows of the model's output layer (the logits' last dimension)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and hasattr(head, "out_features"):
        return int(head.out_features)
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return int(config.vocab_size)


def context_length(model) -> int | None:
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def check_attention(model, role: str) -> None:
    impl = getattr(model.config, "_attn_implementation", None) or "eager"
    if impl not in TREE_MASK_BACKENDS:
        raise ValueError(
            f"the {role} model uses attn_implementation={impl!r}, which ignores the custom 4D "
            "attention masks that tree verification needs; load it with "
            "attn_implementation='sdpa' (or 'eager'), e.g. from_pretrained(..., attn_implementation='sdpa')"
        )


def check_pair(target, draft, tokenizer=None, draft_tokenizer=None) -> None:
    """The draft must share the target's vocabulary and both must accept tree masks."""
    if getattr(target.config, "is_encoder_decoder", False) or getattr(draft.config, "is_encoder_decoder", False):
        raise NotImplementedError("opttree supports decoder-only causal LMs; encoder-decoder models are not supported")
    check_attention(target, "target")
    check_attention(draft, "draft")
    t, d = vocab_size(target), vocab_size(draft)
    if t != d:
        raise ValueError(
            f"the draft and target vocabularies differ (target has {t} output tokens, draft {d}); "
            "the draft must use the target's tokenizer — pick a draft from the same model family "
            "or train one with `opttree distill`"
        )
    if tokenizer is not None and draft_tokenizer is not None and tokenizer.get_vocab() != draft_tokenizer.get_vocab():
        raise ValueError(
            "the draft's tokenizer maps tokens to different ids than the target's; "
            "the draft must use the target's tokenizer"
        )


def is_batch(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> bool:
    """Several prompts, or a padded one: decoded by batch.py (one unpadded prompt: generation.py)."""
    padded = attention_mask is not None and attention_mask.dim() == 2 and not bool(attention_mask.all())
    return input_ids.shape[0] > 1 or padded


def check_inputs(input_ids: torch.Tensor, attention_mask: torch.Tensor | None, max_context: int | None) -> None:
    if attention_mask is not None and attention_mask.dim() != 2:
        raise NotImplementedError("opttree takes a 2D attention_mask [batch, length] (1 = token, 0 = left padding)")
    if max_context is not None and input_ids.shape[1] >= max_context:
        raise ValueError(
            f"the prompt has {input_ids.shape[1]} tokens but the model's context holds {max_context}; "
            "shorten the prompt (e.g. truncate it with the tokenizer's max_length)"
        )
