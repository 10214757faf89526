"""The command line a new user meets first: `opttree`, `python -m opttree`, `opttree bench --quick`
without a question file, clear errors for a wrong file, and honest --help texts."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from models import peaked, tiny_model
from opttree import __version__
from opttree import cli as top
from opttree.bench import cli as bench_cli, models as bench_models
from opttree.bench.questions import CATEGORIES, QUICK_QUESTIONS, load_questions
from opttree.distill import cli as distill_cli
from test_bench import CharTokenizer

SRC = Path(__file__).resolve().parents[1] / "src"


class ShortTokenizer(CharTokenizer):
    """The last 64 characters only: the tiny models' context is 256 tokens, a RAG prompt longer."""

    def encode(self, text, add_special_tokens=False):
        return super().encode(text)[-64:]


def test_opttree_alone_prints_usage_and_fails(capsys):
    assert top.main([]) == 2
    err = capsys.readouterr().err
    assert "usage: opttree {distill,bench,arguments,export,smollm2}" in err and "no command given" in err
    assert top.main(["frobnicate"]) == 2
    assert top.main(["--help"]) == 0 and "usage: opttree" in capsys.readouterr().out


def test_version_and_python_dash_m():
    out = subprocess.run([sys.executable, "-m", "opttree", "--version"], capture_output=True, text=True,
                         env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"}, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == f"opttree {__version__}"


def help_text(capsys, argv) -> str:
    with pytest.raises(SystemExit) as exit_:
        top.main(argv)
    assert exit_.value.code == 0
    return capsys.readouterr().out


def test_bench_help_names_itself_and_shows_each_default_once(capsys):
    text = help_text(capsys, ["bench", "--help"])
    assert text.startswith("usage: opttree bench")
    assert "(default: None)" not in text
    blocks = re.split(r"\n(?=  -|\S)", text)  # one per option (and per group heading)
    assert all(block.count("default") <= 1 for block in blocks), [b for b in blocks if b.count("default") > 1]
    flat = " ".join(text.split())
    assert "plain-fast" in flat and "assisted-fast" in flat and "lookup-fast" in flat  # --methods lists its default's
    assert "github.com/hemingkx/Spec-Bench" in flat
    assert "usage: python -m opttree.bench" in " ".join(_parser_help(bench_cli.parser()).split())


def _parser_help(parser) -> str:
    return parser.format_help()


def test_distill_help_shows_defaults_and_how_long(capsys):
    text = " ".join(help_text(capsys, ["distill", "--help"]).split())
    assert text.startswith("usage: opttree distill")
    assert "(default: 1024)" in text and "(default: 128)" in text and "(default: head)" in text
    assert "How long (measured with `--stage probe`" in text and "tokens/s in bf16" in text  # measured, per precision
    assert "(default: None)" not in text
    assert "'smollm2'" in text


def test_distill_target_takes_the_smollm2_shorthand(monkeypatch):
    import opttree.smollm2

    monkeypatch.setattr(opttree.smollm2, "load_smollm2", lambda *a, **k: ("model", "tokenizer"))
    assert distill_cli.load_target("smollm2") == ("model", "tokenizer")


def test_the_shipped_questions_cover_all_13_categories():
    questions = load_questions(QUICK_QUESTIONS)
    assert sorted({q.category for q in questions}) == sorted(CATEGORIES) and len(CATEGORIES) == 13
    assert all(q.turns and all(t.strip() for t in q.turns) for q in questions)


@pytest.mark.parametrize("line, match", [
    ('{"id": 1, "prompt": "Hi"}', "line 1: not a Spec-Bench question.*question_id"),
    ("not json", "line 1"),
])
def test_a_wrong_question_file_is_a_clear_usage_error(tmp_path, capsys, line, match):
    path = tmp_path / "q.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(ValueError, match=match):
        load_questions(path)
    with pytest.raises(SystemExit) as exit_:
        bench_cli.main(["--questions", str(path)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert re.search(match, err) and "KeyError" not in err


def test_bench_quick_runs_without_a_question_file(tmp_path, monkeypatch, capsys):
    torch.set_num_threads(1)
    target = peaked(tiny_model("llama", seed=0), scale=30.0)
    monkeypatch.setattr(bench_models, "load_target", lambda spec, dtype, device: (target, ShortTokenizer()))
    monkeypatch.setattr(bench_models, "load_draft_model", lambda spec, t, dtype, device: target)
    out = tmp_path / "out"
    code = bench_cli.main(["--quick", "--draft", "x", "--max-new-tokens", "3", "--warmup", "0", "--no-progress",
                           "--no-plots", "--methods", "plain,opttree", "--nodes", "4", "--out", str(out),
                           "--device", "cpu"])
    assert code == 0
    records = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]
    assert {r["category"] for r in records} == set(CATEGORIES)
    header = json.loads((out / "header.json").read_text())
    assert header["questions_file"] == str(QUICK_QUESTIONS)
    printed = capsys.readouterr().out
    assert "answers/opttree.jsonl" in printed and (out / "answers" / "opttree.jsonl").is_file()
