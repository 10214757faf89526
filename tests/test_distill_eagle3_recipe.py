"""A recipe of ``kind = "eagle3"`` (opttree.distill.recipes with opttree.distill.eagle3): the round a
lent GPU runs and the resumable round through a cache train a head in the EAGLE-3 layout, so the
shipped folder is one vLLM and SGLang read. On a tiny 8-layer random target: the resident round
ships an EAGLE-3 folder that decodes greedy-equal to plain generate(); a stage goes on from the
stage before it; the cached round resumes a stage exactly from its checkpoint; ``--precision auto``
times the EAGLE-3 step itself. Refused by name: a feature-head field in an eagle3 stage, features
that are not the default taps, an init that is not an EAGLE-3 head of the run's vocabulary, an
unknown kind or top-level key. Negative controls: a checkpoint of other settings is not resumed;
a recipe of the default kind still ships a feature head."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from test_distill import tiny_tokenizer  # noqa: E402
from test_distill_recipe import small_local_texts  # noqa: E402,F401  (fixture)

from opttree import load_draft, speculative  # noqa: E402
from opttree.distill.cli import main  # noqa: E402
from opttree.distill.eagle3 import train as eagle3_train  # noqa: E402
from opttree.distill.eagle3.train import Eagle3TrainConfig, train_eagle3  # noqa: E402
from opttree.distill.recipes import resident  # noqa: E402
from opttree.distill.recipes.precision import probe_round  # noqa: E402
from opttree.distill.recipes.recipe import load_recipe, parse_recipe  # noqa: E402
from opttree.distill.train.checkpoint import CHECKPOINT_FILE  # noqa: E402
from opttree.drafters.head.eagle import EagleHead  # noqa: E402
from opttree.loading.eagle import Eagle3Head  # noqa: E402

RECIPE = """
name = "tiny-eagle3"
seed = 5
target = "target"
kind = "eagle3"

[[source]]
name = "chat"
kind = "answers"
prompts = "chat"
count = 24
max_new_tokens = 8
batch_size = 8
max_prompt_tokens = 96

[features]
layers = [2, 4, 5]
topk = 4
max_len = 128

[[stage]]
name = "first"
epochs = 3
lr = 3e-3
warmup_steps = 2
batch_tokens = 256
draft_vocab_size = 64
eval_every = 5
checkpoint_every = 2
unroll = 2
val_fraction = 0.2
save_dtype = "float32"

[[stage]]
name = "more"
init = "^"
epochs = 2
lr = 1e-3
warmup_steps = 1
batch_tokens = 256
draft_vocab_size = 64
eval_every = 5
unroll = 2
val_fraction = 0.2
answers_only = true
save_dtype = "float32"
"""
EAGLE3_FILES = ["config.json", "model.safetensors", "training.json"]


def eight_layer_target(vocab_size: int):
    """tests/test_distill.py's tiny Llama with 8 layers: EAGLE-3's default taps (2, 4, 5) are distinct."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=8,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=True, eos_token_id=1, pad_token_id=0, bos_token_id=None,
                         initializer_range=0.3)
    model = LlamaForCausalLM(config)
    model.config._attn_implementation = "sdpa"
    return model.eval()


@pytest.fixture()
def recipe_dir(tmp_path, small_local_texts):  # noqa: F811
    tok = tiny_tokenizer()
    eight_layer_target(len(tok)).save_pretrained(tmp_path / "target")
    tok.save_pretrained(tmp_path / "target")
    (tmp_path / "recipe.toml").write_text(RECIPE)
    return tmp_path


def saved_target(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder / "target").eval()


def test_the_resident_round_ships_an_eagle3_folder_that_decodes_as_plain(recipe_dir):
    recipe = load_recipe(recipe_dir / "recipe.toml")
    timings = resident.run_round(recipe, recipe_dir / "head", "cpu", resident.Budget(120.0))
    assert set(timings.stages) == {"first", "more"} and all(s["steps"] > 0 for s in timings.stages.values())
    assert sorted(p.name for p in (recipe_dir / "head").iterdir()) == sorted(EAGLE3_FILES + ["round.json"])
    config = json.loads((recipe_dir / "head" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == 64
    training = json.loads((recipe_dir / "head" / "training.json").read_text())
    assert training["config"]["answers_only"] is True  # the last stage's head
    assert training["init"].endswith("first")  # it went on from the first stage's
    target = saved_target(recipe_dir)
    head = load_draft(recipe_dir / "head", target)
    assert isinstance(head, EagleHead) and isinstance(head, Eagle3Head) and tuple(head.c.taps) == (2, 4, 5)
    ids = torch.randint(4, target.config.vocab_size, (1, 7), generator=torch.Generator().manual_seed(1))
    plain = target.generate(ids, max_new_tokens=16, do_sample=False)
    got = speculative(target).generate(ids, max_new_tokens=16, do_sample=False, draft_model=str(recipe_dir / "head"),
                                      nodes=8)
    assert torch.equal(got, plain)


def test_the_cached_round_ships_an_eagle3_folder_and_resumes_its_stages(recipe_dir, caplog):
    args = ["--recipe", str(recipe_dir / "recipe.toml"), "--cache", str(recipe_dir / "cache"), "--out",
            str(recipe_dir / "out"), "--device", "cpu", "--threads", "1", "--precision", "fp32"]
    assert main(args) == 0
    out = recipe_dir / "out"
    assert sorted(p.name for p in out.iterdir()) == sorted(EAGLE3_FILES + ["data_manifest.json"])
    manifest = json.loads((out / "data_manifest.json").read_text())
    assert manifest["stages"]["more"]["init"] == "stages/first" and manifest["stages"]["first"]["steps"] > 0
    assert (recipe_dir / "cache" / "stages" / "first" / CHECKPOINT_FILE).is_file()
    weights = (out / "model.safetensors").read_bytes()
    caplog.clear()
    with caplog.at_level("INFO", logger="opttree.distill"):
        assert main(args) == 0
    assert "stage first: already complete" in caplog.text and "stage more: already complete" in caplog.text
    assert (out / "model.safetensors").read_bytes() == weights


def tap_records(target, n=12, length=30):
    from opttree.distill.data.features import features_of

    g = torch.Generator().manual_seed(0)
    return [features_of(target, torch.randint(3, target.config.vocab_size, (length,), generator=g), topk=4,
                        layers=(2, 4, 5)) for _ in range(n)]


CFG = Eagle3TrainConfig(draft_vocab_size=48, unroll=2, epochs=3, batch_tokens=96, max_len=29, lr=3e-3, warmup_steps=2,
                        eval_every=4, checkpoint_every=3, val_fraction=0.25, save_dtype="float32")


class Interrupted(Exception):
    pass


def interrupt_after(monkeypatch, steps: int) -> None:
    """Make the ``steps + 1``-th training step's loss raise (evaluations run without grad and pass)."""
    real, calls = eagle3_train.passes_loss, [0]

    def loss(*args, **kwargs):
        if torch.is_grad_enabled():
            calls[0] += 1
            if calls[0] > steps:
                raise Interrupted
        return real(*args, **kwargs)

    monkeypatch.setattr(eagle3_train, "passes_loss", loss)


def test_an_interrupted_eagle3_stage_ends_as_an_uninterrupted_one(tmp_path, monkeypatch, caplog):
    target = eight_layer_target(96)
    records = tap_records(target)
    whole = train_eagle3(target, records, tmp_path / "whole", CFG)
    interrupt_after(monkeypatch, 7)
    with pytest.raises(Interrupted):
        train_eagle3(target, records, tmp_path / "cut", CFG, checkpoint_dir=tmp_path / "ckpt")
    monkeypatch.undo()
    with caplog.at_level("INFO", logger=eagle3_train.__name__):
        resumed = train_eagle3(target, records, tmp_path / "cut", CFG, checkpoint_dir=tmp_path / "ckpt")
    assert "resumed from" in caplog.text and "at step 6/" in caplog.text  # the last checkpoint before step 8
    assert resumed.steps == whole.steps and resumed.losses == whole.losses
    assert (tmp_path / "cut" / "model.safetensors").read_bytes() == (tmp_path / "whole" / "model.safetensors").read_bytes()
    # negative control: a checkpoint of other settings is left alone, and training starts again
    caplog.clear()
    with caplog.at_level("WARNING"):
        other = train_eagle3(target, records, tmp_path / "other", Eagle3TrainConfig(**{**CFG.__dict__, "lr": 1e-3}),
                             checkpoint_dir=tmp_path / "ckpt")
    assert "belongs to other data or settings" in caplog.text and other.losses[0] == whole.losses[0]
    assert other.losses != whole.losses


def test_a_stage_goes_on_from_an_eagle3_folder_and_refuses_another_head(tmp_path):
    target = eight_layer_target(96)
    records = tap_records(target)
    first = train_eagle3(target, records, tmp_path / "first", CFG)
    more = train_eagle3(target, records, tmp_path / "more", CFG, init=tmp_path / "first")
    assert more.initial_agreement == pytest.approx(first.val_agreement, abs=1e-6)  # it starts where the first ended
    with pytest.raises(ValueError, match="keeps 48 draft tokens.*set draft_vocab_size = 48"):
        train_eagle3(target, records, tmp_path / "x", Eagle3TrainConfig(**{**CFG.__dict__, "draft_vocab_size": 40}),
                     init=tmp_path / "first")


def test_precision_auto_times_the_eagle3_step(recipe_dir):
    target = saved_target(recipe_dir)
    recipe = load_recipe(recipe_dir / "recipe.toml")
    cfg = recipe.train_config(recipe.stages[0])
    assert isinstance(cfg, Eagle3TrainConfig)
    probes = probe_round(target, cfg, recipe.features.layers, seconds=0.05, feature_tokens=64, train_tokens=128,
                         scout_tokens=32)
    train = [p for p in probes if p.stage == "train" and not p.scout]
    assert train and all(p.calls >= 1 and p.tokens == 128 for p in train)


def raw(**changes) -> dict:
    import tomllib

    recipe = tomllib.loads(RECIPE)
    for key, value in changes.items():
        if key.startswith("stage_"):
            recipe["stage"][0][key.removeprefix("stage_")] = value
        else:
            recipe[key] = value
    return recipe


def test_what_an_eagle3_recipe_cannot_honour_is_refused_by_name(recipe_dir, tmp_path):
    base = recipe_dir
    assert parse_recipe(raw(), base).kind == "eagle3"
    with pytest.raises(ValueError, match=r"unknown keys \['soft_weight'\] for a recipe of kind 'eagle3'"):
        parse_recipe(raw(stage_soft_weight=1.0), base)
    with pytest.raises(ValueError, match=r"kind must be one of \['eagle3', 'head'\], not 'eagle2'"):
        parse_recipe(raw(kind="eagle2"), base)
    with pytest.raises(ValueError, match=r"unknown top-level keys \['kinds'\]"):
        parse_recipe(raw(kinds="eagle3"), base)
    wrong = raw()
    wrong["features"]["layers"] = [1, -1]
    with pytest.raises(ValueError, match=r"set \[features\] layers = \[2, 4, 5\], not \[1, -1\]"):
        resident.run_round(parse_recipe(wrong, base), tmp_path / "head", "cpu", resident.Budget(60.0))
    assert not (tmp_path / "head").exists()  # refused before any work


def test_an_init_that_is_no_head_is_refused_and_a_feature_head_is_mapped(tmp_path):
    from opttree.distill.train.head_train import HeadTrainConfig, train_head

    from opttree.distill.data.features import features_of

    target = eight_layer_target(96)
    records = tap_records(target)
    g = torch.Generator().manual_seed(1)
    last = [features_of(target, torch.randint(3, 96, (30,), generator=g), topk=4) for _ in range(6)]
    train_head(target, last, tmp_path / "feature-head",
               HeadTrainConfig(num_kept_tokens=48, unroll=1, epochs=1, batch_tokens=96, max_len=29, eval_every=100))
    # a feature head is no longer refused: it is mapped into the layout (test_distill_eagle3_from_head.py)
    assert train_eagle3(target, records, tmp_path / "x", CFG, init=tmp_path / "feature-head").steps > 0
    (tmp_path / "neither").mkdir()
    with pytest.raises(ValueError, match="EAGLE-3 folder, a feature head's, or to \"\" for a new head"):
        train_eagle3(target, records, tmp_path / "y", CFG, init=tmp_path / "neither")
