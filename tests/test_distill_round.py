"""A whole round (``opttree distill --recipe``) on a tiny random target, interrupted mid-stage and
run again, ends exactly where an uninterrupted round does; a lost cache is rebuilt and checked
against the manifest; ``--precision auto`` runs each stage in the precision its probe picked."""

import json

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from test_distill_recipe import recipe_dir, run, small_local_texts  # noqa: E402,F401  (fixtures)

from opttree.distill.data import features as features_module  # noqa: E402
from opttree.distill.train import head_train  # noqa: E402
from opttree.distill.recipes import precision  # noqa: E402
from opttree.distill.data.shards import load_records  # noqa: E402


class Interrupted(Exception):
    pass


def fail_on_call(monkeypatch, module, name: str, after: int) -> None:
    """``module.name`` raises on its call number ``after + 1``, as if the process were killed there."""
    real, calls = getattr(module, name), [0]

    def wrapped(*args, **kwargs):
        calls[0] += 1
        if calls[0] > after:
            raise Interrupted
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapped)


def result(folder):
    """What a finished round leaves: the shipped weights and every source's and feature's shard hashes."""
    from safetensors.torch import load_file

    manifest = json.loads((folder / "out" / "data_manifest.json").read_text())
    shards = {k: v["shards"] for part in ("sources", "features") for k, v in manifest[part].items()}
    return load_file(str(folder / "out" / "model.safetensors")), shards, manifest["stages"]


def differences(a, b) -> list[str]:
    """What differs between two finished rounds (``result``'s triples): weights, shards, stages."""
    (wa, sa, ta), (wb, sb, tb) = a, b
    out = [f"weights {k}" for k in sorted(wa.keys() | wb.keys())
           if k not in wa or k not in wb or not torch.equal(wa[k], wb[k])]
    out += [f"shards of {k}: {sa.get(k)} vs {sb.get(k)}" for k in sorted(sa.keys() | sb.keys()) if sa.get(k) != sb.get(k)]
    # a stage's wall-clock "seconds" is the one field that may differ
    strip = [{name: {k: v for k, v in stage.items() if k != "seconds"} for name, stage in s.items()} for s in (ta, tb)]
    out += [f"stages: {strip[0]} vs {strip[1]}"] if strip[0] != strip[1] else []
    return out


@pytest.fixture()
def whole(tmp_path_factory, recipe_dir):
    """An uninterrupted round, in a folder of its own (the same recipe and target)."""
    import shutil

    other = tmp_path_factory.mktemp("whole")
    for name in ("target", "recipe.toml"):
        (shutil.copytree if name == "target" else shutil.copy)(recipe_dir / name, other / name)
    assert run(other) == 0
    return result(other)


@pytest.mark.parametrize("where", ["features", "training"])
def test_an_interrupted_round_ends_as_an_uninterrupted_one(recipe_dir, whole, monkeypatch, where):
    with monkeypatch.context() as m:
        if where == "features":  # killed after the first feature shard was written
            fail_on_call(m, features_module, "save_records", after=1)
        else:  # killed in the middle of the first stage's training
            fail_on_call(m, head_train, "train_step", after=5)
        with pytest.raises(Interrupted):
            run(recipe_dir)
    assert run(recipe_dir) == 0
    assert differences(result(recipe_dir), whole) == []


def test_a_lost_cache_is_rebuilt_and_checked_against_the_manifest(recipe_dir, caplog):
    import shutil

    assert run(recipe_dir) == 0
    cache = recipe_dir / "cache"
    before = json.loads((cache / "manifest.json").read_text())
    shutil.rmtree(cache / "sources")
    shutil.rmtree(cache / "features")
    caplog.set_level("WARNING", logger="opttree.distill")
    assert run(recipe_dir) == 0
    after = json.loads((cache / "manifest.json").read_text())
    for part in ("sources", "features"):
        assert {k: v["shards"] for k, v in after[part].items()} == {k: v["shards"] for k, v in before[part].items()}
    assert "differ from the manifest" not in caplog.text
    # a shard that comes back different is named
    manifest = json.loads((cache / "manifest.json").read_text())
    name = next(iter(manifest["features"]["texts"]["shards"]))
    manifest["features"]["texts"]["shards"][name] = "0" * 64
    (cache / "manifest.json").write_text(json.dumps(manifest))
    shutil.rmtree(cache / "features")
    assert run(recipe_dir) == 0
    assert "features of texts: 1 shard(s) differ from the manifest" in caplog.text


def test_auto_runs_each_stage_in_the_precision_it_measured_fastest(recipe_dir, monkeypatch):
    measured = [precision.Probe("features", "fp32", 100, 1, 1.0), precision.Probe("features", "bf16", 300, 1, 1.0),
                precision.Probe("train", "fp32", 500, 1, 1.0), precision.Probe("train", "bf16", 100, 1, 1.0)]
    monkeypatch.setattr(precision, "probe_round", lambda *a, **k: measured)
    assert run(recipe_dir, "--precision", "auto") == 0
    cache = recipe_dir / "cache"
    manifest = json.loads((cache / "manifest.json").read_text())
    assert (manifest["precision"]["features"], manifest["precision"]["train"]) == ("bf16", "fp32")
    folder = cache / manifest["features"]["made"]["folder"]
    assert all(r["bf16"] for r in load_records(next(folder.glob("shard_*"))))
    assert json.loads((cache / "stages" / "a" / "stage.json").read_text())["precision"] == "fp32"
    # the same cache under a named precision: same folders, nothing made or trained again
    stamp = (cache / "stages" / "b" / "stage.json").stat().st_mtime_ns
    assert run(recipe_dir, "--precision", "fp32") == 0
    assert (cache / "stages" / "b" / "stage.json").stat().st_mtime_ns == stamp


def test_probe_stage_prints_the_measurement(recipe_dir, monkeypatch, capsys):
    measured = [precision.Probe("features", "fp32", 256, 3, 1.0), precision.Probe("features", "bf16", 256, 1, 1.0),
                precision.Probe("train", "fp32", 512, 1, 1.0), precision.Probe("train", "bf16", 512, 2, 1.0)]
    monkeypatch.setattr(precision, "probe_round", lambda *a, **k: measured)
    assert run(recipe_dir, "--stage", "probe", "--precision", "auto") == 0
    out = capsys.readouterr().out
    assert "features: fp32 (bf16 256 tok/s, fp32 768 tok/s)" in out and "train: bf16" in out
    assert not (recipe_dir / "cache" / "stages").exists()
