"""README.md runs as written: its python blocks, in order, in one namespace, from the repository's root,
on the real SmolLM2 target and the shipped drafts (as the README says); the first block's output is
checked against plain greedy generate()."""

import re
from pathlib import Path

import pytest
import torch
from threads import real_model_threads

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def test_every_python_block_compiles_and_the_default_is_documented():
    text = README.read_text()
    blocks = python_blocks(text)
    assert len(blocks) >= 3
    for k, block in enumerate(blocks):
        compile(block, f"README.md[python block {k}]", "exec")
    assert text.count("```python") == len(blocks)  # none missed by the pattern
    flat = " ".join(text.split())
    assert 'With neither `nodes` nor `threshold`, generate() uses `nodes="auto", threshold="auto"`' in flat
    assert "on a GPU" in flat  # where explicit big trees pay


@pytest.mark.real_model
@pytest.mark.slow
def test_the_readme_runs_top_to_bottom(monkeypatch):
    monkeypatch.chdir(ROOT)
    threads = torch.get_num_threads()
    torch.set_num_threads(real_model_threads())
    namespace: dict = {"__name__": "__readme__"}
    try:
        for k, block in enumerate(python_blocks(README.read_text())):
            exec(compile(block, f"README.md[python block {k}]", "exec"), namespace)
            if k == 0:  # the fast set-up is lossless
                target, inputs = namespace["target"], namespace["inputs"]
                ref = target.generate(**inputs, max_new_tokens=64, do_sample=False)
                assert torch.equal(namespace["out"], ref)
    finally:
        torch.set_num_threads(threads)
    assert namespace["model"] is namespace["target"]
    assert namespace["gen"].last_stats.new_tokens > 0
