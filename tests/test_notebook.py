"""examples/notebook.ipynb runs top to bottom on tiny random models (its code cells are executed
in order in one namespace, as a kernel would; no Jupyter needed) and draws its pictures."""

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import torch

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "notebook.ipynb"


def code_cells(path: Path) -> list[str]:
    notebook = json.loads(path.read_text())
    assert notebook["nbformat"] == 4
    return ["".join(cell["source"]) for cell in notebook["cells"] if cell["cell_type"] == "code"]


def test_notebook_runs_and_draws():
    cells = code_cells(NOTEBOOK)
    assert len(cells) >= 4
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
    assert figures >= 2  # the tree and the statistics
    # what the notebook shows is what it claims: a step with accepted draft tokens, all methods equal
    assert namespace["step"].accepted >= 1 and namespace["step"].accepted_nodes
    assert namespace["result"].ok
