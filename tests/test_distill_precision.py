"""``opttree distill --precision auto|bf16|fp32``: the choice follows measured tokens/s per stage,
never the CPU's flags; it is kept per machine in the cache; the round then runs each stage in the
precision picked. Timings are injected: nothing here is timed."""

import json

import pytest
import torch

from opttree.distill.recipes import precision as P
from opttree.distill.recipes.precision import Probe, choose, resolve


def probes(features: dict, train: dict) -> list[Probe]:
    """Probes of 1 second whose rates are ``{precision: tokens/s}``."""
    return ([Probe("features", k, int(v), 1, 1.0) for k, v in features.items()]
            + [Probe("train", k, int(v), 1, 1.0) for k, v in train.items()])


def test_each_stage_takes_its_faster_precision():
    choice = choose(probes({"fp32": 300, "bf16": 60}, {"fp32": 400, "bf16": 2400}))  # AVX2 / AMX-like mix
    assert (choice.features, choice.train) == ("fp32", "bf16")
    choice = choose(probes({"fp32": 300, "bf16": 900}, {"fp32": 500, "bf16": 100}))
    assert (choice.features, choice.train) == ("bf16", "fp32")


def test_ties_and_missing_probes_fall_back_to_fp32():
    assert choose(probes({"fp32": 100, "bf16": 100}, {"fp32": 100, "bf16": 100})).train == "fp32"
    choice = choose(probes({"bf16": 100}, {}))  # fp32 failed?? then bf16; train never measured: fp32
    assert (choice.features, choice.train) == ("bf16", "fp32")
    assert (choose([]).features, choose([]).train) == ("fp32", "fp32")


def test_the_report_prints_what_was_measured():
    text = choose(probes({"fp32": 300, "bf16": 60}, {"fp32": 400, "bf16": 2400}), "Some CPU, 2 threads").report()
    assert "Some CPU, 2 threads" in text and "features: fp32 (bf16 60 tok/s, fp32 300 tok/s)" in text
    assert "train: bf16 (bf16 2,400 tok/s, fp32 400 tok/s)" in text


def test_named_precisions_measure_nothing(tmp_path):
    def measure():
        raise AssertionError("a named precision must not be measured")

    assert resolve("bf16", "cpu", tmp_path, measure).train == "bf16"
    assert resolve("fp32", "cpu", tmp_path, measure).features == "fp32"
    with pytest.raises(ValueError):
        P.named("fp16")


def test_auto_measures_once_per_machine_and_keeps_the_choice(tmp_path, monkeypatch):
    runs = []

    def measure():
        runs.append(1)
        return probes({"fp32": 300, "bf16": 60}, {"fp32": 400, "bf16": 2400})

    first = resolve("auto", "cpu", tmp_path, measure)
    assert first.how == "measured" and (first.features, first.train) == ("fp32", "bf16")
    kept = json.loads((tmp_path / P.CHOICE_FILE).read_text())
    assert kept["train"] == "bf16" and kept["machine"] == P.machine_name("cpu")
    again = resolve("auto", "cpu", tmp_path, measure)  # a resumed round: no flip from timing noise
    assert runs == [1] and again.how == "kept" and again.train == "bf16" and again.probes == first.probes
    monkeypatch.setattr(P, "machine_name", lambda device: "another machine")
    assert resolve("auto", "cpu", tmp_path, measure).how == "measured" and runs == [1, 1]


def test_cpu_flags_decide_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(P, "bf16_flags", lambda: ["amx_bf16", "avx512_bf16"])
    choice = resolve("auto", "cpu", None, lambda: probes({"fp32": 300, "bf16": 60}, {"fp32": 400, "bf16": 80}))
    assert (choice.features, choice.train) == ("fp32", "fp32")


def test_the_probes_run_the_real_stage_code():
    """The probe callables are the round's own code on its shapes (one call each, not timed)."""
    from models import tiny_model
    from opttree.distill.train.head_train import HeadTrainConfig

    target = tiny_model("llama", seed=0)
    cfg = HeadTrainConfig(num_kept_tokens=64, unroll=2, max_len=16, feature_layers=(1, -1))
    record = P.feature_probe(target, 24, (1, -1), 4, bf16=False)()
    assert record["hidden"].shape == (24, 64) and record["hidden"].dtype == torch.float16
    loss = P.train_probe(target, cfg, 32, bf16=True)()
    assert isinstance(loss, float) and loss > 0


def test_alternating_probes_see_the_same_load():
    """A load that starts halfway through slows both candidates, not just the one timed last."""
    now, calls = [0.0], []

    def clock():
        return now[0]

    def make(name, cost):
        def fn():
            calls.append(name)
            slow = 3.0 if len(calls) > 6 else 1.0  # another job starts after the sixth call
            now[0] += cost * slow
        return fn

    timed = P.time_alternating({"fp32": make("fp32", 0.2), "bf16": make("bf16", 0.1)}, seconds=1.0, clock=clock)
    assert calls[:4] == ["fp32", "bf16", "fp32", "bf16"]  # warm-ups, then turns
    (n32, t32), (n16, t16) = timed["fp32"], timed["bf16"]
    assert n32 == n16 and t16 >= 1.0
    assert (n16 / t16) / (n32 / t32) == pytest.approx(2.0)  # the true ratio, despite the load


class FakeStages:
    """Probe callables that cost ``per_token[precision][stage] * positions`` seconds of a fake clock."""

    def __init__(self, monkeypatch, per_token: dict):
        self.now, self.calls = 0.0, []
        self.per_token = per_token

        def make(stage):
            def probe(*args, bf16):
                positions = args[2] if stage == "train" else args[1]  # (target, cfg, n) / (target, n, ...)
                precision = "bf16" if bf16 else "fp32"

                def fn():
                    self.calls.append((stage, precision, positions))
                    self.now += self.per_token[precision][stage] * positions
                return fn
            return probe

        monkeypatch.setattr(P, "feature_probe", make("features"))
        monkeypatch.setattr(P, "train_probe", make("train"))

    def clock(self) -> float:
        return self.now


def scouted(monkeypatch, per_token):
    from opttree.distill.train.head_train import HeadTrainConfig

    fake = FakeStages(monkeypatch, per_token)
    probes = P.probe_round(None, HeadTrainConfig(max_len=512), seconds=1.0, feature_tokens=256,
                           train_tokens=512, clock=fake.clock)
    return fake, probes


def test_a_precision_far_slower_at_the_scouting_shape_is_never_timed_at_the_full_shape(monkeypatch):
    # AVX2-only EPYC: bf16 4-5x slower; before the scout, its full-shape training step ran 3 times
    fake, probes = scouted(monkeypatch, {"fp32": {"features": 3e-3, "train": 3e-3},
                                         "bf16": {"features": 15e-3, "train": 12e-3}})
    assert {(s, p, n) for s, p, n in fake.calls if p == "bf16"} == {("features", "bf16", 64), ("train", "bf16", 64)}
    assert sum(1 for s, p, n in fake.calls if p == "bf16") == 4  # warm-up + one timed call per stage
    assert ("features", "fp32", 256) in fake.calls and ("train", "fp32", 512) in fake.calls
    scouts = [p for p in probes if p.scout]
    assert {(p.stage, p.precision, p.tokens) for p in scouts} == {("features", "bf16", 64), ("train", "bf16", 64)}
    choice = choose(probes, "an AVX2 CPU")
    assert (choice.features, choice.train) == ("fp32", "fp32")
    assert "bf16 67 tok/s at 64 positions" in choice.report()


def test_a_close_scouting_times_both_at_the_full_shape_and_the_full_shape_decides(monkeypatch):
    # negative control: 1.5x apart at the scout is no verdict; the full shape decides each stage
    fake, probes = scouted(monkeypatch, {"fp32": {"features": 3e-3, "train": 3e-3},
                                         "bf16": {"features": 4.5e-3, "train": 2e-3}})
    assert ("features", "bf16", 256) in fake.calls and ("train", "bf16", 512) in fake.calls
    assert not any(p.scout for p in probes)
    assert (choose(probes).features, choose(probes).train) == ("fp32", "bf16")
    # AMX-like: fp32 is the one that loses the scouting, by 4x
    fake, probes = scouted(monkeypatch, {"fp32": {"features": 4e-3, "train": 4e-3},
                                         "bf16": {"features": 1e-3, "train": 1e-3}})
    assert not any(p == "fp32" and n > 64 for s, p, n in fake.calls)
    assert (choose(probes).features, choose(probes).train) == ("bf16", "bf16")


def test_a_kept_choice_remembers_which_probes_only_scouted(tmp_path):
    measured = [Probe("features", "fp32", 256, 4, 1.0), Probe("features", "bf16", 64, 1, 2.0, scout=True),
                Probe("train", "fp32", 512, 2, 1.0), Probe("train", "bf16", 64, 1, 1.0, scout=True)]
    first = resolve("auto", "cpu", tmp_path, lambda: measured)
    again = resolve("auto", "cpu", tmp_path, lambda: [])
    assert again.how == "kept" and again.probes == first.probes == tuple(measured)
