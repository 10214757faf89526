"""examples/notebook.ipynb runs top to bottom (its code cells are executed in order in one namespace, as a
kernel would; no Jupyter needed) and draws its pictures: on tiny random models with its real-model part
switched off, and (real_model) with it, on SmolLM2 and the shipped head."""

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest
import torch
from threads import real_model_threads

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "notebook.ipynb"
# the notebook's real-model part takes up to two threads; run here, it takes this test worker's share
# of the cores instead (scripts/test.sh runs one worker per core)
NOTEBOOK_THREADS = "min(2, os.cpu_count() or 1)"


def code_cells(path: Path) -> list[str]:
    notebook = json.loads(path.read_text())
    assert notebook["nbformat"] == 4
    return ["".join(cell["source"]) for cell in notebook["cells"] if cell["cell_type"] == "code"]


def run_notebook() -> tuple[dict, int]:
    cells = code_cells(NOTEBOOK)
    assert len(cells) >= 4
    assert sum(NOTEBOOK_THREADS in cell for cell in cells) == 1, "the notebook no longer sets its threads so"
    cells = [cell.replace(NOTEBOOK_THREADS, str(real_model_threads())) for cell in cells]
    namespace: dict = {"__name__": "__notebook__"}
    figures = 0
    threads = torch.get_num_threads()
    try:
        for k, source in enumerate(cells):
            exec(compile(source, f"{NOTEBOOK.name}[code cell {k}]", "exec"), namespace)
            figures += len(plt.get_fignums())
            plt.close("all")
    finally:
        plt.close("all")
        torch.set_num_threads(threads)  # the notebook picks its own
    return namespace, figures


def test_the_notebook_is_stored_without_outputs():
    """Outputs are made by running it, not kept in git (pictures and numbers of one machine and day)."""
    notebook = json.loads(NOTEBOOK.read_text())
    code = [cell for cell in notebook["cells"] if cell["cell_type"] == "code"]
    assert code and all(cell["outputs"] == [] and cell["execution_count"] is None for cell in code)


def test_notebook_runs_and_draws(monkeypatch):
    monkeypatch.setenv("OPTTREE_NOTEBOOK_REAL", "0")
    namespace, figures = run_notebook()
    assert figures >= 2  # the tree and the statistics
    assert namespace["real_target"] is None  # the real part said why it skipped
    assert torch.equal(namespace["auto"].sequences, namespace["plain"])  # the draft_model= path, default tree
    # what the notebook shows is what it claims: a step with accepted draft tokens, all methods equal
    assert namespace["step"].accepted >= 1 and namespace["step"].accepted_nodes
    assert namespace["result"].ok


@pytest.mark.real_model
@pytest.mark.slow
def test_notebook_real_model_part(monkeypatch):
    monkeypatch.setenv("OPTTREE_NOTEBOOK_REAL", "1")
    monkeypatch.chdir(NOTEBOOK.parent)  # as Jupyter starts: in the notebook's folder
    namespace, figures = run_notebook()
    assert namespace["real_target"] is not None, "the real model could not be loaded"
    assert figures >= 3  # the tiny tree, the statistics, and a real step's tree
    assert namespace["real_step"].tree_size > 1 and namespace["real_step"].accepted >= 1
