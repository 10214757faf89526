"""The distill pipeline end to end on a tiny random Llama target: data → train → load → agreement.

No downloads: the target is built from a config and the tokenizer is a byte-level tokenizer
made in memory.
"""

from __future__ import annotations

import json

import pytest
import torch

from opttree import speculative_generate

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from opttree import load_draft
from opttree.loading.draft_model import ReducedVocabHead  # noqa: E402
from opttree.distill.cli import main  # noqa: E402
from opttree.distill.data.answers import DataConfig  # noqa: E402
from opttree.distill.data.pipeline import PromptPlan, make_data  # noqa: E402
from opttree.distill.train.draft import TrainConfig, agreement, train_draft  # noqa: E402
from opttree.hf.compat import with_cache  # noqa: E402

SPECIALS = ["<pad>", "<eos>", "<user>", "<bot>"]
CHAT = "{% for m in messages %}<user>{{ m['content'] }}{% endfor %}<bot>"


def tiny_tokenizer():
    """Byte-level tokenizer: 4 special tokens + 256 bytes, with a one-line chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {t: i for i, t in enumerate(SPECIALS)}
    vocab.update({ch: len(SPECIALS) + i for i, ch in enumerate(sorted(alphabet))})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                   additional_special_tokens=["<user>", "<bot>"])
    fast.chat_template = CHAT
    return fast


def tiny_target(vocab_size: int, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, tie_word_embeddings=True,
                         eos_token_id=1, pad_token_id=0, bos_token_id=None,
                         initializer_range=0.3)  # 0.02 makes a model that repeats one token
    model = LlamaForCausalLM(config)
    model.config._attn_implementation = "sdpa"
    return model.eval()


@pytest.fixture(scope="module")
def target_and_tokenizer():
    tok = tiny_tokenizer()
    return tiny_target(len(tok)), tok


def test_pipeline_end_to_end(tmp_path, target_and_tokenizer):
    target, tok = target_and_tokenizer
    records = make_data(target, tok, tmp_path / "data", PromptPlan(num_seed=24, num_context=8),
                        DataConfig(max_new_tokens=12, batch_size=8, topk=8))
    assert len(records) == 32
    r = records[0]
    n = len(r["input_ids"]) - r["prompt_len"]
    assert r["topk_ids"].shape == (n, 8) and r["topk_logits"].dtype == torch.float16
    # The answer token IS the target's top-1 (greedy) token at each answer position.
    assert torch.equal(r["input_ids"][r["prompt_len"]:], r["topk_ids"][:, 0].long())

    # Resumable: a second call generates nothing new and returns the same records.
    again = make_data(target, tok, tmp_path / "data", PromptPlan(num_seed=24, num_context=8),
                      DataConfig(max_new_tokens=12, batch_size=8, topk=8))
    assert [x["prompt"] for x in again] == [x["prompt"] for x in records]

    cfg = TrainConfig(init_layers=(0, 3), num_kept_tokens=64, epochs=30, batch_size=8,
                      lr=3e-3, warmup_steps=5, eval_every=40, val_fraction=0.25,
                      save_dtype="float32")
    result = train_draft(target, records, tmp_path / "draft", cfg, pad_id=0, always_keep=[1])
    assert (tmp_path / "draft" / "model.safetensors").exists()
    assert json.loads((tmp_path / "draft" / "training.json").read_text())["step"] > 0

    draft = load_draft(tmp_path / "draft", target)
    assert draft.config.vocab_size == target.config.vocab_size
    assert draft.config._attn_implementation == "sdpa"
    assert draft.model.embed_tokens.weight is target.model.embed_tokens.weight  # shared, not saved
    assert 1 in draft.lm_head.token_ids.tolist()  # EOS always kept
    agree, coverage = agreement(draft, records, max_len=512, pad_id=0, batch_size=8)
    assert 0.0 <= agree <= 1.0 and coverage > 0.5
    assert result.val_agreement >= result.initial_agreement
    assert agree > result.initial_agreement, "training did not improve agreement"


def test_reduced_head_full_vocab_logits():
    hidden = torch.randn(2, 3, 16)  # [B, q, H]
    weight = torch.randn(5, 16)  # [K, H]
    ids = torch.tensor([0, 3, 7, 8, 19])
    head = ReducedVocabHead(weight, ids, vocab_size=20)
    full = head(hidden)  # [B, q, V]
    assert full.shape == (2, 3, 20)
    torch.testing.assert_close(full[..., ids], hidden @ weight.T)
    dropped = torch.ones(20, dtype=torch.bool)
    dropped[ids] = False
    assert (full[..., dropped] == torch.finfo(full.dtype).min).all()
    assert torch.isin(full.argmax(-1), ids).all()


def tree_inputs(past_len: int, parents: list[int], dtype):
    """4D additive mask [1, 1, n, past_len + n] and rotary positions [1, n] of a token tree."""
    n = len(parents)
    allowed = torch.zeros(n, past_len + n, dtype=torch.bool)
    allowed[:, :past_len] = True
    depth = []
    for i, p in enumerate(parents):
        allowed[i, past_len + i] = True
        if p >= 0:
            allowed[i, past_len:] |= allowed[p, past_len:]
        depth.append(0 if p < 0 else depth[p] + 1)
    mask = torch.zeros(n, past_len + n, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    return mask[None, None], torch.tensor([[past_len + d for d in depth]])


@torch.no_grad()
def test_draft_tree_logits_match_paths(tmp_path, target_and_tokenizer):
    """With a reduced head, a tree under a 4D mask gives the logits of each root→node path."""
    from transformers import DynamicCache

    from opttree.distill.train.model import init_draft

    from opttree.loading.draft_model import save_draft

    target, _ = target_and_tokenizer
    draft, meta = init_draft(target, [0, 1], torch.arange(2, 50))
    save_draft(draft, meta, tmp_path / "d", dtype=torch.float32)
    draft = load_draft(tmp_path / "d", target)
    prefix = torch.randint(4, 200, (1, 6))
    parents = [-1, 0, 0, 1, 1, 2, 3]
    tokens = torch.randint(4, 200, (1, len(parents)))
    cache = DynamicCache()
    draft(input_ids=prefix, **with_cache(draft, cache), use_cache=True)
    mask, positions = tree_inputs(prefix.shape[1], parents, draft.dtype)
    out = draft(input_ids=tokens, attention_mask=mask, position_ids=positions,
                cache_position=torch.arange(6, 6 + len(parents)), **with_cache(draft, cache),
                use_cache=True)
    assert out.logits.shape == (1, len(parents), target.config.vocab_size)
    for node in range(len(parents)):
        path, p = [], node
        while p >= 0:
            path.append(p)
            p = parents[p]
        seq = torch.cat([prefix, tokens[:, path[::-1]]], dim=1)
        ref = draft(input_ids=seq).logits[0, -1]
        kept = draft.lm_head.token_ids
        torch.testing.assert_close(out.logits[0, node, kept], ref[kept], atol=1e-4, rtol=1e-4)
        assert out.logits[0, node].argmax() == ref.argmax()


@pytest.mark.parametrize("kind", ["layers", "head"])
def test_cli_end_to_end(tmp_path, target_and_tokenizer, kind):
    target, tok = target_and_tokenizer
    target.save_pretrained(tmp_path / "target")
    tok.save_pretrained(tmp_path / "target")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"tell me about {i}"}) + "\n" for i in range(12)))
    rc = main(["--target", str(tmp_path / "target"), "--out", str(tmp_path / "draft"),
               "--cache", str(tmp_path / "cache"), "--prompts", str(prompts),
               "--max-new-tokens", "8", "--gen-batch-size", "6", "--init-layers", "0,1",
               "--kept-tokens", "32", "--epochs", "2", "--batch-size", "4", "--eval-every", "5",
               "--kind", kind, "--batch-tokens", "64", "--max-len", "32", "--device", "cpu"])
    assert rc == 0
    draft = load_draft(tmp_path / "draft", target)
    if kind == "layers":
        assert draft(input_ids=torch.tensor([[5, 6, 7]])).logits.shape == (1, 3, target.config.vocab_size)
    ids = torch.tensor([[5, 6, 7, 8]])
    out = target.generate(ids, max_new_tokens=8, do_sample=False, custom_generate=speculative_generate,
                          draft_model=draft, nodes=4)
    assert torch.equal(out, target.generate(ids, max_new_tokens=8, do_sample=False))
    if kind == "head":  # go on training it, on answer positions only, with 16 more kept tokens
        rc = main(["--target", str(tmp_path / "target"), "--out", str(tmp_path / "more"),
                   "--cache", str(tmp_path / "cache"), "--stage", "train", "--epochs", "1",
                   "--eval-every", "5", "--batch-tokens", "64", "--max-len", "32",
                   "--init-head", str(tmp_path / "draft"), "--answers-only", "--kept-tokens", "48"])
        assert rc == 0
        more = load_draft(tmp_path / "more", target)
        assert len(more.token_ids) == 48 and torch.isin(draft.token_ids, more.token_ids).all()
        assert json.loads((tmp_path / "more" / "training.json").read_text())["train_config"]["answers_only"]
