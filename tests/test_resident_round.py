"""The round a lent GPU runs (``python -m opttree.distill.recipes.resident``, issue 34), end to end on a
tiny random target in seconds: prompts → greedy answers in batches → batched features kept in
memory → every stage → the head's files and round.json. Batched features equal one text at a
time; the prompts written here are the prompts read there; a round out of time still ends with a
head; and it runs on CUDA where there is one."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from test_distill import tiny_target, tiny_tokenizer  # noqa: E402
from test_distill_recipe import small_local_texts  # noqa: E402,F401  (fixture)

from opttree import load_draft  # noqa: E402
from opttree.distill.recipes import resident  # noqa: E402
from opttree.distill.data.features import features_of  # noqa: E402
from opttree.distill.recipes.recipe import load_recipe  # noqa: E402

RECIPE = """
name = "tiny-resident"
seed = 5
target = "target"

[[source]]
name = "chat"
kind = "answers"
prompts = "chat"
count = 24
max_new_tokens = 8
batch_size = 8
max_prompt_tokens = 96

[features]
layers = [1, -1]
topk = 4
max_len = 128

[[stage]]
name = "kl"
epochs = 3
lr = 3e-3
warmup_steps = 2
batch_tokens = 256
num_kept_tokens = 64
eval_every = 5
unroll = 2
val_fraction = 0.2
answers_only = true
soft_weight = 1.0
reg_weight = 0.0
noise = 0.0

[[stage]]
name = "rows"
init = "^"
epochs = 2
lr = 1e-3
warmup_steps = 1
batch_tokens = 256
eval_every = 5
unroll = 2
val_fraction = 0.2
answers_only = true
soft_weight = 1.0
reg_weight = 0.0
noise = 0.0
out_rank = 0
topk_weight = 1.0
feature_layers = [1, -1]
"""


@pytest.fixture()
def round_dir(tmp_path):
    tok = tiny_tokenizer()
    tiny_target(len(tok)).save_pretrained(tmp_path / "target")
    tok.save_pretrained(tmp_path / "target")
    (tmp_path / "recipe.toml").write_text(RECIPE)
    return tmp_path


def test_batched_features_equal_one_text_at_a_time():
    tok = tiny_tokenizer()
    target = tiny_target(len(tok))
    g = torch.Generator().manual_seed(0)
    texts = [torch.randint(4, len(tok), (n,), generator=g) for n in (5, 17, 9, 17, 30)]
    got = resident.batched_features(target, texts, (1, -1), 4, False, feature_tokens=40, deadline=float("inf"))
    assert len(got) == len(texts)
    for text, record in zip(texts, got):
        want = features_of(target, text, topk=4, layers=(1, -1))
        assert torch.equal(record["input_ids"], text)
        torch.testing.assert_close(record["hidden"].float(), want["hidden"].float(), rtol=2e-3, atol=2e-3)
        torch.testing.assert_close(record["topk_logits"].float(), want["topk_logits"].float(), rtol=2e-3, atol=2e-3)
        assert (record["topk_ids"][:, 0] == want["topk_ids"][:, 0]).float().mean() == 1.0
    late = resident.batched_features(target, texts, (-1,), 4, False, 40, deadline=0.0)  # out of time:
    assert [len(r["input_ids"]) for r in late] == [5, 9]  # the first batch (the shortest texts) only


def test_the_round_runs_end_to_end_and_writes_only_the_head(round_dir):
    recipe = load_recipe(round_dir / "recipe.toml")
    timings = resident.run_round(recipe, round_dir / "head", "cpu", resident.Budget(120.0))
    assert timings.prompts_answered == timings.prompts_offered == 24
    assert timings.answer_tokens > 0 and timings.tokens > timings.answer_tokens
    assert set(timings.stages) == {"kl", "rows"} and all(s["steps"] > 0 for s in timings.stages.values())
    assert sorted(p.name for p in (round_dir / "head").iterdir()) == \
        ["model.safetensors", "opttree_draft.json", "round.json", "training.json"]
    assert not (round_dir / ".head-stages").exists()  # the stages' work folders are gone
    report = json.loads((round_dir / "head" / "round.json").read_text())
    assert report["rates"]["answer_tok_per_s"] > 0 and report["machine"]
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(round_dir / "target").eval()
    head = load_draft(round_dir / "head", target)
    assert head.c.out_rank == 0 and head.c.feature_layers == (1, -1)  # the last stage's head


def test_prompts_written_here_are_the_prompts_read_there(round_dir, tmp_path):
    recipe = load_recipe(round_dir / "recipe.toml")
    path = tmp_path / "prompts.jsonl.gz"
    assert resident.main(["--recipe", str(round_dir / "recipe.toml"), "--write-prompts", str(path)]) == 0
    first = path.read_bytes()
    resident.main(["--recipe", str(round_dir / "recipe.toml"), "--write-prompts", str(path)])
    assert path.read_bytes() == first  # byte for byte: a kit packed twice carries the same file
    here = resident.round_prompts(recipe, None)
    there = resident.round_prompts(recipe, path)
    assert [(p.text, p.kind) for p in there] == [(p.text, p.kind) for p in here]


def test_a_round_out_of_time_still_ends_with_a_head(round_dir):
    recipe = load_recipe(round_dir / "recipe.toml")
    # out of time from the start: one batch of answers, one batch of features, stages cut short
    timings = resident.run_round(recipe, round_dir / "head", "cpu", resident.Budget(0.01, reserve=0.0))
    assert timings.prompts_answered == 8
    assert (round_dir / "head" / "model.safetensors").is_file()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_the_round_runs_on_cuda_with_the_records_on_the_device(round_dir):
    recipe = load_recipe(round_dir / "recipe.toml")
    timings = resident.run_round(recipe, round_dir / "head", "cuda", resident.Budget(120.0))
    assert timings.prompts_answered == 24 and "cuda" in timings.device


def test_a_round_on_committed_texts_generates_nothing(round_dir):
    """``--texts``: the round trains on a folder of committed answers (opttree.distill.data.texts), all of them."""
    from transformers import AutoModelForCausalLM

    from opttree.distill.data import texts
    from opttree.distill.data.prompts import Prompt

    target = AutoModelForCausalLM.from_pretrained(round_dir / "target").eval()
    tok = tiny_tokenizer()
    settings = texts.TextSettings(texts.target_identity(target), "float32", 6, 96, 5)
    texts.answer_texts(target, tok, round_dir / "texts", settings, [Prompt(f"say {i} things", "qa") for i in range(12)])
    recipe = load_recipe(round_dir / "recipe.toml")
    timings = resident.run_round(recipe, round_dir / "head", "cpu", resident.Budget(60.0),
                                 texts_dirs=(round_dir / "texts",))
    assert timings.prompts_answered == 12 and timings.generate_s == 0.0
    assert timings.rates()["answer_tok_per_s"] is None  # nothing was generated: no rate
    assert timings.answer_tokens == sum(len(r["input_ids"]) - r["prompt_len"] for r in texts.read_texts(round_dir / "texts"))
    assert (round_dir / "head" / "model.safetensors").is_file()
