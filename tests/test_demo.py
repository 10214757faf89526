"""examples/demo.py, without the real model: its 4 prompts are of 4 kinds and written for it (none is a
Spec-Bench question), and its speed-up over all of them is total tokens over total time, each
prompt's own figure beside it."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPEC_BENCH = ROOT.parent / "shared" / "data" / "spec_bench_questions.jsonl"


@pytest.fixture(scope="module")
def demo():
    spec = importlib.util.spec_from_file_location("opttree_demo", ROOT / "examples" / "demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_four_prompts_of_four_kinds(demo):
    kinds = [kind for kind, _ in demo.PROMPTS]
    assert len(demo.PROMPTS) == 4 and len(set(kinds)) == 4


@pytest.mark.skipif(not SPEC_BENCH.exists(), reason="Spec-Bench's question file is not on this machine")
def test_no_prompt_is_copied_from_spec_bench(demo):
    turns = [" ".join(t.split()) for line in SPEC_BENCH.read_text().splitlines() if line.strip()
             for t in json.loads(line)["turns"]]
    for _, prompt in demo.PROMPTS:
        flat = " ".join(prompt.split())
        assert not any(flat in t or t in flat for t in turns), prompt


def timed(demo, kind, plain, spec, fast=None):
    """(tokens, seconds) pairs -> a Timed row."""
    return demo.Timed(kind, *plain, *spec, tau=2.0, tree=3.0, lossless="equal to plain",
                      fast_tokens=fast and fast[0], fast_seconds=fast and fast[1])


def test_the_speed_up_over_all_prompts_is_total_tokens_over_total_time(demo):
    runs = [timed(demo, "short", (10, 1.0), (10, 0.25), (10, 0.5)),   # 4x on 10 tokens
            timed(demo, "long", (100, 10.0), (100, 10.0), (100, 8.0))]  # 1x on 100 tokens
    assert demo.speedup(runs[:1]) == pytest.approx(4.0) and demo.speedup(runs[1:]) == pytest.approx(1.0)
    assert demo.speedup(runs) == pytest.approx((110 / 10.25) / (110 / 11.0))  # not the mean of 4 and 1
    assert demo.speedup(runs, "fast") == pytest.approx((110 / 10.25) / (110 / 8.5))
    text = demo.report(runs)
    lines = text.splitlines()
    assert lines[1].startswith("short") and "4.00x" in lines[1] and "2.00x" in lines[1]
    assert lines[2].startswith("long") and "1.00x" in lines[2]
    assert lines[3].startswith("all 2") and f"{demo.speedup(runs):.2f}x" in lines[3]


def test_without_the_kernels_the_report_has_no_fast_column(demo):
    text = demo.report([timed(demo, "writing", (64, 4.0), (64, 2.0))])
    assert "vs fast" not in text and "2.00x" in text
