"""The house's shape, held as test_imports.py holds its layering: the loop and the face read in short
functions."""

import ast
from pathlib import Path

import opttree

PACKAGE = Path(opttree.__file__).parent
LONGEST = 60  # lines of one function in loop/, integration/ and drafters/ (the loop reads as its numbered steps)


def long_functions(folder: Path, most: int) -> list[str]:
    """'file:function (lines)' for each function of the folder's modules longer than ``most`` lines."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > most:
                    found.append(f"{path.relative_to(PACKAGE)}:{node.name} ({lines})")
    return found


def test_no_function_of_the_loop_or_the_face_is_longer_than_a_screen():
    assert long_functions(PACKAGE / "loop", LONGEST) == []
    assert long_functions(PACKAGE / "integration", LONGEST) == []
    assert long_functions(PACKAGE / "drafters", LONGEST) == []
    assert long_functions(PACKAGE / "loop", 20)  # control: the measure sees the loop's functions


# -- the cost stand-in stays with the bench ---------------------------------------------------------

DECODING_PATH = ("integration", "loop", "budget", "drafters", "verify", "tree", "hf", "kernels")
STAND_IN = {"opttree.bench.inflate"}  # the inflation (what a draft reads of a width: opttree.hf.width)


def stand_in_importers(graph: dict[str, set[str]]) -> set[str]:
    """The modules outside the stand-in that import it, but the bench's."""
    return {m for m, ts in graph.items() if ts & STAND_IN and m not in STAND_IN and not m.startswith("opttree.bench")}


def test_decoding_never_imports_the_cost_stand_in():
    """An inflated target is an ordinary target: what a draft reads of its width is a config field any
    target may carry (opttree.hf.width); the inflation lives with the bench, its only user."""
    from test_imports import import_graph

    graph = import_graph(PACKAGE)
    assert stand_in_importers(graph) == set()
    assert "opttree.bench.inflate" in graph["opttree.bench.models"]  # control: the graph sees the bench's import
    # negative control: a loop module importing the inflation is caught
    assert stand_in_importers({"opttree.loop.rows": {"opttree.bench.inflate"}}) == {"opttree.loop.rows"}


# -- every folder's docstring names each of its modules ---------------------------------------------

def unnamed_modules(package: Path) -> dict[str, list[str]]:
    """folder -> the modules (and subpackages) of it that its __init__.py docstring does not name as
    :mod:`.name`, for every folder of ``package`` (the package itself is its folders' map: not held)."""
    out = {}
    for init in sorted(package.rglob("__init__.py")):
        folder = init.parent
        if folder == package:
            continue
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        names = [p.stem for p in folder.glob("*.py") if p.name != "__init__.py"]
        names += [p.parent.name for p in folder.glob("*/__init__.py")]
        missing = sorted(n for n in names if f":mod:`.{n}`" not in doc)
        if missing:
            out[str(folder.relative_to(package))] = missing
    return out


def test_each_folder_docstring_names_every_module_of_it(tmp_path):
    unnamed = unnamed_modules(PACKAGE)
    assert unnamed == {}
    # negative control: a module the docstring leaves out is named
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "sub" / "__init__.py").write_text('"""* :mod:`.a`: one."""\n')
    (tmp_path / "pkg" / "sub" / "a.py").write_text("")
    (tmp_path / "pkg" / "sub" / "b.py").write_text("")
    assert unnamed_modules(tmp_path / "pkg") == {"sub": ["b"]}
