"""Checks that turn bad input into an error that names the fix."""

from __future__ import annotations

import torch

TREE_MASK_BACKENDS = ("sdpa", "eager")


def context_length(model) -> int | None:
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def check_causal_lm(model, role: str) -> None:
    """A model that returns next-token logits: a transformers model with an LM head (a base model such
    as LlamaModel returns hidden states only)."""
    from transformers import PreTrainedModel

    name = type(model).__name__
    if not isinstance(model, PreTrainedModel):
        raise TypeError(f"the {role} model is a {name}, not a transformers model; pass a causal LM loaded with "
                        "AutoModelForCausalLM.from_pretrained(...)")
    if model.get_output_embeddings() is None:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        causal = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(getattr(model.config, "model_type", None))
        raise TypeError(f"the {role} model is a {name}, a base model without an LM head: its forward returns hidden "
                        "states, not next-token logits; load it with AutoModelForCausalLM.from_pretrained(...)"
                        + (f" (a {causal})" if isinstance(causal, str) else ""))


def check_weights(model, role: str) -> None:
    """A model whose weights hold data: one built on the meta device (``with torch.device("meta")``, or
    ``from_config`` there) has none, and would fail at its first forward. A parameter that accelerate
    offloads (its module, or one above, carries accelerate's hook) is loaded when used, and passes."""
    hooked = {name for name, module in model.named_modules() if hasattr(module, "_hf_hook")}
    for name, parameter in model.named_parameters():
        if parameter.device.type != "meta":
            continue
        parts = name.split(".")[:-1]
        if not any(".".join(parts[:i]) in hooked for i in range(len(parts) + 1)):
            raise ValueError(f"the {role} model's weights are on the meta device (no data; {name} is one): load it with "
                             "from_pretrained(...), or give it weights first (model.to_empty(device='cpu') and then "
                             "model.load_state_dict(...))")


def check_attention(model, role: str) -> None:
    impl = getattr(model.config, "_attn_implementation", None) or "eager"
    if impl not in TREE_MASK_BACKENDS:
        raise ValueError(
            f"the {role} model uses attn_implementation={impl!r}, which ignores the custom 4D "
            "attention masks that tree verification needs; load it with "
            "attn_implementation='sdpa' (or 'eager'), e.g. from_pretrained(..., attn_implementation='sdpa')"
        )


def check_inputs(input_ids: torch.Tensor, attention_mask: torch.Tensor | None, max_context: int | None) -> None:
    if input_ids.shape[-1] == 0:
        raise ValueError(
            "the prompt is empty (input_ids has 0 tokens): speculative decoding continues a text. Pass at least one "
            "token (e.g. [[tokenizer.bos_token_id]]), or call generate() without inputs to start from the BOS token"
        )
    if attention_mask is not None and attention_mask.dim() != 2:
        raise NotImplementedError("opttree takes a 2D attention_mask [batch, length] (1 = token, 0 = left padding)")
    if max_context is not None and input_ids.shape[1] >= max_context:
        raise ValueError(
            f"the prompt has {input_ids.shape[1]} tokens but the model's context holds {max_context}; "
            "shorten the prompt (e.g. truncate it with the tokenizer's max_length)"
        )


SPECULATIVE_OPTIONS = ("prompt_lookup_num_tokens", "assistant_early_exit", "use_mtp")
MODE_ARGUMENTS = ("penalty_alpha", "dola_layers", "constraints", "force_words_ids")  # what selects the other modes


def check_generation_mode(generation_config) -> None:
    """opttree replaces generate()'s greedy decoding and sampling, one sequence per prompt; any other
    mode (beam search, contrastive search, DoLa, HF's own speculative methods) is refused, not dropped."""
    from transformers.generation.configuration_utils import GenerationMode

    for name in SPECULATIVE_OPTIONS:
        if getattr(generation_config, name, None):
            raise ValueError(
                f"draft_model= and {name}= are two speculative methods; pass one. opttree's own prompt lookup is "
                "draft_model='prompt_lookup', and MixedDrafter(draft) mixes it with a draft model "
                "(from opttree.drafters import MixedDrafter)"
            )
    mode = generation_config.get_generation_mode()
    if mode in (GenerationMode.GREEDY_SEARCH, GenerationMode.SAMPLE):
        if not generation_config.do_sample and (generation_config.num_return_sequences or 1) > 1:
            raise ValueError(f"greedy decoding returns one sequence per prompt (num_return_sequences="
                             f"{generation_config.num_return_sequences}): pass do_sample=True for several samples")
        return
    if generation_config.num_beams and generation_config.num_beams > 1:
        raise NotImplementedError(
            f"opttree decodes one sequence per prompt (greedy or sampled) and cannot run beam search "
            f"(num_beams={generation_config.num_beams}): pass num_beams=1, or drop draft_model= for beam search"
        )
    named = ", ".join(f"{name}={getattr(generation_config, name)!r}" for name in MODE_ARGUMENTS
                      if getattr(generation_config, name, None) is not None)
    raise NotImplementedError(
        f"opttree replaces greedy decoding and sampling only; these generate() arguments ask for "
        f"{mode.value.replace('_', ' ')} ({named}): drop them, or drop draft_model= for that mode"
    )
