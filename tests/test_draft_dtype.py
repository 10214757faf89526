"""load_draft(..., dtype="auto"): float32 or bfloat16 picked by a short timed probe (never by CPU flags),
the choice cached as JSON beside the latency calibrations, a bad cache file ignored with a warning, a
bad dtype refused naming what is accepted; and a draft in another dtype leaves the target as it is."""

import json
import logging

import pytest
import torch

from models import tiny_model
from opttree import load_draft
from opttree.loading import dtype_probe
from opttree.loading import draft_dtype as dd
from opttree.loading.draft_dtype import MIN_SPEEDUP, DtypeProbe, choose_dtype
from opttree.loading.dtype_probe import DtypeTimes, cast_copy, time_rounds
from opttree.distill.train.head import new_head
from opttree.loading.head_file import save_head
from opttree.distill.train.model import init_draft
from opttree.loading.draft_model import save_draft

TWO = (torch.float32, torch.bfloat16)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh, empty calibration folder, read and written ("on")."""
    folder = tmp_path / "calibration"
    monkeypatch.setenv("OPTTREE_CALIBRATION_DIR", str(folder))
    monkeypatch.delenv("OPTTREE_CALIBRATION", raising=False)
    return folder


@pytest.fixture
def head_folder(tmp_path):
    target = tiny_model("llama", seed=0)
    head, meta = new_head(target, token_ids=torch.arange(40, 96))
    save_head(head, meta, tmp_path / "head", dtype=torch.float32)
    return target, tmp_path / "head"


def choice_files(folder):
    return sorted(folder.glob("draft-dtype-*.json")) if folder.exists() else []


class Probes:
    """probe_dtypes replaced by fixed timings, counting its calls (or failing, with ``fail``)."""

    def __init__(self, float32=2e-3, bfloat16=1e-3, fail=False):
        self.times, self.fail, self.calls = DtypeTimes(float32, bfloat16), fail, 0

    def __call__(self, model, *args, **kwargs):
        self.calls += 1
        if self.fail:
            raise AssertionError("the probe ran although the choice was cached")
        return self.times


# -- the choice itself ---------------------------------------------------------------------------------


@pytest.mark.parametrize("float32, bf16, expected", [
    (14e-3, 61e-3, torch.float32),  # an AVX2-only CPU: bf16 4x slower
    (30e-3, 10e-3, torch.bfloat16),  # AMX or a GPU-like machine: bf16 3x faster
    (10.0e-3, 9.5e-3, torch.float32),  # within noise: float32
    (10e-3, 10e-3, torch.float32),
    (10e-3, None, torch.float32),  # bf16 does not run here
    (10e-3, float("nan"), torch.float32),
    (10e-3, 0.0, torch.float32),
    (float("inf"), 1e-3, torch.float32),
])
def test_choose_dtype_for_both_kinds_of_machine(float32, bf16, expected):
    assert choose_dtype(float32, bf16) == expected


def test_choose_dtype_takes_bf16_from_the_threshold_on():
    assert choose_dtype(MIN_SPEEDUP * 1e-3, 1e-3) == torch.bfloat16
    assert choose_dtype(MIN_SPEEDUP * 0.99e-3, 1e-3) == torch.float32
    assert choose_dtype(2e-3, 1e-3, min_speedup=2.5) == torch.float32


def test_the_probe_result_describes_itself():
    probe = DtypeProbe("bfloat16", 30e-3, 10e-3, machine="some CPU, 2 threads")
    assert probe.dtype == torch.bfloat16 and probe.speedup == pytest.approx(3.0)
    text = probe.describe()
    assert "bfloat16" in text and "30.00 ms" in text and "10.00 ms" in text and "3.00x" in text
    assert DtypeProbe("float32", 1e-3, None).speedup is None
    assert "does not run" in DtypeProbe("float32", 1e-3, None).describe()


def test_time_rounds_alternates_takes_medians_and_stops_on_a_slow_machine():
    now = [0.0]
    order = []

    def run(name, seconds):
        def call():
            order.append(name)
            now[0] += seconds
        return call

    clock = lambda: now[0]  # noqa: E731
    medians = time_rounds({"a": run("a", 2.0), "b": run("b", 1.0)}, warmup=1, repeats=3, clock=clock,
                          max_seconds=100.0)
    assert medians == {"a": 2.0, "b": 1.0}
    assert order == ["a", "b"] * 4  # one warm-up round, then three, taking turns
    order.clear()
    time_rounds({"a": run("a", 2.0), "b": run("b", 1.0)}, warmup=1, repeats=5, clock=clock, max_seconds=1.0)
    assert order == ["a", "b"] * (1 + dtype_probe.MIN_REPEATS)  # past max_seconds: the fewest timed rounds


# -- what load_draft accepts -----------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["fast", "bfloat16", "AUTO", 3, torch.int64, True])
def test_a_bad_dtype_is_refused_naming_the_accepted_values(head_folder, bad):
    target, folder = head_folder
    with pytest.raises(ValueError) as error:
        load_draft(folder, target, dtype=bad)
    message = str(error.value)
    assert repr(bad) in message and "'auto'" in message and "None" in message and "torch.bfloat16" in message


# -- auto on a tiny head ---------------------------------------------------------------------------------


def test_auto_probes_once_then_reads_the_cache(head_folder, cache, monkeypatch, caplog):
    target, folder = head_folder
    caplog.set_level(logging.INFO, logger="opttree.loading.draft_dtype")
    head = load_draft(folder, target, dtype="auto")  # the real probe, on this machine
    assert head.fc.weight.dtype in TWO and head.out_weight.dtype == head.fc.weight.dtype
    assert target.get_input_embeddings().weight.dtype == torch.float32  # the target is left as it is
    [path] = choice_files(cache)
    data = json.loads(path.read_text())
    assert data["chosen"] == str(head.fc.weight.dtype).removeprefix("torch.")
    assert data["float32_seconds"] > 0 and data["draft"] == str(folder)
    assert data["key"]["cpu"] and data["key"]["threads"] == torch.get_num_threads()
    assert "measured" in caplog.text and data["chosen"] in caplog.text
    # a second load reads the file: no probe (one would raise)
    monkeypatch.setattr(dtype_probe, "probe_dtypes", Probes(fail=True))
    again = load_draft(folder, target, dtype="auto")
    assert again.fc.weight.dtype == head.fc.weight.dtype and "cached" in caplog.text
    # the file decides: a choice written there is the one taken
    path.write_text(json.dumps(dict(data, chosen="bfloat16", float32_seconds=3e-3, bfloat16_seconds=1e-3)))
    assert load_draft(folder, target, dtype="auto").fc.weight.dtype == torch.bfloat16


def test_auto_follows_the_measurement(head_folder, cache, monkeypatch):
    target, folder = head_folder
    monkeypatch.setattr(dtype_probe, "probe_dtypes", Probes(float32=30e-3, bfloat16=10e-3))
    assert load_draft(folder, target, dtype="auto").fc.weight.dtype == torch.bfloat16
    monkeypatch.setenv("OPTTREE_CALIBRATION", "refresh")  # measure again: now bf16 is 4x slower
    monkeypatch.setattr(dtype_probe, "probe_dtypes", Probes(float32=14e-3, bfloat16=61e-3))
    assert load_draft(folder, target, dtype="auto").fc.weight.dtype == torch.float32
    monkeypatch.setenv("OPTTREE_CALIBRATION", "on")
    assert load_draft(folder, target, dtype="auto").fc.weight.dtype == torch.float32  # what refresh wrote
    assert len(choice_files(cache)) == 1


def test_calibration_off_neither_reads_nor_writes(head_folder, cache, monkeypatch):
    target, folder = head_folder
    monkeypatch.setenv("OPTTREE_CALIBRATION", "off")
    probes = Probes()
    monkeypatch.setattr(dtype_probe, "probe_dtypes", probes)
    load_draft(folder, target, dtype="auto")
    load_draft(folder, target, dtype="auto")
    assert probes.calls == 2 and choice_files(cache) == []


def test_another_machine_setting_or_draft_is_another_file(head_folder, cache, monkeypatch, tmp_path):
    target, folder = head_folder
    probes = Probes()
    monkeypatch.setattr(dtype_probe, "probe_dtypes", probes)
    load_draft(folder, target, dtype="auto")
    monkeypatch.setattr(dd, "cpu_model", lambda: "another CPU")
    load_draft(folder, target, dtype="auto")
    head, meta = new_head(target, token_ids=torch.arange(10, 96))  # another draft
    save_head(head, meta, tmp_path / "other", dtype=torch.float32)
    load_draft(tmp_path / "other", target, dtype="auto")
    assert probes.calls == 3 and len(choice_files(cache)) == 3


@pytest.mark.parametrize("junk", [
    "{not json",
    "[1, 2]",
    json.dumps({"format": "something else"}),
    "FOREIGN",  # a valid file of another key (another machine's)
    "BAD_CHOICE",
    "NEGATIVE_TIME",
    "NAN_TIME",
])
def test_a_corrupt_or_foreign_cache_file_is_ignored_with_a_warning(head_folder, cache, monkeypatch, caplog, junk):
    target, folder = head_folder
    probes = Probes(float32=30e-3, bfloat16=10e-3)
    monkeypatch.setattr(dtype_probe, "probe_dtypes", probes)
    load_draft(folder, target, dtype="auto")
    [path] = choice_files(cache)
    good = json.loads(path.read_text())
    text = {"FOREIGN": json.dumps(dict(good, key=dict(good["key"], cpu="elsewhere"))),
            "BAD_CHOICE": json.dumps(dict(good, chosen="float16")),
            "NEGATIVE_TIME": json.dumps(dict(good, float32_seconds=-1.0)),
            "NAN_TIME": json.dumps(dict(good, bfloat16_seconds=float("nan")))}.get(junk, junk)
    path.write_text(text)
    caplog.set_level(logging.WARNING, logger="opttree.loading.draft_dtype")
    head = load_draft(folder, target, dtype="auto")
    assert head.fc.weight.dtype == torch.bfloat16 and probes.calls == 2  # measured again
    assert "ignoring the draft dtype cache" in caplog.text and str(path) in caplog.text
    assert json.loads(path.read_text())["chosen"] == "bfloat16"  # and rewritten


def test_an_unwritable_cache_folder_only_warns(head_folder, tmp_path, monkeypatch, caplog):
    target, folder = head_folder
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("OPTTREE_CALIBRATION_DIR", str(blocker / "calibration"))  # below a file: mkdir fails
    monkeypatch.setattr(dtype_probe, "probe_dtypes", Probes())
    caplog.set_level(logging.WARNING, logger="opttree.loading.draft_dtype")
    assert load_draft(folder, target, dtype="auto").fc.weight.dtype == torch.bfloat16
    assert "could not write the draft dtype cache" in caplog.text


def test_a_cuda_target_takes_the_gpu_rule_without_probing(head_folder, cache, monkeypatch):
    target, folder = head_folder
    head = load_draft(folder, target)
    monkeypatch.setattr(dtype_probe, "probe_dtypes", Probes(fail=True))
    monkeypatch.setattr(dd, "target_device", lambda target: torch.device("cuda", 0))
    monkeypatch.setattr(dd, "machine_name", lambda device: "a GPU")
    for native, expected in ((True, "bfloat16"), (False, "float32")):
        monkeypatch.setattr(dd, "cuda_dtype", lambda device: torch.bfloat16 if native else torch.float32)
        probe = dd.auto_dtype(head, target, folder)
        assert (probe.chosen, probe.how) == (expected, "cuda")
    assert choice_files(cache) == []


@pytest.mark.gpu
def test_auto_on_a_gpu_is_bf16_where_the_gpu_has_it(head_folder, cache):
    target, folder = head_folder
    target = target.to("cuda")
    head = load_draft(folder, target, dtype="auto")
    native = torch.cuda.is_bf16_supported(including_emulation=False)
    assert head.fc.weight.dtype == (torch.bfloat16 if native else torch.float32)


# -- a draft model (the target's layers) -------------------------------------------------------------------


def test_a_draft_model_in_another_dtype_leaves_the_target_as_it_is(tmp_path, cache, monkeypatch):
    target = tiny_model("llama", seed=0)
    draft, meta = init_draft(target, [0], torch.arange(50))
    save_draft(draft, meta, tmp_path / "draft")
    before = target.get_input_embeddings().weight.detach().clone()
    half = load_draft(tmp_path / "draft", target, dtype=torch.bfloat16)
    assert half.get_input_embeddings().weight.dtype == half.lm_head.weight.dtype == torch.bfloat16
    assert target.get_input_embeddings().weight.dtype == torch.float32  # not cast in place
    assert torch.equal(target.get_input_embeddings().weight, before)
    assert half.get_input_embeddings() is not target.get_input_embeddings()
    same = load_draft(tmp_path / "draft", target)  # the target's dtype: the embedding stays shared
    assert same.get_input_embeddings() is target.get_input_embeddings()
    monkeypatch.setattr(dtype_probe, "probe_dtypes", Probes(float32=30e-3, bfloat16=10e-3))
    auto = load_draft(tmp_path / "draft", target, dtype="auto")
    assert auto.dtype == torch.bfloat16 and target.get_input_embeddings().weight.dtype == torch.float32
    ids = torch.tensor([[3, 4, 5, 6]])
    with torch.no_grad():
        assert auto(ids).logits.shape == (1, 4, target.config.vocab_size)


def test_the_real_probe_runs_a_draft_model(tmp_path):
    target = tiny_model("llama", seed=0)
    draft, meta = init_draft(target, [0, 1], torch.arange(60))
    save_draft(draft, meta, tmp_path / "draft")
    loaded = load_draft(tmp_path / "draft", target)
    times = dtype_probe.probe_dtypes(loaded, repeats=2)
    assert times.float32_seconds > 0 and times.bfloat16_seconds is not None and times.bfloat16_seconds > 0
    assert loaded.dtype == torch.float32 and target.get_input_embeddings().weight.dtype == torch.float32


def test_cast_copy_leaves_the_original_and_shares_a_heads_embedding(head_folder):
    target, folder = head_folder
    head = load_draft(folder, target)
    copy = cast_copy(head, torch.bfloat16)
    assert head.fc.weight.dtype == head.out_weight.dtype == torch.float32
    assert copy.fc.weight.dtype == copy.out_weight.dtype == copy.out_bias.dtype == torch.bfloat16
    assert copy.token_ids.dtype == torch.long and torch.equal(copy.token_ids, head.token_ids)
    assert copy.embed[0] is target.get_input_embeddings()  # shared, not copied
    assert copy.fc.weight.requires_grad == head.fc.weight.requires_grad
