"""The kernel-, dtype- and rounding-sensitive tests, run on every kernel path this machine can take.

Three CPU kinds each broke the suite once (a bf16 equality that held only on AMX; 32 oneDNN bfloat16
cases on an AVX2-only Zen 3; a float32 near-tie test that assumed a nonzero gap, false on an AMX
Xeon). The guard: :func:`kernel_paths` runs :data:`CHOICE_TESTS` under each ISA cap torch, MKL and
oneDNN take from the environment and with each of opttree's kernels forced, so a test whose outcome
hangs on one CPU's rounding fails on any machine. The AVX2-only path in detail:

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
# The tests whose outcome depends on which kernels and dtypes this CPU offers, or on how it rounds.
CHOICE_TESTS = ["test_linears.py", "test_kernel_choice.py", "test_draft_dtype.py", "test_distill_precision.py",
                "test_low_precision_loading.py", "test_ties.py", "test_devices.py"]

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


def cpu_flags() -> set[str]:
    try:
        info = open("/proc/cpuinfo").read()
    except OSError:
        return set()
    return set(next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), []))


def kernel_paths() -> list[tuple[str, dict[str, str]]]:
    """The kernel paths this machine can be told to take, every value of every knob in at least one run
    (not their product: each run costs the choice tests' ~40 s): torch's vector ISA
    (``ATEN_CPU_CAPABILITY``: "default", i.e. no vectors; avx2 in :data:`AVX2_ONLY`; avx512, where the CPU
    has it, is the suite's own run), MKL's float32 GEMM as on a CPU without AVX-512 (an AMD CPU always
    runs MKL so), oneDNN's ISA below this CPU's (AVX2; AVX-512 without bfloat16; AVX-512 with bfloat16
    but no AMX, as a Zen 4 runs), and opttree's kernel forced to each candidate (``OPTTREE_LINEAR``),
    one candidate per ISA run. :data:`AVX2_ONLY` keeps opttree's own choice (``auto``), the path that
    broke on a Zen 3. Each changes how some product rounds: a test whose outcome depends on one
    CPU's rounding fails under one of them."""
    from opttree.kernels.linears import KERNELS

    flags = cpu_flags()
    isas = [("aten-no-vectors", {"ATEN_CPU_CAPABILITY": "default"})]
    if "avx512f" in flags:
        isas.append(("mkl-avx2", {"MKL_ENABLE_INSTRUCTIONS": "AVX2"}))
    if "avx512bw" in flags:
        isas.append(("onednn-avx512-no-bf16", {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}))
    if "amx_bf16" in flags:
        isas.append(("onednn-avx512-bf16-no-amx", {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}))
    kernels = [(f"kernel-{name}", {"OPTTREE_LINEAR": name}) for name in KERNELS]
    paths = [("avx2-only", AVX2_ONLY)]
    for i in range(max(len(isas), len(kernels))):
        parts = [each[i] for each in (isas, kernels) if i < len(each)]
        paths.append(("+".join(name for name, _ in parts), {k: v for _, env in parts for k, v in env.items()}))
    return paths


def run_choice_tests(caps: dict[str, str], tests: list[str] = CHOICE_TESTS) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", *tests]
    return subprocess.run(cmd, cwd=TESTS, env={**os.environ, **caps}, capture_output=True, text=True, timeout=900)


def matrix() -> list:
    """:func:`kernel_paths` as parameters: AVX2-only (the path that broke on a Zen 3) at both ends of CI, the
    others at its newest end only (marked ``one_end``; ~30 s each): the lowest end's torch 2.13.0 is checked
    on this CPU's own path and AVX2-only, the newest end's torch on every path."""
    return [pytest.param(name, caps, id=name, marks=() if name == "avx2-only" else pytest.mark.one_end)
            for name, caps in kernel_paths()]


@pytest.mark.slow
@pytest.mark.parametrize("name, caps", matrix())
def test_the_rounding_sensitive_tests_pass_on_every_kernel_path(name, caps):
    """The kernel-, dtype- and rounding-sensitive tests under each path :func:`kernel_paths` offers.
    Negative control (found by running the test_ties.py of ed27e1c under these paths on an AMX Xeon,
    model 167): its float32 near-tie test assumed seed 0's plain logits differ, which held on a Zen 4 and
    under ``onednn-avx512-bf16-no-amx`` but not on the AMX Xeon's own path: see
    :func:`test_a_test_that_assumes_one_cpus_rounding_fails_on_some_path`."""
    out = run_choice_tests(caps)
    assert out.returncode == 0, f"{name} ({caps}):\n" + out.stdout[-4000:]


GAPS = """
import json, sys
sys.path.insert(0, %r)
import torch
torch.set_num_threads(1)
from opttree.tools.ties import plain_greedy
from test_ties import near_tie_target
gaps = []
for seed in range(4):
    target, a, b, ids = near_tie_target("llama", seed)
    plain = plain_greedy(target, ids, max_new_tokens=1)
    other = b if plain.tokens[0] == a else a
    gaps.append(float(plain.scores[0][plain.tokens[0]] - plain.scores[0][other]))
print(json.dumps({"gaps": gaps}))
""" % str(TESTS)


@pytest.mark.slow
def test_a_test_that_assumes_one_cpus_rounding_fails_on_some_path():
    """The guard's negative control. ed27e1c's float32 near-tie test assumed that seed 0's two engineered
    logits come out unequal in plain decoding (gap > 0): true on the Zen 4 it was written on, false on
    an AMX Xeon (model 167), where it failed. On that Xeon the paths disagree: this CPU's own gives 0 for
    seed 0, ``aten-no-vectors`` 1.5e-8; so the guard, run there, fails the old test on a path (this
    test) and passes it on another. Shown on a CPU with AMX; elsewhere the gaps are reported."""
    if "amx_bf16" not in cpu_flags():
        gaps = {name: run_python(GAPS, caps)["gaps"] for name, caps in [("this cpu", {})] + kernel_paths()}
        pytest.skip(f"shown on a CPU with AMX (a named CPU feature); the first 4 seeds' gaps per path: {gaps}")
    gaps = {"this cpu": run_python(GAPS, {})["gaps"]}
    assert gaps["this cpu"][0] == 0, gaps  # the old test's assumption fails on this CPU's own path ...
    for name, caps in kernel_paths():  # ... and holds on another (the paths in turn, until one shows it)
        gaps[name] = run_python(GAPS, caps)["gaps"]
        if gaps[name][0] > 0:
            return
    pytest.fail(f"seed 0's gap is 0 on every path: {gaps}")
