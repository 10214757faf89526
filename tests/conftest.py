import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
# Tiny models run fastest on one thread (2 threads were ~13x slower on a loaded 2-core machine);
# the real-model test raises it for its own forwards.
torch.set_num_threads(1)


def _versions() -> str:
    import platform

    import transformers

    cpu, flags = platform.processor() or "unknown CPU", ""
    try:
        info = open("/proc/cpuinfo").read()
        cpu = next(line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name"))
        flags = "AMX" if "amx_bf16" in info else "no AMX"
    except (OSError, StopIteration):
        pass
    return f"transformers {transformers.__version__}, torch {torch.__version__}, {cpu} ({flags})"


def pytest_report_header(config):
    return f"opttree suite on {_versions()}"


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if exitstatus != 0:  # a failure names the versions it ran on (a new transformers, say)
        terminalreporter.write_line(f"these failures ran on {_versions()}")


# The files that take longest, longest first (seconds on one worker, AMX Xeon, 2026-11-28). scripts/test.sh
# hands whole files to its workers in collection order (--dist loadfile --no-loadscope-reorder), so
# these start first and no worker is left alone with a long file at the end; the rest keep their order.
LONGEST_FILES = ("test_real_model.py", "test_cpu_caps.py", "test_device_kit.py", "test_compiled_draft.py",
                 "test_batch.py", "test_readme.py", "test_eagle_heads.py", "test_sampling.py", "test_notebook.py",
                 "test_overhead.py", "test_sliding_window.py", "test_long_runs.py")


def longest_first(items: list) -> None:
    """Reorder ``items`` in place: :data:`LONGEST_FILES` first, in that order; the others after, as collected."""
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's tests keep their order


def pytest_collection_modifyitems(config, items):
    longest_first(items)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def _calibration_cache_in_a_temporary_folder(tmp_path_factory):
    """nodes="auto" caches its calibrations on disk: never in the real ~/.cache during tests."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPTTREE_CALIBRATION_DIR", str(tmp_path_factory.mktemp("calibration")))
        mp.delenv("OPTTREE_CALIBRATION", raising=False)
        yield
