"""A new EAGLE-3 head for a target (:func:`new_eagle3_head`): the runtime's
:class:`~opttree.loading.eagle.eagle3.Eagle3Head` itself, so what training makes IS the published
layout and its folder is :func:`opttree.export_draft`'s (a rename at most).

Shapes (DESIGN.md, "EAGLE heads"): h = H (the head reads the target's embedding, which is frozen
and never saved); ``fc`` [h, 3H] over the taps :func:`~opttree.drafters.head.eagle.default_taps`
(the states entering layers 2, L//2, L-3: the ones the loader resolves when the config names no
ids); one ``midlayer`` with the target's attention shape, MLP width, eps and RoPE base written into
the head's own config; ``lm_head`` [Vd, h]; ``norm_before_residual`` false (EAGLE's own heads).

Start (opttree's choice; EAGLE-3 starts at random): ``fc`` takes the highest tap, ``norm`` and
``lm_head`` are the target's final norm and its output rows of the kept tokens, the layer random.
"""

from __future__ import annotations

import torch

from ...drafters.head.eagle import EagleConfig, default_taps
from ...hf.width import text_config
from ...loading.eagle import Eagle3Head
from ...loading.head_file import output_rows
from .vocab import d2t_of


def rope_base(tc) -> float:
    """The target's RoPE base (transformers 5's ``rope_parameters``, else ``rope_theta``, else 10000)."""
    parameters = getattr(tc, "rope_parameters", None) or {}
    return float(parameters.get("rope_theta", getattr(tc, "rope_theta", None) or 10000.0))


def eagle3_config(target, draft_vocab_size: int) -> EagleConfig:
    """The head's shapes for ``target`` (a Llama-style decoder of at least 6 layers: three distinct taps)."""
    tc = text_config(target.config)
    heads = tc.num_attention_heads
    return EagleConfig(
        hidden_size=tc.hidden_size, num_heads=heads,
        num_kv_heads=getattr(tc, "num_key_value_heads", None) or heads,
        head_dim=getattr(tc, "head_dim", None) or tc.hidden_size // heads,
        intermediate_size=tc.intermediate_size, vocab_size=tc.vocab_size, draft_vocab_size=draft_vocab_size,
        target_hidden_size=tc.hidden_size, target_layers=tc.num_hidden_layers,
        taps=default_taps(tc.num_hidden_layers), rms_eps=float(getattr(tc, "rms_norm_eps", 1e-6)),
        rope_theta=rope_base(tc), norm_before_residual=False)


def new_eagle3_head(target, used: torch.Tensor, seed: int = 0) -> Eagle3Head:
    """An untrained EAGLE-3 head over the kept target ids ``used`` [Vd] ascending, float32, train mode,
    on the device of the target's embedding."""
    c = eagle3_config(target, len(used))
    taps = c.taps
    if len(set(taps)) != 3:
        raise ValueError(f"the target has {c.target_layers} layers: EAGLE-3's default taps {list(taps)} are not three "
                         "distinct layers (it needs at least 6)")
    torch.manual_seed(seed)
    head = Eagle3Head(c, target.get_input_embeddings(), d2t_of(used))
    h = c.hidden_size
    with torch.no_grad():
        head.fc.weight.zero_()
        head.fc.weight[:, 2 * c.target_hidden_size:].copy_(torch.eye(h))
        head.lm_head.weight.copy_(output_rows(target, used.long()))
        norm = getattr(target.get_decoder(), "norm", None)
        if norm is not None:
            head.norm.weight.copy_(norm.weight.detach().float())
    return head.to(target.get_input_embeddings().weight.device).train()


__all__ = ["eagle3_config", "new_eagle3_head", "rope_base"]
