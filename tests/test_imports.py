"""No import cycles inside opttree, counting the imports hidden inside functions (which only move a
cycle's failure from import time to call time). And no folder imports a folder above it (the layering
each folder's __init__.py states)."""

import ast
import re
from pathlib import Path

import pytest

import opttree


def module_names(root: Path) -> dict[str, Path]:
    out = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def import_graph(root: Path) -> dict[str, set[str]]:
    """module -> the package's modules it imports anywhere in its code (functions included)."""
    modules = module_names(root)
    graph = {m: set() for m in modules}
    for name, path in modules.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else [])) \
                    if node.level else node.module or ""
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            graph[name] |= {t for t in targets if t in modules and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), set()

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.add(frozenset(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_opttree_has_no_import_cycle():
    found = cycles(import_graph(Path(opttree.__file__).parent))
    assert found == set(), sorted(map(sorted, found))


def test_the_bench_package_has_no_import_cycle():
    graph = import_graph(Path(opttree.__file__).parent)
    bench = {m: {t for t in ts if t.startswith("opttree.bench")} for m, ts in graph.items() if m.startswith("opttree.bench")}
    assert cycles(bench) == set()
    assert "opttree.bench.records" in bench["opttree.bench.plots"]  # the graph sees the imports (control)


def test_the_checker_finds_a_cycle_hidden_in_a_function(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from .b import g\n\ndef f():\n    return g()\n")
    (package / "b.py").write_text("def g():\n    from .a import f\n    return f\n")
    (package / "sub" / "__init__.py").write_text("from .c import h\n")
    (package / "sub" / "c.py").write_text("from .. import a\n\ndef h():\n    from . import h\n")
    assert cycles(import_graph(package)) == {frozenset({"pkg.a", "pkg.b"}), frozenset({"pkg.sub", "pkg.sub.c"})}


# Each folder of opttree declares the folders it may import in its __init__.py's docstring, in one
# sentence "May import: :mod:`opttree.X`, ...." (or "May import: nothing else of opttree"): the face on
# top, then the loop and the loading of draft folders, the budget, the drafters and the verifiers, with
# tree, hf and kernels at the ground. Training (distill) imports the runtime, never the reverse.
DECLARING = ("integration", "loop", "loading", "budget", "drafters", "verify", "tools", "tree", "hf", "kernels")


def declared_imports(docstring: str) -> set[str]:
    """The folders a docstring's "May import:" sentence names (its end: the first period before a space)."""
    found = re.search(r"^May import: (.*?)\.(?:\s|$)", docstring, flags=re.S | re.M)
    assert found, "the docstring has no 'May import: ...' sentence"
    if found.group(1).startswith("nothing else of opttree"):
        return set()
    return set(re.findall(r":mod:`opttree\.(\w+)`", found.group(1)))


def folder_docstring(folder: str) -> str:
    return ast.get_docstring(ast.parse((Path(opttree.__file__).parent / folder / "__init__.py").read_text())) or ""


MAY_IMPORT = {folder: declared_imports(folder_docstring(folder)) for folder in DECLARING}
RUNTIME = ("integration", "loop", "loading", "drafters", "budget", "verify", "tree", "hf", "kernels")


FOLDERS = set(MAY_IMPORT) | {"distill", "bench"}


def folder_of(module: str) -> str:
    """opttree.loop.rows -> "loop"; opttree.cli (a module of the top) -> "" (the package itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in FOLDERS else ""


def wrong_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """The imports of a module in a folder of MAY_IMPORT that reach a folder it may not import."""
    return sorted((m, t) for m, ts in graph.items() for t in ts
                  if folder_of(m) in MAY_IMPORT and folder_of(t) != folder_of(m)
                  and folder_of(t) not in MAY_IMPORT[folder_of(m)])


def test_each_folder_imports_only_the_folders_below_it():
    graph = import_graph(Path(opttree.__file__).parent)
    assert wrong_imports(graph) == []
    crossings = {(folder_of(m), folder_of(t)) for m, ts in graph.items() for t in ts}
    assert ("loop", "tree") in crossings and ("integration", "loop") in crossings  # the graph sees them (control)
    # negative control: an arrow back up is caught
    up = {"opttree.tree.builder": {"opttree.loop.rows"}}
    assert wrong_imports(up) == [("opttree.tree.builder", "opttree.loop.rows")]


def test_decoding_never_imports_training():
    """The runtime's folders (and the package's own face) never import opttree.distill; distill
    imports the runtime (the folders' formats live in opttree.loading)."""
    graph = import_graph(Path(opttree.__file__).parent)
    into_distill = sorted((m, t) for m, ts in graph.items() for t in ts
                          if folder_of(t) == "distill" and folder_of(m) in RUNTIME + ("",))
    assert into_distill == []
    assert any(folder_of(t) == "loading" for m, ts in graph.items() if folder_of(m) == "distill" for t in ts)  # control
    # negative control: an arrow from the runtime into training is caught
    assert wrong_imports({"opttree.drafters.make": {"opttree.distill.train.model"}}) == [
        ("opttree.drafters.make", "opttree.distill.train.model")]


# distill/'s rooms, each a floor (their __init__.py says why): the command (cli.py, on top) runs the
# recipes, the recipes run the trainers, the trainers read the data. A new room is declared here.
DISTILL_MAY_IMPORT = {
    "recipes": {"eagle3", "train", "data"},
    "eagle3": {"train", "data"},
    "train": {"data"},
    "data": set(),
}


DISTILL_TOP = ("cli", "__main__")  # with distill/__init__.py: the command, above every room


def distill_room(module: str) -> str:
    """opttree.distill.train.head -> "train"; opttree.distill.cli (the top) -> ""."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "distill" and parts[2] not in DISTILL_TOP else ""


def wrong_distill_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """The imports of a module in a room of distill/ that reach the top or a room it may not import
    (a room not declared in DISTILL_MAY_IMPORT may import nothing of distill/)."""
    return sorted((m, t) for m, ts in graph.items() for t in ts
                  if distill_room(m) and t.startswith("opttree.distill") and distill_room(t) != distill_room(m)
                  and distill_room(t) not in DISTILL_MAY_IMPORT.get(distill_room(m), set()))


def test_each_room_of_distill_imports_only_the_rooms_below_it():
    graph = import_graph(Path(opttree.__file__).parent)
    assert wrong_distill_imports(graph) == []
    rooms = {p.parent.name for p in (Path(opttree.__file__).parent / "distill").glob("*/__init__.py")}
    assert rooms == set(DISTILL_MAY_IMPORT), "declare each room of distill/ in DISTILL_MAY_IMPORT"
    crossings = {(distill_room(m), distill_room(t)) for m, ts in graph.items() for t in ts}
    assert ("recipes", "train") in crossings and ("train", "data") in crossings  # the graph sees them (control)
    # negative controls: an arrow back up, and one from a room to the command, are caught
    up = {"opttree.distill.data.features": {"opttree.distill.train.head"},
          "opttree.distill.train.head": {"opttree.distill.cli"}}
    assert wrong_distill_imports(up) == [("opttree.distill.data.features", "opttree.distill.train.head"),
                                         ("opttree.distill.train.head", "opttree.distill.cli")]


def test_generate_with_a_draft_folder_loads_no_training_module(tmp_path):
    """A decode from a draft folder, in a fresh process, never imports opttree.distill."""
    import subprocess
    import sys
    code = f"""
import sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
import opttree
torch.manual_seed(0)
config = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
target = LlamaForCausalLM(config).eval()
from opttree.loading.head_file import HeadMeta, save_head, HEAD_FORMAT
from opttree.loading.files import embedding_checksum
from opttree.drafters.head.feature_head import FeatureHead, HeadConfig
c = HeadConfig.for_target(target.config)
head = FeatureHead(c, target.get_input_embeddings(), target.lm_head.weight.detach().float(), torch.arange(c.vocab_size))
save_head(head, HeadMeta(HEAD_FORMAT, c.to_dict(), None, embedding_checksum(target)), {str(tmp_path)!r})
gen = opttree.SpeculativeGenerator(target, {str(tmp_path)!r}, nodes=4, threshold=0.0)
gen.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=4, do_sample=False)
print(sorted(m for m in sys.modules if m.startswith("opttree.distill")))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_each_folder_declares_what_it_may_import_in_its_docstring():
    """The layering the tests hold is the one each folder's docstring states (read, not restated here)."""
    assert MAY_IMPORT["tree"] == set() and MAY_IMPORT["verify"] == {"tree"}  # ground and near-ground (control)
    assert {"loop", "loading", "budget", "drafters", "verify", "tree", "hf", "kernels"} <= MAY_IMPORT["integration"]
    assert "budget" not in MAY_IMPORT["loop"]  # the loop reaches the budget through the plan's seam in tree/
    for folder, allowed in MAY_IMPORT.items():
        assert allowed <= set(DECLARING) - {folder}, (folder, allowed)
    # negative controls: a docstring without the sentence is refused; the sentence ends at its first period
    with pytest.raises(AssertionError, match="May import"):
        declared_imports("Pure torch.\n\nImported by the loop.")
    assert declared_imports("May import: :mod:`opttree.tree`. Used by :mod:`opttree.loop`.") == {"tree"}
    assert declared_imports("May import: nothing else of opttree (beside :mod:`opttree.tree`).") == set()
