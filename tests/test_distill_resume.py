"""Every stage of a round resumes where it stopped: training by optimizer step (a checkpoint of
weights, optimizer state, RNG and step in one safetensors file), features by shard. An interrupted
run, started again, ends exactly where an uninterrupted one does."""

import json

import pytest
import torch

from models import peaked, tiny_model
from opttree.distill.train import head_train
from opttree.distill.train.checkpoint import CHECKPOINT_FILE, load_train_state
from opttree.distill.data.features import features_of
from opttree.distill.train.head_train import HeadTrainConfig, train_head


def texts(n=12, length=30, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 90, (length,), generator=g) for _ in range(n)]


@pytest.fixture(scope="module")
def target():
    return peaked(tiny_model("llama", seed=0), scale=30.0)


@pytest.fixture(scope="module")
def data(target):
    return [features_of(target, t, topk=4) for t in texts()]


CFG = HeadTrainConfig(num_kept_tokens=64, unroll=2, epochs=3, batch_tokens=96, max_len=30, lr=3e-3,
                      warmup_steps=2, eval_every=4, checkpoint_every=3, val_fraction=0.25, noise=0.05)


class Interrupted(Exception):
    pass


def interrupt_after(monkeypatch, steps: int) -> None:
    """Make the ``steps + 1``-th training step raise, as if the process were killed there."""
    real, calls = head_train.train_step, [0]

    def step(*args, **kwargs):
        calls[0] += 1
        if calls[0] > steps:
            raise Interrupted
        return real(*args, **kwargs)

    monkeypatch.setattr(head_train, "train_step", step)


def weights(folder):
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def summary(folder):
    record = json.loads((folder / "training.json").read_text())
    record.pop("train_seconds")
    return record


@pytest.mark.parametrize("stop_at", [2, 5, 7])  # mid-epoch, before/after an evaluation and a checkpoint
def test_an_interrupted_run_ends_as_an_uninterrupted_one(tmp_path, target, data, monkeypatch, stop_at):
    whole = train_head(target, data, tmp_path / "whole", CFG, checkpoint_dir=tmp_path / "whole-ckpt")
    with monkeypatch.context() as m:
        interrupt_after(m, stop_at)
        with pytest.raises(Interrupted):
            train_head(target, data, tmp_path / "cut", CFG, checkpoint_dir=tmp_path / "cut-ckpt")
    resumed = train_head(target, data, tmp_path / "cut", CFG, checkpoint_dir=tmp_path / "cut-ckpt")
    assert resumed.steps == whole.steps > stop_at
    assert resumed.val_agreement == whole.val_agreement
    a, b = weights(tmp_path / "whole"), weights(tmp_path / "cut")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert summary(tmp_path / "whole") == summary(tmp_path / "cut")


def test_the_resume_really_starts_from_the_checkpoint(tmp_path, target, data, monkeypatch):
    """The checkpoint holds the step it was taken at, and a rerun does only the steps after it."""
    with monkeypatch.context() as m:
        interrupt_after(m, 5)
        with pytest.raises(Interrupted):
            train_head(target, data, tmp_path / "cut", CFG, checkpoint_dir=tmp_path / "ckpt")
    key = head_train.run_key(CFG, *_split(data), None)
    state = load_train_state(tmp_path / "ckpt", key)
    assert state is not None and state.step == 4  # the evaluation at step 4 checkpoints; step 5 was lost
    assert state.optimizer and all(v.dtype == torch.float32 for k, v in state.model.items() if v.is_floating_point())
    calls = []
    real = head_train.train_step
    monkeypatch.setattr(head_train, "train_step", lambda *a, **k: calls.append(1) or real(*a, **k))
    result = train_head(target, data, tmp_path / "cut", CFG, checkpoint_dir=tmp_path / "ckpt")
    assert len(calls) == result.steps - 4
    calls.clear()
    again = train_head(target, data, tmp_path / "cut", CFG, checkpoint_dir=tmp_path / "ckpt")  # finished: no step
    assert calls == [] and again.steps == result.steps and again.val_agreement == result.val_agreement


def test_a_checkpoint_of_other_settings_is_not_resumed(tmp_path, target, data, monkeypatch, caplog):
    with monkeypatch.context() as m:
        interrupt_after(m, 5)
        with pytest.raises(Interrupted):
            train_head(target, data, tmp_path / "cut", CFG, checkpoint_dir=tmp_path / "ckpt")
    other = HeadTrainConfig(**{**CFG.__dict__, "lr": 1e-3})
    with caplog.at_level("WARNING"):
        train_head(target, data, tmp_path / "other", other, checkpoint_dir=tmp_path / "ckpt")
    assert "belongs to other data or settings" in caplog.text
    # precision and checkpoint spacing are how a run goes, not what it computes: still resumable
    assert head_train.run_key(CFG, *_split(data), None) == head_train.run_key(
        HeadTrainConfig(**{**CFG.__dict__, "bf16": not CFG.bf16, "checkpoint_every": 7}), *_split(data), None)


def test_a_checkpoint_is_written_atomically_and_never_pickled(tmp_path, target, data, monkeypatch):
    train_head(target, data, tmp_path / "head", CFG, checkpoint_dir=tmp_path / "ckpt")
    path = tmp_path / "ckpt" / CHECKPOINT_FILE
    assert path.exists() and not path.with_name(path.name + ".tmp").exists()
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:  # a plain safetensors file with JSON metadata
        meta = json.loads(f.metadata()["state"])
    assert meta["extra"]["finished"] is True
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("a checkpoint must not be unpickled"))
    assert load_train_state(tmp_path / "ckpt", meta["key"]) is not None


def _split(data):
    from opttree.distill.train.head_data import chunks
    from opttree.distill.train.shared import split_records

    train, val = split_records(data, CFG.val_fraction, CFG.seed)
    return chunks(train, CFG.max_len), chunks(val, CFG.max_len)
