"""Tiny random EAGLE heads written in the published layouts' key names and shapes, and a reference
forward of each written here from the published description (SafeAILab/EAGLE cb7e084
eagle/model/cnets.py and cnets1.py, vLLM's llama_eagle3.py), independent of opttree's drafter code.

Notation: h the head's hidden size, H the target's, V the target's vocabulary, Vd the draft's.
The heads' attention shape, rms_norm_eps and rope_theta differ from the targets' on purpose: a
loader that took them from the target drafts other q."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import transformers as tf

from models import VOCAB

HEADS, KV_HEADS, EPS, THETA, INTER = 2, 1, 1e-5, 5000.0, 48  # the head's own, unlike the targets'


def target_for(family: str, layers: int = 8, seed: int = 0, hidden: int = 32):
    """A tiny random target with enough layers for EAGLE-3's default taps (2, L//2, L-3 distinct)."""
    from models import config_for, peaked

    torch.manual_seed(seed)
    config = config_for(family, layers, hidden)
    config._attn_implementation = "sdpa"
    model = tf.AutoModelForCausalLM.from_config(config).eval()
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = None
    return peaked(model, scale=20.0)


def _random(shape, g, scale=None):
    scale = scale if scale is not None else 1.0 / shape[-1] ** 0.5
    return torch.randn(shape, generator=g) * scale


def _norm(size, g):
    return 1.0 + 0.1 * torch.randn(size, generator=g)


def layer_weights(prefix: str, h: int, width: int, g, input_norm: bool = True, hidden_norm: bool = False) -> dict:
    hd = h // HEADS
    out = {
        f"{prefix}self_attn.q_proj.weight": _random((HEADS * hd, width), g, 2.0 / width ** 0.5),
        f"{prefix}self_attn.k_proj.weight": _random((KV_HEADS * hd, width), g, 2.0 / width ** 0.5),
        f"{prefix}self_attn.v_proj.weight": _random((KV_HEADS * hd, width), g),
        f"{prefix}self_attn.o_proj.weight": _random((h, HEADS * hd), g),
        f"{prefix}mlp.gate_proj.weight": _random((INTER, h), g),
        f"{prefix}mlp.up_proj.weight": _random((INTER, h), g),
        f"{prefix}mlp.down_proj.weight": _random((h, INTER), g),
        f"{prefix}post_attention_layernorm.weight": _norm(h, g),
    }
    if input_norm:
        out[f"{prefix}input_layernorm.weight"] = _norm(h, g)
    if hidden_norm:
        out[f"{prefix}hidden_norm.weight"] = _norm(h, g)
    return out


def head_config(h: int, vocab: int, **more) -> dict:
    return {"model_type": "llama", "hidden_size": h, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
            "intermediate_size": INTER, "num_hidden_layers": 1, "vocab_size": vocab, "rms_norm_eps": EPS,
            "rope_theta": THETA, "hidden_act": "silu", "max_position_embeddings": 256, **more}


def vocab_map(vd: int, g) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t [Vd] long, t2d [V] bool) for a random kept set of Vd target tokens, as EAGLE builds them."""
    used = torch.randperm(VOCAB, generator=g)[:vd].sort().values
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[used] = True
    return used - torch.arange(vd), t2d


def eagle3_state(h: int, H: int, vd: int, seed: int = 0, spelling: str = "midlayer.") -> dict:
    g = torch.Generator().manual_seed(seed)
    state = {"fc.weight": _random((h, 3 * H), g)}
    state.update(layer_weights(spelling, h, 2 * h, g, hidden_norm=True))
    state["norm.weight"] = _norm(h, g)
    state["lm_head.weight"] = _random((vd, h), g, 3.0 / h ** 0.5)
    if vd != VOCAB:
        state["d2t"], state["t2d"] = vocab_map(vd, g)
    return state


def save(folder: Path, config: dict, state: dict, pickled: bool = False) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    if pickled:
        torch.save(state, folder / "pytorch_model.bin")
    else:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))
    return folder


def write_eagle3(folder: Path, target, vd: int = 64, seed: int = 0, spelling: str = "midlayer.",
                 architecture: str = "LlamaForCausalLMEagle3", pickled: bool = False, **more) -> Path:
    h = target.config.hidden_size
    config = head_config(h, VOCAB, architectures=[architecture], draft_vocab_size=vd, **more)
    return save(folder, config, eagle3_state(h, h, vd, seed, spelling), pickled)


def write_speculators(folder: Path, target, vd: int = 64, seed: int = 0, **more) -> Path:
    h = target.config.hidden_size
    state = eagle3_state(h, h, vd, seed, spelling="layers.0.")
    g = torch.Generator().manual_seed(seed + 100)
    state["embed_tokens.weight"] = torch.randn(VOCAB, h, generator=g)
    config = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "draft_vocab_size": vd,
              "speculators_config": {"proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 5}],
                                     "verifier": {"name_or_path": "tiny", "architectures": ["LlamaForCausalLM"]}},
              "transformer_layer_config": head_config(h, VOCAB), "target_hidden_size": h, **more}
    return save(folder, config, state)


def write_eagle1(folder: Path, target, seed: int = 0, bias: bool = True, pickled: bool = False, **more) -> Path:
    h = target.config.hidden_size
    g = torch.Generator().manual_seed(seed)
    state = {"fc.weight": _random((h, 2 * h), g)}
    if bias:
        state["fc.bias"] = 0.1 * torch.randn(h, generator=g)
    state.update(layer_weights("layers.0.", h, h, g, input_norm=False))
    config = head_config(h, VOCAB, architectures=["LlamaForCausalLM"], **({} if bias else {"bias": False}), **more)
    return save(folder, config, state, pickled)


# ---------------------------------------------------------------------------------------------
# the reference forward, from the published description


def rms(x, w, eps=EPS):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate(x, positions, theta=THETA, rope=None):
    """x [heads, n, d] rotated by positions [n] (the half-split layout, rotate_half); ``rope``: a
    callable positions [n] -> (cos, sin) [n, d] in place of the default RoPE of ``theta``."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2).float() / d)
    angles = positions[:, None].float() * inv
    angles = torch.cat([angles, angles], -1)
    cos, sin = (angles.cos(), angles.sin()) if rope is None else rope(positions)
    turned = torch.cat([-x[..., d // 2:], x[..., :d // 2]], -1)
    return x * cos + turned * sin


def attention_mlp(sd, p, x, residual, positions, visible, rope=None):
    """q/k/v of x [n, w], causal by ``visible`` [n, n] bool, residual [n, h] -> the layer's output [n, h]."""
    n, hd = x.shape[0], residual.shape[-1] // HEADS
    q = (x @ sd[p + "self_attn.q_proj.weight"].T).view(n, HEADS, hd).transpose(0, 1)
    k = (x @ sd[p + "self_attn.k_proj.weight"].T).view(n, KV_HEADS, hd).transpose(0, 1)
    v = (x @ sd[p + "self_attn.v_proj.weight"].T).view(n, KV_HEADS, hd).transpose(0, 1)
    q, k = rotate(q, positions, rope=rope), rotate(k, positions, rope=rope)
    k, v = k.repeat_interleave(HEADS // KV_HEADS, 0), v.repeat_interleave(HEADS // KV_HEADS, 0)
    scores = q @ k.transpose(1, 2) / hd ** 0.5 + torch.where(visible, 0.0, float("-inf"))
    attended = (scores.softmax(-1) @ v).transpose(0, 1).reshape(n, HEADS * hd)
    x1 = residual + attended @ sd[p + "self_attn.o_proj.weight"].T
    y = rms(x1, sd[p + "post_attention_layernorm.weight"])
    act = torch.nn.functional.silu(y @ sd[p + "mlp.gate_proj.weight"].T) * (y @ sd[p + "mlp.up_proj.weight"].T)
    return x1 + act @ sd[p + "mlp.down_proj.weight"].T


def eagle3_layer(sd, emb, hidden, positions, visible, swap=False, norm_before_residual=False, rope=None):
    p = "midlayer." if "midlayer.hidden_norm.weight" in sd else "layers.0."
    normed = rms(hidden, sd[p + "hidden_norm.weight"])
    e = rms(emb, sd[p + "input_layernorm.weight"])
    x = torch.cat([normed, e] if swap else [e, normed], -1)
    return attention_mlp(sd, p, x, normed if norm_before_residual else hidden, positions, visible, rope)


def eagle1_layer(sd, emb, hidden, positions, visible, rope=None):
    x = torch.cat([emb, hidden], -1) @ sd["fc.weight"].T + sd.get("fc.bias", 0.0)
    return attention_mlp(sd, "layers.0.", x, x, positions, visible, rope)


def tree_mask(n: int) -> torch.Tensor:
    """[n + 1, n + 1]: n causal prefix entries, then one entry that sees them all and itself."""
    return torch.ones(n + 1, n + 1).tril().bool()


def reference_q(kind: str, sd: dict, target, prompt: torch.Tensor, broken: str | None = None,
                embed: torch.Tensor | None = None, norm_before_residual: bool = False,
                rope=None, taps=None) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The draft's q for the children of the prompt's last token [V], the best of them (a target id),
    and q [V] for that child's children, as EAGLE's topK_genrate drafts them (called with the prompt
    but its last token's features and the prompt's ids: entry j pairs token j + 1 with feature j at
    position j; a depth-1 node sits at position n and reads the last entry's pre-norm output).

    broken (negative controls): "taps+1" (layer ids one off), "swap" (hidden before embedding),
    "d2t-absolute" (d2t read as target ids), "pre-norm" (EAGLE-1's feature before the final norm).
    rope: positions [n] -> (cos, sin) [n, d], a scaled RoPE's (:func:`rotate`).
    taps: the ``output_hidden_states`` indices to concatenate, in this order (default 2, L//2, L-3)."""
    ids = prompt[0]
    layers = target.config.num_hidden_layers
    captured = {}
    hook = target.model.norm.register_forward_hook(lambda m, args, out: captured.update(pre=args[0]))
    with torch.no_grad():
        states = target(prompt[:, :-1], output_hidden_states=True).hidden_states
    hook.remove()
    table = embed if embed is not None else target.get_input_embeddings().weight.detach()
    tokens = ids[1:]
    n = len(tokens)
    positions = torch.arange(n + 1)
    with torch.no_grad():
        if kind == "eagle3":
            taps = list(taps) if taps is not None else [2, layers // 2, layers - 3]
            taps = [t + 1 for t in taps] if broken == "taps+1" else taps
            hidden = torch.cat([states[i][0] for i in taps], -1) @ sd["fc.weight"].T  # [n, h]
            vd = sd["lm_head.weight"].shape[0]
            d2t = sd.get("d2t", torch.zeros(vd, dtype=torch.long))
            columns = d2t if broken == "d2t-absolute" else torch.arange(vd) + d2t

            def layer(emb, hid, pos, visible):
                return eagle3_layer(sd, emb, hid, pos, visible, swap=broken == "swap",
                                    norm_before_residual=norm_before_residual, rope=rope)

            def probs(out):
                q = torch.zeros(len(out), VOCAB)
                q[:, columns] = (rms(out, sd["norm.weight"]) @ sd["lm_head.weight"].T).softmax(-1)
                return q
        else:
            feature = captured["pre"][0] if broken == "pre-norm" else states[-1][0]
            hidden = feature
            lm_head = target.get_output_embeddings().weight.detach()

            def layer(emb, hid, pos, visible):
                return eagle1_layer(sd, emb, hid, pos, visible, rope)

            def probs(out):
                return (out @ lm_head.T).softmax(-1)

        out = layer(table[tokens], hidden, positions[:n], tree_mask(n)[:n, :n])
        q1 = probs(out[-1:])[0]
        best = int(q1.argmax())
        out2 = layer(torch.cat([table[tokens], table[[best]]]), torch.cat([hidden, out[-1:]]), positions,
                     tree_mask(n))
        q2 = probs(out2[-1:])[0]
    return q1, q2, best
