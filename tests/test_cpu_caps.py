"""The kernel- and dtype-choice tests, run as an AVX2-only CPU would run them, on any machine.

torch and oneDNN take caps from the environment (:data:`AVX2_ONLY`). Measured on an AMD EPYC Zen 4
(AVX-512 with AVX512-BF16), torch 2.13.0: ``ONEDNN_MAX_CPU_ISA=AVX2`` makes oneDNN refuse bfloat16
exactly as on a Zen 3 ("bf16 path needs the cpu support avx_ne_convert or avx512bw, ...") and run
float32 matmuls as ``brg_matmul:avx2`` (``ONEDNN_VERBOSE=1``); stock bfloat16 ``F.linear`` then
takes torch's own GEMM, as on an AVX2 CPU. ``ATEN_CPU_CAPABILITY=avx2`` caps torch's vectorised
kernels and Inductor's code (``torch.backends.cpu.get_cpu_capability()``, ``pick_vec_isa()``).
Not reached by any cap: ``torch.cpu.get_capabilities()`` (cpuinfo reads the CPU itself; opttree
decides nothing by it), and MKL's float32 GEMM on an AMD CPU (``MKL_ENABLE_INSTRUCTIONS=AVX2`` is
set, but MKL_VERBOSE names no instruction set there, so its effect cannot be seen). Before
``candidates()`` asked oneDNN, the capped run of test_linears.py failed its 32 bfloat16 oneDNN
cases, as the Zen 3 did: the negative control :func:`test_the_capped_cpu_refuses_onednns_bfloat16`
shows the cap reaches the op that failed there.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
AVX2_ONLY = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
# The tests whose outcome depends on which kernels and dtypes this CPU offers.
CHOICE_TESTS = ["test_linears.py", "test_kernel_choice.py", "test_draft_dtype.py", "test_distill_precision.py",
                "test_low_precision_loading.py", "test_ties.py"]

PROBE = """
import json, torch
from opttree.kernels import linears
from opttree.kernels.cpu import cpu_support
s = cpu_support()
w, x = torch.randn(32, 16, dtype=torch.bfloat16), torch.randn(2, 16, dtype=torch.bfloat16)
try:
    torch.ops.mkldnn._reorder_linear_weight(w, 16)
    reorder = "ran"
except RuntimeError as e:
    reorder = str(e)
print(json.dumps({"onednn_bf16": s.onednn_bf16, "aten_isa": s.aten_isa, "reorder": reorder,
                  "bf16_candidates": list(linears.candidates(torch.bfloat16, 1))}))
"""


def run_python(code: str, caps: dict[str, str]) -> dict:
    env = {**os.environ, **caps}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_capped_cpu_refuses_onednns_bfloat16():
    capped = run_python(PROBE, AVX2_ONLY)
    assert capped["aten_isa"] == "AVX2" and capped["onednn_bf16"] is False
    assert "bf16 path needs the cpu support" in capped["reorder"]  # the op that failed on the Zen 3 fails here too
    assert capped["bf16_candidates"] == ["stock"]  # and is not offered
    uncapped = run_python(PROBE, {})  # control: without the caps, what this CPU itself reports
    assert (uncapped["reorder"] == "ran") == uncapped["onednn_bf16"]
    assert ("onednn" in uncapped["bf16_candidates"]) == uncapped["onednn_bf16"]


@pytest.mark.slow
def test_the_kernel_and_dtype_choice_tests_pass_as_on_an_avx2_only_cpu():
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", *CHOICE_TESTS]
    out = subprocess.run(cmd, cwd=TESTS, env={**os.environ, **AVX2_ONLY}, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stdout[-4000:]
