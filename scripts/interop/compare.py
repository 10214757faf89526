"""scripts/interop.sh's verdict on the vLLM check: per-position acceptance of vLLM and of opttree's chain,
for the exported head (`taps`) and for the control with its taps shifted by one layer (`shifted`).

  compare.py RESULTS_DIR DTYPE [DTYPE ...]
reads RESULTS_DIR/{vllm,opttree}-{taps,shifted}-DTYPE.json (vllm_run.py's and opttree_run.py's).
Fails (exit 1) when the engines differ by more than 0.01 at any position, or when the shifted taps
do not move an engine's mean acceptance length by more than 0.02."""

from __future__ import annotations

import json
import sys
from pathlib import Path

AGREE, MOVE = 0.01, 0.02


def read(folder: Path, engine: str, head: str, dtype: str) -> dict:
    return json.loads((folder / f"{engine}-{head}-{dtype}.json").read_text())


def row(report: dict) -> str:
    return " / ".join(f"{a:.3f}" for a in report["acceptance"]) + f"  (tau {1 + sum(report['acceptance']):.4f}, " \
        f"{report['drafts']} drafts)"


def main(folder: str, *dtypes: str) -> int:
    failures = []
    for dtype in dtypes:
        runs = {(e, h): read(Path(folder), e, h, dtype) for e in ("vllm", "opttree") for h in ("taps", "shifted")}
        for head in ("taps", "shifted"):
            v, o = runs["vllm", head], runs["opttree", head]
            gap = max(abs(a - b) for a, b in zip(v["acceptance"], o["acceptance"]))
            same = sum(a == b for a, b in zip(v["outputs"], o["outputs"]))
            print(f"vllm    {dtype:8s} {head:7s} {row(v)}")
            print(f"opttree {dtype:8s} {head:7s} {row(o)}")
            print(f"        max gap per position {gap:.4f} (<= {AGREE}); outputs equal on {same}/{len(v['outputs'])}")
            if gap > AGREE:
                failures.append(f"{dtype} {head}: the engines' acceptance differs by {gap:.4f}")
        for engine in ("vllm", "opttree"):
            moved = sum(runs[engine, "taps"]["acceptance"]) - sum(runs[engine, "shifted"]["acceptance"])
            print(f"{engine:7s} {dtype:8s} shifted taps move its mean acceptance length by {-moved:+.4f}")
            if abs(moved) <= MOVE:
                failures.append(f"{dtype}: the shifted taps do not move {engine} (by {moved:.4f})")
    for failure in failures:
        print(f"FAIL: {failure}")
    print("vllm: " + ("FAIL" if failures else "OK: the engines agree per position, and the shifted taps move both"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
