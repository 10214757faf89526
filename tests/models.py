"""Tiny random-weight causal LMs built from configs (no downloads), one per family."""

from __future__ import annotations

import torch
import transformers as tf

VOCAB = 96


def _common(layers=2, hidden=32, heads=4):
    return dict(vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                intermediate_size=2 * hidden, max_position_embeddings=256)


def config_for(family: str, layers: int = 2, hidden: int = 32):
    c = _common(layers, hidden)
    if family == "llama":
        return tf.LlamaConfig(**c, num_key_value_heads=2)
    if family == "qwen2":
        return tf.Qwen2Config(**c, num_key_value_heads=2)
    if family == "qwen3":
        return tf.Qwen3Config(**c, num_key_value_heads=2, head_dim=8)
    if family == "mistral":
        return tf.MistralConfig(**c, num_key_value_heads=2, sliding_window=None)
    if family == "gemma":
        return tf.GemmaConfig(**c, num_key_value_heads=2, head_dim=8)
    if family == "phi":
        return tf.PhiConfig(**c)
    if family == "phi3":
        return tf.Phi3Config(**c, num_key_value_heads=2, pad_token_id=0)
    if family == "gpt2":
        return tf.GPT2Config(vocab_size=VOCAB, n_embd=hidden, n_layer=layers, n_head=4, n_positions=256)
    if family == "opt":
        return tf.OPTConfig(vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
                            ffn_dim=2 * hidden, max_position_embeddings=256, word_embed_proj_dim=hidden,
                            pad_token_id=1, bos_token_id=2, eos_token_id=2)
    raise KeyError(family)


FAMILIES = ["llama", "qwen2", "qwen3", "mistral", "gemma", "phi", "phi3", "gpt2", "opt"]


def tiny_model(family: str, seed: int = 0, layers: int = 2, hidden: int = 32, attn: str = "sdpa", dtype=torch.float32):
    torch.manual_seed(seed)
    config = config_for(family, layers, hidden)
    config._attn_implementation = attn
    model = tf.AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config.pad_token_id = model.generation_config.pad_token_id or 0
    return model.eval()


def peaked(model, scale: float = 100.0):
    """Sharpen a random model's next-token distributions so drafts of it agree deep into the tree."""
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(scale)
    return model


def partly_agreeing(target, fraction: float = 0.5, seed: int = 0):
    """A draft that agrees with ``target`` except on some tokens: a copy whose LM head swaps the rows
    of random token pairs covering ``fraction`` of the vocabulary (untied from the input embedding),
    so it predicts b where the target predicts a. Rows whose continuations use those tokens accept
    little, the others a lot."""
    import copy

    draft = copy.deepcopy(target)
    head = draft.get_output_embeddings()
    pairs = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(seed))[: int(VOCAB * fraction) // 2 * 2]
    a, b = pairs.view(-1, 2).unbind(1)
    with torch.no_grad():
        weight = head.weight.detach().clone()
        weight[a], weight[b] = head.weight[b].detach().clone(), head.weight[a].detach().clone()
    head.weight = torch.nn.Parameter(weight)
    return draft


# ---------------------------------------------------------------------------------------------
# families whose attention sees a window (sliding) or a chunk of the sequence, not all of it

def windowed_config(family: str, window: int = 8, layers: int = 3, hidden: int = 32):
    """A tiny config whose layers (some or all) see only ``window`` tokens: a sliding window (the
    newest ``window`` keys) or, for "llama4", the current chunk of ``window`` tokens. Each family
    takes its windows the way transformers reads them: ``layer_types`` where the config has them,
    else ``sliding_window`` / ``attention_chunk_size`` for every layer."""
    c = _common(layers, hidden)
    c["max_position_embeddings"] = 512
    if family == "mistral":  # no layer_types: every layer slides
        return tf.MistralConfig(**c, num_key_value_heads=2, sliding_window=window)
    if family == "starcoder2":
        return tf.Starcoder2Config(**c, num_key_value_heads=2, sliding_window=window)
    if family == "gemma2":  # sliding and full layers in turn
        return tf.Gemma2Config(**c, num_key_value_heads=2, head_dim=8, sliding_window=window)
    if family == "gemma3":
        return tf.Gemma3TextConfig(**c, num_key_value_heads=2, head_dim=8, sliding_window=window,
                                   layer_types=["sliding_attention", "full_attention", "sliding_attention"][:layers])
    if family == "gpt_oss":
        return tf.GptOssConfig(**c, num_key_value_heads=2, head_dim=8, sliding_window=window, num_local_experts=4,
                               num_experts_per_tok=2)
    if family == "cohere2":
        return tf.Cohere2Config(**c, num_key_value_heads=2, sliding_window=window,
                                layer_types=["sliding_attention", "sliding_attention", "full_attention"][:layers])
    if family == "qwen2":  # sliding from max_window_layers on
        return tf.Qwen2Config(**c, num_key_value_heads=2, use_sliding_window=True, sliding_window=window,
                              max_window_layers=1)
    if family == "llama4":  # chunked attention, and a full layer
        return tf.Llama4TextConfig(**c, num_key_value_heads=2, head_dim=8, attention_chunk_size=window,
                                   intermediate_size_mlp=2 * hidden, num_local_experts=2,
                                   layer_types=["chunked_attention", "full_attention", "chunked_attention"][:layers])
    raise KeyError(family)


WINDOWED_FAMILIES = ["mistral", "starcoder2", "gemma2", "gemma3", "gpt_oss", "cohere2", "qwen2", "llama4"]
EAGER_ONLY = ("gemma2", "gpt_oss")  # transformers offers them no sdpa


def windowed_model(family: str, window: int = 8, seed: int = 0, layers: int = 3, dtype=torch.float32):
    torch.manual_seed(seed)
    config = windowed_config(family, window, layers)
    config._attn_implementation = "eager" if family in EAGER_ONLY else "sdpa"
    model = tf.AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = None  # every run goes the whole length
    model.generation_config.bos_token_id = None
    return model.eval()

