"""DESIGN.md stays true to the code: every constant it quotes as ``NAME = value`` is the code's, the
loop's steps are numbered as loop/generation.py numbers them, every file it names exists, and it
stays short enough to read (measurements belong in benchmarks/RESULTS.md)."""

import ast
import importlib
import re
from pathlib import Path

import pytest

import opttree

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "DESIGN.md"
PACKAGE = Path(opttree.__file__).parent
MOST_LINES = 300


def quoted_constants(text: str) -> dict[str, str]:
    """``NAME = value`` (or ``Class.field = value``) spans of the text -> the value as written."""
    return dict(re.findall(r"`([A-Z][A-Za-z0-9_]*(?:\.[a-z_]+)?) = ([-\d(\[][^`]*)`", text))


def defined_in(name: str) -> str:
    """The opttree module that defines ``name`` at its top (a constant, or a class for Class.field)."""
    top = name.split(".")[0]
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            targets = ([t.id for t in node.targets if isinstance(t, ast.Name)] if isinstance(node, ast.Assign) else
                       [node.target.id] if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) else
                       [node.name] if isinstance(node, ast.ClassDef) else [])
            if top in targets:
                parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
                return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    raise LookupError(f"{name}: defined nowhere in opttree")


def code_value(name: str):
    value = importlib.import_module(defined_in(name))
    for part in name.split("."):
        value = getattr(value, part)
    return value


def test_every_constant_design_quotes_is_the_codes():
    quoted = quoted_constants(DESIGN.read_text())
    # the ones that once drifted from the code must be among them
    assert {"CALIBRATION_PREFIX", "TIMING_ORDER", "BUDGET_FORWARDS", "BUDGET_SECONDS"} <= set(quoted)
    wrong = {name: (text, code_value(name)) for name, text in quoted.items()
             if ast.literal_eval(text) != code_value(name)}
    assert wrong == {}


def test_the_checker_catches_a_wrong_quote():
    assert quoted_constants("a `CALIBRATION_PREFIX = 256`-token prefix") == {"CALIBRATION_PREFIX": "256"}
    assert ast.literal_eval("256") != code_value("CALIBRATION_PREFIX")
    assert code_value("TreeConfig.nodes") == 60
    with pytest.raises(LookupError):
        defined_in("NO_SUCH_CONSTANT")


def code_steps() -> list[tuple[int, str]]:
    """The numbered step comments of speculative_decode: [(n, first word)]."""
    source = (PACKAGE / "loop" / "generation.py").read_text()
    node = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == "speculative_decode")
    body = "\n".join(source.splitlines()[node.lineno - 1:node.end_lineno])
    return [(int(n), word.lower()) for n, word in re.findall(r"#\s*(\d)\.\s+(\w+)", body)]


def design_steps() -> list[tuple[int, str]]:
    """DESIGN's numbered steps under "The loop": [(n, first word of the italic name)]."""
    section = DESIGN.read_text().split("## The loop", 1)[1].split("\n## ", 1)[0]
    return [(int(n), word.lower()) for n, word in re.findall(r"^(\d)\. \*(\w+)", section, flags=re.M)]


def test_design_numbers_the_loops_steps_as_the_code():
    steps = code_steps()
    assert [n for n, _ in steps] == list(range(7))  # control: the code's seven steps are read
    assert design_steps() == steps


def test_every_file_design_names_exists():
    names = set(re.findall(r"`((?:[a-z_]+/)+[a-z_]*\.(?:py|md))`", DESIGN.read_text()))
    assert {"hf/compiled.py", "hf/width.py", "budget/timing.py"} <= names  # control: the names are read
    missing = [n for n in names if not (ROOT / n).exists() and not (PACKAGE / n).exists()]
    assert missing == []


def test_design_is_short_and_holds_no_measurement():
    text = DESIGN.read_text()
    assert len(text.splitlines()) <= MOST_LINES
    assert re.findall(r"\d\s?(?:ms|µs|s)\b|\d+(?:\.\d+)?\s?×(?! eps)", text) == []  # timings and speed-ups: RESULTS.md


def floors(may_import: dict[str, set[str]]) -> dict[str, int]:
    """A folder's floor: 1 above the highest floor among the folders it may import (1 for none)."""
    memo: dict[str, int] = {}

    def floor(folder: str) -> int:
        if folder not in memo:
            memo[folder] = 1 + max((floor(f) for f in may_import[folder]), default=0)
        return memo[folder]
    return {folder: floor(folder) for folder in may_import}


def drawn_floors(text: str) -> dict[str, int]:
    """DESIGN's list "- floor N: `a/` ... `b/` ..." -> {a: N, b: N} (folders named as `name/`)."""
    out = {}
    for number, rest in re.findall(r"^- floor (\d): (.*?)(?=^- |\Z)", text, flags=re.S | re.M):
        for folder in re.findall(r"`(\w+)/`", rest):
            out.setdefault(folder, int(number))
    return out


def test_the_floors_design_draws_are_the_folders_declared_imports():
    """DESIGN's floors, from the "May import" sentences that tests/test_imports.py holds the code to."""
    from test_imports import MAY_IMPORT
    drawn = drawn_floors(DESIGN.read_text())
    assert {folder: drawn.get(folder) for folder in MAY_IMPORT} == floors(MAY_IMPORT)
    # negative controls: an arrow up moves a floor, and a folder drawn on the wrong floor is read as drawn
    assert floors({"a": {"b"}, "b": set()}) == {"a": 2, "b": 1}
    assert drawn_floors("- floor 2: `loop/` (x) and `budget/`\n- floor 1: `tree/`\n") == {"loop": 2, "budget": 2, "tree": 1}


TORCH_PRIVATE = {"_dynamo", "_version"}  # torch's own (torch._dynamo, a tensor's _version), not transformers'


def foreign_privates(sources: dict[str, str]) -> list[tuple[str, int, str]]:
    """``x._name`` reads and writes whose name opttree never defines (a transformers or torch private),
    in the given sources (path -> text); opttree's own names (defined anywhere in the package) pass."""
    own = set()
    for text in [p.read_text() for p in PACKAGE.rglob("*.py")] + list(sources.values()):
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                own.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and \
                    isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                own.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                own.add(node.id)
            elif isinstance(node, ast.Dict):  # a class made by type(name, bases, {"_field": ...})
                own |= {key.value for key in node.keys if isinstance(key, ast.Constant) and isinstance(key.value, str)}
    return sorted((path, node.lineno, node.attr) for path, text in sources.items() for node in ast.walk(ast.parse(text))
                  if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                  and node.attr not in own and node.attr not in TORCH_PRIVATE)


def test_outside_hf_the_runtime_touches_no_private_name_of_transformers():
    """DESIGN: `hf/` is where transformers' internals are touched. The runtime's other folders
    (kernels/ aside: torch's own CPU ops) read and write no private attribute opttree does not define."""
    runtime = ("integration", "loop", "loading", "drafters", "budget", "verify", "tree")
    sources = {str(p.relative_to(PACKAGE)): p.read_text() for folder in runtime for p in (PACKAGE / folder).rglob("*.py")}
    assert foreign_privates(sources) == []
    # negative controls: generate()'s prepared pad token and a config's attention switch are caught
    caught = foreign_privates({"x.py": "def f(g, c):\n    c._attn_implementation = 's'\n    return g._pad_token_tensor\n"})
    assert [name for _, _, name in caught] == ["_attn_implementation", "_pad_token_tensor"]
