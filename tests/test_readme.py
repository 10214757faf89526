"""README.md runs as written: its python blocks, in order, in one namespace, from the repository's root,
on the real SmolLM2 target and the shipped drafts (as the README says); the first block's output is
checked against plain greedy generate(). Without the real model: the blocks compile and their imports
exist, every command the README gives exists, and every file it links. Its wording is its own."""

import ast
import importlib
import importlib.util
import re
from pathlib import Path

import pytest
import torch
from threads import real_model_threads

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def test_every_python_block_compiles_and_its_imports_exist():
    """Each python block compiles, and every name it imports from opttree (or transformers, torch)
    is there: what a reader pastes gets past its imports."""
    text = README.read_text()
    blocks = python_blocks(text)
    assert len(blocks) >= 3
    assert text.count("```python") == len(blocks)  # none missed by the pattern
    imported = []
    for k, block in enumerate(blocks):
        tree = ast.parse(compile(block, f"README.md[python block {k}]", "exec", flags=ast.PyCF_ONLY_AST))
        imported += [(node.module, a.name) for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                     for a in node.names]
        imported += [(a.name, None) for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names]
    assert ("opttree", "speculative") in imported  # control: the blocks' imports are read
    for module, name in imported:
        found = importlib.import_module(module)
        assert name is None or hasattr(found, name) or importlib.util.find_spec(f"{module}.{name}"), (module, name)


def commands(text: str) -> list[str]:
    """The commands the README gives: each line of its bash blocks, and each inline code span that
    starts with ``bash``, ``python`` or ``opttree`` (comments dropped)."""
    lines = [line for block in re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M) for line in block.splitlines()]
    lines += re.findall(r"`((?:bash|python|opttree) [^`]+)`", text)
    return [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]


def missing(command: str) -> str | None:
    """What of ``command`` does not exist here (a script, a module, an opttree subcommand, a file it
    names under the repository), or None."""
    from opttree.cli import COMMANDS

    words = command.split()
    if words[0] == "bash" and not (ROOT / words[1]).is_file():
        return words[1]
    if words[0] == "python" and words[1] == "-m" and importlib.util.find_spec(words[2]) is None:
        return words[2]
    if words[0] == "opttree" and words[1] not in COMMANDS:
        return words[1]
    paths = [w for w in words if "/" in w and (ROOT / w.split("/")[0]).is_dir()]
    return next((p for p in paths if not (ROOT / p).exists()), None)


def test_every_command_it_gives_exists():
    found = commands(README.read_text())
    assert "bash scripts/test.sh" in found and any(c.startswith("opttree bench") for c in found)  # control
    assert {c: missing(c) for c in found if missing(c)} == {}
    assert missing("bash scripts/nowhere.sh") == "scripts/nowhere.sh"  # negative controls
    assert missing("opttree nothing") == "nothing" and missing("python -m opttree.nothing") == "opttree.nothing"
    assert missing("opttree bench --draft drafts/nowhere") == "drafts/nowhere"


def test_every_file_it_links_exists():
    links = re.findall(r"\]\(([^)#:]+)\)", README.read_text())  # [text](path), not URLs
    assert "benchmarks/RESULTS.md" in links  # control
    assert [link for link in links if not (ROOT / link).exists()] == []


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


def test_readme_and_results_stay_within_their_length():
    """README answers a newcomer in at most 200 lines and benchmarks/RESULTS.md today's questions in at
    most 500: history lives in git, not in them."""
    assert len(README.read_text().splitlines()) <= 200
    assert len((ROOT / "benchmarks" / "RESULTS.md").read_text().splitlines()) <= 500
