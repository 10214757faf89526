"""What ``load_draft(path, target, dtype="auto")`` measures and picks on this machine, for the shipped drafts.

For each draft folder: ``--runs`` probes (each a fresh measurement: ``OPTTREE_CALIBRATION=off``),
their float32 and bfloat16 times per probe round (:mod:`opttree.loading.dtype_probe`), the ratio,
the choice, and the wall time of the whole ``load_draft(..., dtype="auto")`` call; then one load
that reads the cached choice (in a temporary calibration folder: the real cache is left alone).

    python benchmarks/draft_dtype.py --threads 1
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch

from opttree import load_draft
from opttree.loading.draft_dtype import auto_dtype
from opttree.loading.machine import bf16_flags, cpu_model
from opttree.smollm2 import load_smollm2

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--draft", action="append", default=None,
                        help="a draft folder (repeatable); default: the shipped head and draft")
    parser.add_argument("--threads", type=int, default=None, help="torch threads; default: torch's")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ["OPTTREE_CALIBRATION_DIR"] = tempfile.mkdtemp(prefix="opttree-draft-dtype-")
    drafts = args.draft or [str(ROOT / "drafts" / "smollm2-135m-head"), str(ROOT / "drafts" / "smollm2-135m-draft")]
    target, _ = load_smollm2()
    print(f"{cpu_model()} (flags, not used: {' '.join(bf16_flags()) or 'none'}), {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}")
    for path in drafts:
        base = load_draft(path, target)
        for run in range(args.runs):
            os.environ["OPTTREE_CALIBRATION"] = "off"
            start = time.perf_counter()
            probe = auto_dtype(base, target, Path(path))
            probe_s = time.perf_counter() - start
            start = time.perf_counter()
            model = load_draft(path, target, dtype="auto")
            load_s = time.perf_counter() - start
            print(f"{Path(path).name} run {run}: float32 {probe.float32_seconds * 1e3:.2f} ms, bfloat16 "
                  f"{probe.bfloat16_seconds * 1e3:.2f} ms per probe round ({probe.speedup:.2f}x) -> {probe.chosen}; "
                  f"probe {probe_s:.2f} s, load_draft(auto) {load_s:.2f} s -> {next(model.parameters()).dtype}")
        os.environ["OPTTREE_CALIBRATION"] = "on"
        load_draft(path, target, dtype="auto")  # measures and writes the file
        start = time.perf_counter()
        model = load_draft(path, target, dtype="auto")
        print(f"{Path(path).name} cached: load_draft(auto) {time.perf_counter() - start:.2f} s -> "
              f"{next(model.parameters()).dtype}")


if __name__ == "__main__":
    main()
