"""An EAGLE-3 head started from a trained feature head (opttree.distill.eagle3.from_feature_head,
issue 58 item 1: "initialise from the shipped head's weights where they map"). On a tiny random
target and a feature head of random weights over three fused layers: the mapped head's depth-1
guesses are mostly the feature head's own where a new head's are not; the parts that map are copied
exactly; the attention reads the feature head's attention input (embedding half first). Negative
control: ``fc`` left unfitted loses most of the agreement. A feature head of two layers is refused; a
recipe stage whose init is a feature-head folder starts from the mapped head."""

from __future__ import annotations

import pytest
import torch

from eagle_folders import target_for
from opttree.distill.data.features import features_of
from opttree.distill.eagle3.from_feature_head import eagle3_from_feature_head
from opttree.distill.eagle3.head import new_eagle3_head
from opttree.distill.eagle3.unroll import paired, unrolled
from opttree.distill.train.head import new_head
from opttree.distill.train.head_data import make_batch


@pytest.fixture(scope="module")
def setting():
    target = target_for("llama")
    vocab = target.config.vocab_size
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        texts = [target.generate(torch.randint(3, vocab, (1, 8), generator=g), max_new_tokens=32, do_sample=False)[0]
                 for _ in range(30)]
    fh, _ = new_head(target, torch.arange(vocab), init_layer=3, feature_layers=(3, 4, -1), out_rank=4)
    with torch.no_grad():  # a "trained" head: every weight moved off its start
        for name, p in fh.named_parameters():
            if "norm" not in name:
                p.add_(0.3 * torch.randn(p.shape, generator=g) * p.std().clamp(min=0.02))
        fh.layer.self_attn.o_proj.weight.mul_(6.0)  # attention weighs in the guesses (the controls need it)
    with torch.no_grad():
        mapped = eagle3_from_feature_head(fh, target, torch.arange(vocab), texts[:20], positions=4000)
    return target, fh.eval(), mapped.eval(), texts[20:]


@torch.no_grad()
def feature_head_guesses(fh, target, ids):
    """[L - 1]: the feature head's depth-1 guess at entry i (features of i, token i + 1: guesses i + 2)."""
    hs = target(input_ids=ids[None], output_hidden_states=True).hidden_states
    n = len(ids) - 1
    mask = torch.zeros(1, 1, n, n).masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    g, _ = fh(fh.target_features(hs)[:, :-1], ids[None, 1:], torch.arange(n)[None], None, mask)
    return fh.token_ids[fh.reduced_logits(g[0]).argmax(-1)]


@torch.no_grad()
def eagle3_guesses(head, target, ids):
    """[L - 1]: the EAGLE-3 head's depth-1 guess at entry e (taps of e, token e + 1: guesses e + 2)."""
    passes = unrolled(head, paired(make_batch([features_of(target, ids, 1, layers=head.c.taps)])), 1)
    return head.token_ids[head.reduced_logits(passes[0][0]).argmax(-1)]


def agreement(head, setting) -> float:
    target, fh, _, held_out = setting
    pairs = [(feature_head_guesses(fh, target, ids), eagle3_guesses(head, target, ids)) for ids in held_out]
    return sum(int((a == b).sum()) for a, b in pairs) / sum(len(a) for a, _ in pairs)


def test_the_mapped_head_guesses_as_the_feature_head_does(setting):
    target, _, mapped, _ = setting
    fresh = new_eagle3_head(target, torch.arange(target.config.vocab_size)).eval()
    assert agreement(mapped, setting) >= 0.6 > 0.2 >= agreement(fresh, setting)


def test_unfitted_fc_loses_the_agreement(setting):
    """Negative control: the same head with ``fc`` left at zero (the taps' fit undone)."""
    import copy

    _, _, mapped, _ = setting
    unfitted = copy.deepcopy(mapped)
    with torch.no_grad():
        unfitted.fc.weight.zero_()
    assert agreement(unfitted, setting) < agreement(mapped, setting) - 0.2


def test_the_attention_reads_what_the_feature_head_reads(setting):
    """q/k/v's embedding half is a positive multiple of the feature head's A fc_e and its hidden half
    of A (A = W_qkv diag(γ1)): the EAGLE-3 layer reads [e, h0] as the feature head reads fc_e e + h0,
    up to the norms' scales (a swap of the halves fails it)."""
    _, fh, mapped, _ = setting
    h = mapped.c.hidden_size
    g = torch.Generator().manual_seed(1)
    e, h0 = torch.randn(5, h, generator=g), torch.randn(5, h, generator=g)
    fc_e = fh.fc.weight[:, :h]
    with torch.no_grad():
        for name in ("q_proj", "k_proj", "v_proj"):
            w3 = getattr(mapped.midlayer.self_attn, name).weight  # [out, 2h]
            a = getattr(fh.layer.self_attn, name).weight * fh.layer.input_layernorm.weight  # [out, h]
            scale_e, scale_h = w3[:, :h].norm() / (a @ fc_e).norm(), w3[:, h:].norm() / a.norm()
            got = torch.cat([e / scale_e, h0 / scale_h], dim=-1) @ w3.T
            assert torch.allclose(got, (e @ fc_e.T + h0) @ a.T, rtol=1e-4, atol=1e-4), name


def test_what_maps_is_copied(setting):
    _, fh, mapped, _ = setting
    mid, layer = mapped.midlayer, fh.layer
    for name in ("gate_proj", "up_proj", "down_proj"):
        assert torch.equal(getattr(mid.mlp, name).weight, getattr(layer.mlp, name).weight)
    assert torch.equal(mid.self_attn.o_proj.weight, layer.self_attn.o_proj.weight)
    assert torch.equal(mid.post_attention_layernorm.weight, layer.post_attention_layernorm.weight)
    assert torch.equal(mapped.norm.weight, fh.norm.weight)
    assert torch.allclose(mapped.lm_head.weight, fh.output_rows())  # the trained rows; the bias dropped


def test_two_layer_feature_heads_are_refused(setting):
    target, _, _, texts = setting
    two, _ = new_head(target, torch.arange(16), num_layers=2)
    with pytest.raises(ValueError, match="2 decoder layers"):
        eagle3_from_feature_head(two, target, torch.arange(16), texts)


def test_a_stage_init_of_a_feature_head_folder_maps_it(setting, tmp_path):
    from opttree.distill.eagle3.train import Eagle3TrainConfig, start_head
    from opttree.distill.train.head import new_head as make
    from opttree.loading.head_file import save_head

    target, _, _, texts = setting
    head, meta = make(target, torch.arange(target.config.vocab_size), init_layer=3, feature_layers=(3, 4, -1))
    save_head(head, meta, tmp_path / "fh", dtype=torch.float32)
    records = [{"input_ids": ids} for ids in texts]
    started = start_head(target, records, Eagle3TrainConfig(draft_vocab_size=32), tmp_path / "fh")
    assert started.training and started.c.draft_vocab_size == 32
    assert torch.equal(started.midlayer.mlp.up_proj.weight, head.layer.mlp.up_proj.weight)
