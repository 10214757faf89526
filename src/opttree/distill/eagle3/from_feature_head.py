"""An EAGLE-3 head started from a trained feature head, where their weights map (issue 58, item 1:
"initialise from the shipped head's weights where they map").

The two layouts (DESIGN.md, "EAGLE heads"; :mod:`opttree.drafters.head.feature_head`) differ at the
entry only:

    feature head  x = fc_e e + fc_f F + b            residual x,  q/k/v read  γ1 ⊙ x / rms(x)
    EAGLE-3       h0 = W [t_a, t_b, t_c]             residual h0, q/k/v read  [e / rms(e), h0 / rms(h0)]

(e the token's embedding, F the feature head's fused target features, t_* the EAGLE-3 taps; the
EAGLE-3 layer's two input norms start at ones). What maps:

- ``fc`` (W): the least-squares fit (ridge, λ = 1e-4 × the mean diagonal) of ``fc_f F + b`` from the
  taps, over the positions of ``texts`` (one target forward each): the part of x that does not
  depend on the token;
- q/k/v [out, 2h]: ``[A fc_e r_e / r_x, A r_h / r_x]`` with A = W_qkv diag(γ1) the feature head's
  and r_e, r_x, r_h the mean RMS of e, x and h0 over those positions: the feature head's attention
  input, up to how the norms' scales vary between positions;
- o_proj, the MLP, ``post_attention_layernorm`` and the final ``norm``: copied;
- ``lm_head``: the feature head's trained output rows (the target's plus its correction) for the
  draft tokens it keeps, the target's rows for the others; its output bias has no place in the
  layout and is dropped.

The residual stream of EAGLE-3 has no ``fc_e e`` term: the one thing that does not map; training
learns it.
"""

from __future__ import annotations

import torch

from ...drafters.head.feature_head import FeatureHead
from ...loading.eagle import Eagle3Head
from .head import new_eagle3_head


def rms(x: torch.Tensor) -> float:
    """Mean over positions of each row's root mean square (x [N, h])."""
    return float(x.float().pow(2).mean(-1).sqrt().mean())


@torch.no_grad()
def samples(fh: FeatureHead, target, taps: tuple[int, ...], texts: list[torch.Tensor], positions: int):
    """(taps [N, 3H], the fused features F [N, H], the next token's embedding e [N, H]) at up to
    ``positions`` positions of ``texts`` (each [L] long), float32 on the CPU."""
    device = target.get_input_embeddings().weight.device
    tapped, fused, embedded, n = [], [], [], 0
    for ids in texts:
        if n >= positions or len(ids) < 2:
            continue
        out = target(input_ids=ids[None].to(device), output_hidden_states=True, use_cache=False)
        hs = out.hidden_states
        tapped.append(torch.cat([hs[i][0, :-1] for i in taps], dim=-1).float().cpu())  # [L-1, 3H]
        fused.append(fh.target_features([s.float() for s in hs])[0, :-1].float().cpu())  # [L-1, H]
        embedded.append(target.get_input_embeddings()(ids[1:].to(device)).float().cpu())  # [L-1, H]
        n += len(ids) - 1
    return torch.cat(tapped)[:positions], torch.cat(fused)[:positions], torch.cat(embedded)[:positions]


def ridge(x: torch.Tensor, y: torch.Tensor, scale: float = 1e-4) -> torch.Tensor:
    """W [out, in] minimising |x W^T - y|^2 + λ|W|^2 (x [N, in], y [N, out]), float64 normal equations."""
    x64, y64 = x.double(), y.double()
    gram = x64.T @ x64  # [in, in]
    lam = scale * float(gram.diagonal().mean())
    return torch.linalg.solve(gram + lam * torch.eye(gram.shape[0], dtype=gram.dtype), x64.T @ y64).T.float()


@torch.no_grad()
def eagle3_from_feature_head(fh: FeatureHead, target, used: torch.Tensor, texts: list[torch.Tensor],
                             seed: int = 0, positions: int = 16384) -> Eagle3Head:
    """A float32 EAGLE-3 head over the draft tokens ``used`` [Vd] (ascending target ids) started from
    ``fh`` as the module doc says, the fit over ``positions`` positions of ``texts``."""
    if fh.c.num_layers != 1:
        raise ValueError(f"the feature head has {fh.c.num_layers} decoder layers: an EAGLE-3 head has one; "
                         "start from a one-layer feature head, or from a new head (init = \"\")")
    head = new_eagle3_head(target, used, seed)
    c, h, layer = head.c, head.c.hidden_size, fh.layer
    fh = fh.float()
    taps, fused, e = samples(fh, target, c.taps, texts, positions)
    fc_e, fc_f, b = fh.fc.weight[:, :h].cpu(), fh.fc.weight[:, h:].cpu(), fh.fc.bias.cpu()  # [h, h] x2, [h]
    y = fused @ fc_f.T + b  # [N, h]: x less its token's part
    head.fc.weight.copy_(ridge(taps, y).to(head.fc.weight.device))
    h0 = taps @ head.fc.weight.cpu().T  # [N, h]
    x = e @ fc_e.T + y
    r_e, r_x, r_h = rms(e), rms(x), rms(h0)
    mid = head.midlayer
    for name in ("q_proj", "k_proj", "v_proj"):
        a = getattr(layer.self_attn, name).weight.cpu() * layer.input_layernorm.weight.cpu()  # [out, h]
        getattr(mid.self_attn, name).weight.copy_(torch.cat([a @ fc_e * (r_e / r_x), a * (r_h / r_x)], dim=1))
    mid.self_attn.o_proj.weight.copy_(layer.self_attn.o_proj.weight)
    for name in ("gate_proj", "up_proj", "down_proj"):
        getattr(mid.mlp, name).weight.copy_(getattr(layer.mlp, name).weight)
    mid.post_attention_layernorm.weight.copy_(layer.post_attention_layernorm.weight)
    head.norm.weight.copy_(fh.norm.weight)
    rows = fh.output_rows().cpu()  # [K, H] over fh.token_ids
    where = {int(t): i for i, t in enumerate(fh.token_ids.tolist())}
    for j, t in enumerate(used.tolist()):
        if t in where:
            head.lm_head.weight[j].copy_(rows[where[t]])
    return head


__all__ = ["eagle3_from_feature_head", "ridge", "samples"]
