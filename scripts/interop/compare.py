"""scripts/interop.sh's verdict on the vLLM check: per-position acceptance of vLLM and of opttree's chain,
for the exported head (`taps`) and for the control with its taps shifted by one layer (`shifted`).

  compare.py RESULTS_DIR DTYPE [DTYPE ...]
reads RESULTS_DIR/{vllm,opttree}-{taps,shifted}-DTYPE.json (vllm_run.py's and opttree_run.py's, per prompt).
The engines are compared on the prompts where their greedy outputs are equal (the same texts: in bfloat16
the two targets part at near-ties, and then the drafts are on other texts); all prompts' figures are printed
too. Fails (exit 1) when, on those prompts, the engines differ by more than 0.01 at any position, when fewer
than 3 prompts have equal outputs, or when the shifted taps do not move an engine's acceptance
(all prompts) at some position by more than 0.01, the tolerance the engines are called equal within: the
target's greedy text does not depend on the head, so each engine's move is its drafts', not other texts'."""

from __future__ import annotations

import json
import sys
from pathlib import Path

AGREE, MIN_SAME = 0.01, 3


def read(folder: Path, engine: str, head: str, dtype: str) -> dict:
    return json.loads((folder / f"{engine}-{head}-{dtype}.json").read_text())


def acceptance(report: dict, prompts: list[int]) -> list[float]:
    """Accepted at each position / drafts reaching it, pooled over ``prompts``."""
    accepted = [sum(report["accepted_per_pos"][p][i] for p in prompts) for i in range(report["k"])]
    drafted = [sum(report["drafts"][p][i] for p in prompts) for i in range(report["k"])]
    return [a / max(d, 1) for a, d in zip(accepted, drafted)]


def show(rates: list[float]) -> str:
    return " / ".join(f"{a:.3f}" for a in rates) + f" (tau {1 + sum(rates):.4f})"


def compare(runs: dict, dtype: str, head: str) -> list[str]:
    v, o = runs["vllm", head], runs["opttree", head]
    every = list(range(len(v["outputs"])))
    same = [p for p in every if v["outputs"][p] == o["outputs"][p]]
    va, oa = acceptance(v, same), acceptance(o, same)
    gap = max(abs(a - b) for a, b in zip(va, oa))
    print(f"{dtype} {head}: outputs equal on {len(same)}/{len(every)} prompts; on those, per position "
          f"vllm {show(va)}, opttree {show(oa)}, max gap {gap:.4f} (<= {AGREE})")
    drafts = {e: sum(d[0] for d in r["drafts"]) for e, r in (("vllm", v), ("opttree", o))}
    print(f"{dtype} {head}: all prompts, vllm {show(acceptance(v, every))} ({drafts['vllm']} drafts), "
          f"opttree {show(acceptance(o, every))} ({drafts['opttree']} drafts)")
    failures = [f"{dtype} {head}: the engines differ by {gap:.4f}"] if gap > AGREE else []
    if len(same) < MIN_SAME:
        failures.append(f"{dtype} {head}: outputs equal on only {len(same)}/{len(every)} prompts (< {MIN_SAME})")
    return failures


def main(folder: str, *dtypes: str) -> int:
    failures = []
    for dtype in dtypes:
        runs = {(e, h): read(Path(folder), e, h, dtype) for e in ("vllm", "opttree") for h in ("taps", "shifted")}
        for head in ("taps", "shifted"):
            failures += compare(runs, dtype, head)
        for engine in ("vllm", "opttree"):
            every = list(range(len(runs[engine, "taps"]["outputs"])))
            taps, shifted = acceptance(runs[engine, "taps"], every), acceptance(runs[engine, "shifted"], every)
            moved = max(abs(a - b) for a, b in zip(taps, shifted))
            print(f"{dtype} control: the taps shifted by one layer move {engine}'s acceptance by up to {moved:.4f} "
                  f"per position (> {AGREE}): {show(taps)} -> {show(shifted)}")
            if moved <= AGREE:
                failures.append(f"{dtype}: the shifted taps do not move {engine} (by {moved:.4f})")
    for failure in failures:
        print(f"FAIL: {failure}")
    print("vllm: " + ("FAIL" if failures else "OK: the engines agree per position; the shifted taps move both"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
