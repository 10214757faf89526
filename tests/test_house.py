"""The house's shape, held as test_imports.py holds its layering: the loop and the face read in short
functions."""

import ast
from pathlib import Path

import opttree

PACKAGE = Path(opttree.__file__).parent
LONGEST = 60  # lines of one function in loop/ and integration/ (the loop reads as its numbered steps)


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
    assert long_functions(PACKAGE / "loop", 20)  # control: the measure sees the loop's functions
