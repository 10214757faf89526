"""``opttree distill --recipe``: one command from a recipe file to a saved head, on a tiny random
Llama target (seconds): sources (generated answers and teacher-forced texts) → fused features →
two stages (the second grows the head to two layers and fused features) → the shipped folder,
with a manifest of hashes; a second run resumes (trains nothing again)."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from test_distill import tiny_target, tiny_tokenizer  # noqa: E402

from opttree import load_draft  # noqa: E402
from opttree.distill.cli import main  # noqa: E402
from opttree.distill.recipes.recipe import load_recipe, parse_recipe  # noqa: E402
from opttree.distill.data.shards import load_records, sha256  # noqa: E402

RECIPE = """
name = "tiny"
seed = 3
target = "target"

[[source]]
name = "made"
kind = "answers"
prompts = "selfmade"
count = 12
max_new_tokens = 6
batch_size = 6
topk = 4

[[source]]
name = "texts"
kind = "teacher"
count = 6

[features]
layers = [1, 3, -1]
topk = 4
max_len = 96
shard_size = 8

[[stage]]
name = "a"
minutes = 1
epochs = 1
batch_tokens = 256
num_kept_tokens = 64
eval_every = 4
unroll = 2
val_fraction = 0.2

[[stage]]
name = "b"
init = "^"
sources = ["texts"]
epochs = 1
batch_tokens = 256
eval_every = 4
unroll = 2
num_layers = 2
feature_layers = [1, 3, -1]
answers_only = true
val_fraction = 0.2
"""


@pytest.fixture(autouse=True)
def small_local_texts(monkeypatch):
    """The machine's documents and stdlib take seconds to scan: a few stand-ins keep this fast."""
    from opttree.distill.data import sources

    doc = "The quick brown fox jumps over the lazy dog. " * 30
    monkeypatch.setattr(sources, "local_documents", lambda: (("foxes", doc), ("dogs", doc[::-1])))
    monkeypatch.setattr(sources, "stdlib_functions", lambda: ("def f(x):\n    return x + 1\n",))
    monkeypatch.setattr(sources, "german_strings", lambda: ("Das ist ein kurzer Satz auf Deutsch hier.",))


@pytest.fixture()
def recipe_dir(tmp_path):
    tok = tiny_tokenizer()
    target = tiny_target(len(tok))
    target.save_pretrained(tmp_path / "target")
    tok.save_pretrained(tmp_path / "target")
    (tmp_path / "recipe.toml").write_text(RECIPE)
    return tmp_path


def run(recipe_dir, *extra):
    return main(["--recipe", str(recipe_dir / "recipe.toml"), "--cache", str(recipe_dir / "cache"),
                 "--out", str(recipe_dir / "out"), "--device", "cpu", "--threads", "1",
                 *extra, *([] if "--precision" in extra else ["--precision", "fp32"])])


def test_one_command_rebuilds_a_head_and_resumes(recipe_dir, caplog):
    assert run(recipe_dir) == 0
    out, cache = recipe_dir / "out", recipe_dir / "cache"
    manifest = json.loads((out / "data_manifest.json").read_text())
    assert set(manifest["sources"]) == {"made", "texts"}
    assert manifest["sources"]["made"]["texts"] == 12 and manifest["sources"]["texts"]["texts"] == 6
    for name, entry in manifest["sources"].items():  # every shard is listed with its hash
        assert entry["shards"] and all(sha256(cache / "sources" / name / f) == h for f, h in entry["shards"].items())
    feats = manifest["features"]["made"]
    record = load_records(cache / feats["folder"] / next(iter(feats["shards"])))[0]
    assert record["hidden"].shape[1] == 3 * 32 and record["layers"] == [1, 3, -1]
    assert manifest["stages"]["b"]["init"].endswith("stages/a")

    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(recipe_dir / "target").eval()
    head = load_draft(out, target)
    assert head.c.num_layers == 2 and head.c.feature_layers == (1, 3, -1)
    out_hidden = target(torch.tensor([[5, 6, 7]]), output_hidden_states=True).hidden_states
    assert head.target_features(out_hidden).shape == (1, 3, 32)

    stamp = (cache / "stages" / "b" / "stage.json").stat().st_mtime_ns
    caplog.set_level("INFO", logger="opttree.distill")
    assert run(recipe_dir) == 0  # resumes: nothing is generated or trained again
    assert (cache / "stages" / "b" / "stage.json").stat().st_mtime_ns == stamp
    assert "stage b: already complete" in caplog.text


def test_a_changed_source_is_refused_not_mixed(recipe_dir):
    assert run(recipe_dir, "--stage", "data") == 0
    (recipe_dir / "recipe.toml").write_text(RECIPE.replace("count = 12", "count = 13"))
    with pytest.raises(SystemExit, match="made by other settings"):
        run(recipe_dir, "--stage", "data")


def test_recipe_typos_and_missing_layers_are_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown keys"):
        parse_recipe({"source": [{"name": "a", "kind": "teacher", "count": 1, "cuont": 2}],
                      "stage": [{"name": "s"}]}, tmp_path)
    with pytest.raises(ValueError, match="keeps"):
        parse_recipe({"source": [{"name": "a", "kind": "teacher", "count": 1}],
                      "stage": [{"name": "s", "feature_layers": [2, -1]}]}, tmp_path)
    with pytest.raises(ValueError, match=r"needs a \[\[source\]\].*add one"):  # was "unique names (got [])"
        parse_recipe({"stage": [{"name": "s"}]}, tmp_path)
    with pytest.raises(ValueError, match="unique names"):
        parse_recipe({"source": [{"name": "a", "kind": "teacher", "count": 1}] * 2, "stage": [{"name": "s"}]},
                     tmp_path)


def test_a_stage_starts_from_the_one_before_a_named_folder_or_nothing(tmp_path):
    """The init rule both runners (recipe_run, resident) take from opttree.distill.recipes.stages."""
    from opttree.distill.recipes.stages import stage_init

    recipe = parse_recipe({"source": [{"name": "a", "kind": "teacher", "count": 1}],
                           "stage": [{"name": "s"}, {"name": "t", "init": "^"}, {"name": "u", "init": "heads/old"}]},
                          tmp_path)
    new, chained, named = recipe.stages
    assert stage_init(recipe, new, tmp_path / "before") is None
    assert stage_init(recipe, chained, tmp_path / "s") == tmp_path / "s"
    assert stage_init(recipe, chained, None) is None  # the first stage has none before it
    assert stage_init(recipe, named, tmp_path / "t") == tmp_path / "heads" / "old"


@pytest.mark.parametrize("name", ["smollm2-135m-head/recipe.toml", "smollm2-135m-head/ablation-cpu.toml",
                                  "smollm2-135m-head/round-cpu.toml", "smollm2-135m-head/ablation34-cpu.toml",
                                  "smollm2-135m-head/round-gpu.toml", "smollm2-135m-eagle3/round-cpu.toml",
                                  "smollm2-135m-eagle3/round-cpu-2.toml"])
def test_shipped_recipes_parse(name):
    from pathlib import Path

    recipe = load_recipe(Path(__file__).resolve().parents[1] / "drafts" / name)
    assert recipe.stages and all(recipe.train_config(s) for s in recipe.stages)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_the_same_command_runs_on_cuda(recipe_dir):
    assert main(["--recipe", str(recipe_dir / "recipe.toml"), "--cache", str(recipe_dir / "cache"),
                 "--out", str(recipe_dir / "out"), "--device", "cuda"]) == 0
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(recipe_dir / "target").eval()
    assert load_draft(recipe_dir / "out", target).c.num_layers == 2


def test_flags_the_recipe_holds_are_refused_beside_it(tmp_path, capsys):
    """One path: beside --recipe, a flag that describes a run without a recipe is refused (never ignored)."""
    recipe = tmp_path / "r.toml"
    recipe.write_text("")
    for extra in (["--target", "smollm2"], ["--kind=layers"], ["--lr", "1e-3"], ["--answers-only"]):
        with pytest.raises(SystemExit) as stop:
            main(["--recipe", str(recipe), "--cache", str(tmp_path / "c"), "--out", str(tmp_path / "o")] + extra)
        assert stop.value.code == 2
        assert extra[0].split("=")[0] in capsys.readouterr().err
    # control: the flags a recipe run reads pass the check (the run then refuses the empty recipe)
    from opttree.distill.cli import build_parser, recipe_held_flags
    argv = ["--recipe", str(recipe), "--cache", "c", "--out", "o", "--stage", "probe", "--precision", "fp32",
            "--device", "cpu", "--threads", "1", "--probe-seconds", "0.5"]
    assert recipe_held_flags(build_parser(), build_parser().parse_args(argv), argv) == []
