"""`opttree bench` checks every argument before it loads a model: a bad one ends the command with exit
code 2 and one line on stderr that names the argument and the fix, never a traceback, and no model is
loaded (before: a missing --target path ended in "Repo id must be in the form ...", --methods plain,bogus
and --nodes 0 in tracebacks, the last two only after the models had loaded)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from opttree.bench import cli, models as bench_models
from opttree.smollm2 import GGUF_FILE

ROOT = Path(__file__).resolve().parents[1]


class Loaded(Exception):
    """A loader was called."""


@pytest.fixture
def no_loading(monkeypatch):
    """Every model loader raises Loaded: a command that reaches one has checked its arguments too late."""
    def refuse(*args, **kwargs):
        raise Loaded(args[0] if args else None)

    monkeypatch.setattr(bench_models, "load_target", refuse)
    monkeypatch.setattr(bench_models, "load_draft_model", refuse)


def error_line(capsys, argv) -> str:
    """The command's stderr for ``argv``, which must be one line, after exit code 2."""
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv, prog="opttree bench")
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("opttree bench: error: ")
    return lines[0]


def bad_arguments(tmp: Path) -> list[tuple[list[str], str]]:
    """(argv, what its one line must say) for each kind of bad argument."""
    empty = tmp / "empty"
    empty.mkdir()
    a_file = tmp / "a_file"
    a_file.write_text("x")
    return [
        (["--target", str(tmp / "missing")], rf"--target {tmp}/missing: no such folder .*give 'smollm2', a folder "
                                             r"holding a from_pretrained model \(config\.json\)"),
        (["--target", str(empty)], rf"--target {empty}: that folder holds no {re.escape(GGUF_FILE)} nor config\.json"),
        (["--target", str(a_file)], r"a file, not a folder; give 'smollm2'"),
        (["--target", "smollm2:13b"], r"--target smollm2:13b: size '13b': name one of 1b, 7b, or give every field"),
        (["--target", "smollm2:hidden_size=8"], r"give every field as hidden_size=N,intermediate_size=N"),
        (["--methods", "plain,bogus"],
         r"unknown method 'bogus'; known: plain, plain-fast, .*opttree-compiled, vllm, vllm-eagle3$"),
        (["--nodes", "0"], r"nodes must be an integer >= 1 \(the tree's node budget\) or 'auto', got 0"),
        (["--nodes", "x"], r"argument --nodes: invalid int value: 'x'"),
        (["--threshold", "-1"], r"threshold must be a finite number >= 0"),
        (["--max-depth", "0"], r"max_depth must be an integer >= 1, got 0"),
        (["--strategy", "bogus"], r"strategy must be one of \('opt', .*got 'bogus'"),
        (["--verifier", "bogus"], r"verifier must be one of \('match', .*got 'bogus'"),
        (["--opttree", "nodes=0"], r"--opttree nodes=0: nodes must be an integer >= 1"),
        (["--opttree", "depth=3"], r"--opttree depth=3: unknown tree settings \['depth'\]; known: nodes, threshold"),
        (["--opttree", "nodes"], r"bad tree setting 'nodes': write key=value"),
        (["--draft", str(tmp / "missing")], rf"--draft {tmp}/missing: no such folder .*give an `opttree distill` "
                                            r"folder, .*truncated:N"),
        (["--draft", str(empty)], r"that folder holds no opttree_draft\.json nor config\.json"),
        (["--draft", "truncated:0"], r"--draft truncated:0: truncated:N takes a whole number N >= 1"),
        (["--draft", "truncated:two"], r"--draft truncated:two: truncated:N takes a whole number N >= 1"),
        (["--assistant", str(tmp / "missing")], r"--assistant .*/missing: no such folder"),
        (["--max-new-tokens", "0"], r"argument --max-new-tokens: give a whole number >= 1, not '0'"),
        (["--per-category", "0"], r"argument --per-category: give a whole number >= 1"),
        (["--max-turns", "0"], r"argument --max-turns: give a whole number >= 1"),
        (["--warmup", "-1"], r"argument --warmup: give a whole number >= 0, not '-1'"),
        (["--threads", "0"], r"argument --threads: give a whole number >= 1"),
        (["--prompt-lookup", "0"], r"argument --prompt-lookup: give a whole number >= 1"),
        (["--assistant-tokens", "0"], r"argument --assistant-tokens: give a whole number >= 1"),
        (["--mix-lookup", "2"], r"argument --mix-lookup: give a number in \[0, 1\]"),
        (["--seed", str(2**64)], r"argument --seed: give a whole number from -9223372036854775808 to "
                                 r"18446744073709551615 \(torch.manual_seed's range\), not '18446744073709551616'"),
        (["--device", "gpu0"], r"--device gpu0: not a device name; give cpu, cuda, cuda:1, \.\.\. or auto"),
        (["--device", "cuda:99"], r"--device cuda:99: this (torch sees no CUDA GPU; give --device cpu|"
                                  r"machine has \d+ CUDA GPU)"),
        (["--out", str(a_file)], r"--out .*a_file: a file, not a folder"),
        (["--questions", str(tmp / "q.jsonl")], r"q\.jsonl: no such question file\. Get Spec-Bench's"),
        (["--categories", "poetry"], r"poetry"),
        (["--dtype", "float64"], r"argument --dtype: invalid choice: 'float64'"),
    ]


def test_each_bad_argument_is_one_line_naming_the_fix_before_any_model_loads(no_loading, capsys, tmp_path):
    for argv, words in bad_arguments(tmp_path):
        line = error_line(capsys, argv)
        assert re.search(words, line), (argv, line)


def test_good_arguments_do_reach_the_loader(no_loading, tmp_path):
    """Control: the same command with good arguments loads the models (the patched loader is the one
    main calls, so an argument checked after loading would have shown above)."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    for argv in (["--methods", "plain", "--seed", "-1"],
                 ["--target", "smollm2:7b", "--nodes", "3", "--draft", "truncated:2"],
                 ["--target", str(folder), "--draft", str(folder), "--opttree", "nodes=4,compiled=1"],
                 ["--target", "HuggingFaceTB/SmolLM2-135M-Instruct", "--device", "cpu", "--methods", "plain,lookup"]):
        with pytest.raises(Loaded):
            cli.main(argv)


def test_the_spec_checks_take_every_form_the_loaders_take(tmp_path):
    gguf = tmp_path / "gguf"
    gguf.mkdir()
    (gguf / GGUF_FILE).write_text("")
    for spec in ("smollm2", "smollm2:1b", "smollm2:7b", f"{gguf}:1b", str(gguf), "org/name", "gpt2",
                 "smollm2:hidden_size=2048,intermediate_size=5632,num_attention_heads=32,num_key_value_heads=8,"
                 "num_hidden_layers=30"):
        bench_models.check_target_spec(spec)
    for spec in (None, "none", "truncated:1", "truncated:12", str(ROOT / "drafts" / "smollm2-135m-head"),
                 str(ROOT / "drafts" / "smollm2-135m-draft"), "org/name"):
        bench_models.check_draft_spec(spec)
    assert bench_models.resolve_device("cpu") == "cpu"
    assert bench_models.resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize("fails, words", [
    (OSError("x is not a local folder and is not a valid model identifier listed on\n'https://huggingface.co/models'"),
     r"--target x: x is not a local folder and is not a valid model identifier listed on 'https://huggingface"),
    (MemoryError("inflating to Shape(...) needs 22.0 GiB of weights; 3.0 GiB are free: pick a smaller size"),
     r"--target x: inflating .* pick a smaller size"),
])
def test_a_model_that_does_not_load_is_one_line_naming_it(monkeypatch, capsys, fails, words):
    """What only loading can tell (a Hub id the Hub lacks, a stand-in too big for the device): one
    line naming the argument, whatever the loader's message spans."""
    def load(*args, **kwargs):
        raise fails

    monkeypatch.setattr(bench_models, "load_target", load)
    assert re.search(words, error_line(capsys, ["--target", "x", "--methods", "plain"]))


def test_truncated_past_the_target_s_layers_is_one_line_naming_its_layer_count(monkeypatch, capsys):
    from models import tiny_model
    from test_bench import CharTokenizer

    target = tiny_model("llama")  # 2 layers
    monkeypatch.setattr(bench_models, "load_target", lambda spec, dtype, device: (target, CharTokenizer()))
    line = error_line(capsys, ["--draft", "truncated:9", "--methods", "plain,opttree"])
    assert "--draft truncated:9: num_layers must be between 1 and the target's layer count (2), got 9" in line


@pytest.mark.parametrize("argv, words", [
    (["--target", "/nonexistent"], "--target /nonexistent: no such folder"),
    (["--methods", "plain,bogus"], "unknown method 'bogus'; known: plain,"),
    (["--nodes", "0"], "nodes must be an integer >= 1"),
])
def test_the_issue_s_commands_as_a_user_runs_them(argv, words):
    """`opttree bench ...` in a process of its own: exit code 2, stderr one line, no traceback."""
    out = subprocess.run([sys.executable, "-m", "opttree", "bench", *argv], capture_output=True, text=True,
                         env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"},
                         timeout=300)
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.startswith("opttree bench: error: ") and words in out.stderr
