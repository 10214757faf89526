"""What a benchmark found: per-category summaries, a markdown report, Spec-Bench answer files.

Definitions (Spec-Bench's, greedy, batch 1):
* tokens/s: Σ new tokens / Σ wall time of the generate() calls;
* speedup: Σ wall time of plain generate() / Σ wall time of the method over the same turns
  (the outputs being equal, this is also the ratio of tokens/s); "median" is the median of the
  per-turn ratios, less sensitive to a single slow turn;
* τ: mean accepted tokens per decoding step = Σ new tokens / Σ target forwards that emitted
  tokens (each step's accepted draft tokens plus the target's bonus token; plain: 1.00);
* step cost: mean time of one decoding step / plain's mean time per token, so that
  speedup = τ / step cost exactly: the "why" (too few tokens per step, or too costly steps).
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..drafters.mixed import MixedDrafter
from ..tools.ties import TIE_EPS_MULTIPLE, Outcome
from ..loading.machine import cpu_model
from .plots import write_plots
from .records import ALL, REFERENCE, Summary, TurnRecord, best_chain, summarise



def _model_info(model) -> dict | None:
    if model is None:
        return None
    inner = model.model_drafter if isinstance(model, MixedDrafter) else None  # describe the model it mixes in
    if inner is not None and not isinstance(inner, str):
        return dict(_model_info(inner), **{"class": f"{type(model).__name__}({type(inner).__name__})"})
    config = getattr(model, "config", None)
    dtype = getattr(model, "dtype", None)
    if dtype is None and hasattr(model, "parameters"):
        dtype = next((p.dtype for p in model.parameters()), None)
    return {
        "class": type(model).__name__,
        "name_or_path": getattr(config, "_name_or_path", "") if config is not None else "",
        "parameters": sum(p.numel() for p in model.parameters()) if hasattr(model, "parameters") else None,
        "layers": getattr(config, "num_hidden_layers", None) if config is not None else None,
        "dtype": str(dtype or ""),
        "device": str(getattr(model, "device", "")),
        "attn_implementation": getattr(config, "_attn_implementation", None) if config is not None else None,
    }


def environment(target, draft, *, seed: int = 0) -> dict:
    """Hardware, versions, threads, dtype and seed: what a timing depends on."""
    import transformers

    from .. import __version__
    from ..kernels import linears
    from ..kernels.cpu import cpu_support

    env = {
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "opttree": __version__,
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "linear": linears.mode(),  # OPTTREE_LINEAR: the few-row linears' kernel (auto: chosen per shape)
        "cpu_kernels": cpu_support().describe(),  # what this CPU and torch build run (caps included)
        "seed": seed,
        "target": _model_info(target),
        "draft": _model_info(draft),
    }
    load = getattr(os, "getloadavg", None)
    if load is not None:
        env["load_average_at_start"] = [round(x, 2) for x in load()]
    return env


def _fmt(x, spec=".2f") -> str:
    return "–" if x is None or (isinstance(x, float) and x != x) else format(x, spec)


def _count(n) -> str:
    if not n:
        return "?"
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.1f} M" if n >= 1e6 else f"{n / 1e3:.1f} k"


def _equal_cell(s: Summary) -> str:
    if s.method == REFERENCE:
        return "reference"
    ties = f" ({s.ties} near-tie{'s' if s.ties > 1 else ''})" if s.ties else ""
    return f"✓ {s.equal + s.ties}/{s.turns}{ties}" if s.ok else f"**✗ MISMATCH {s.mismatches}/{s.turns}**{ties}"


def markdown_table(summaries: list[Summary], groups: bool = True) -> str:
    head = (["category"] if groups else []) + ["method", "turns", "tokens", "tokens/s", "speedup (Σt)",
                                               "speedup (median)", "τ", "step cost", "mean E(A)", "tree", "draft %",
                                               "greedy = plain"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in summaries:
        row = ([s.group] if groups else []) + [
            f"`{s.method}`", str(s.turns), str(s.new_tokens), _fmt(s.tokens_per_second, ".1f"),
            _fmt(s.speedup) + "×", _fmt(s.median_speedup) + "×", _fmt(s.tau), _fmt(s.step_cost) + "×",
            _fmt(s.mean_expected_length),
            _fmt(s.mean_tree_size, ".1f"), _fmt(None if s.draft_share is None else 100 * s.draft_share, ".0f"),
            _equal_cell(s),
        ]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def engines_section(overall: list[Summary]) -> list[str]:
    """Markdown lines on the engine's chains (none: no lines): per k, τ, vLLM's mean acceptance length and
    its acceptance per position, beside the speedup; and the best k."""
    chains = [s for s in overall if s.acceptance is not None]
    if not chains:
        return []
    out = ["## The engine's chains", "", "| method | speedup (Σt) | τ | mean acceptance length | drafts | "
           "acceptance per position |", "|---|---|---|---|---|---|"]
    for s in chains:
        out.append(f"| `{s.method}` | {_fmt(s.speedup)}× | {_fmt(s.tau)} | {_fmt(s.mean_acceptance_length)} | "
                   f"{s.drafts} | {' / '.join(_fmt(a, '.3f') for a in s.acceptance)} |")
    best = best_chain(overall)
    if best is not None:
        out += ["", f"Best k: `{best.method}`, {_fmt(best.speedup)}× plain generate() (Σt), τ {_fmt(best.tau)}."]
    return out + ["", "τ counts the engine's prefill step (one token, no draft); its mean acceptance length "
                  "(1 + accepted / drafts) and acceptance per position (accepted there / drafts) are vLLM's own "
                  "counters, read around each request; its time is its own generate() call.", ""]


def steps_section(overall: list[Summary]) -> list[str]:
    """Markdown lines on where a step's time goes, per method: its mean wall time, and for opttree its drafting,
    its verification forward and the rest (the prefill shared out over the steps, the walk, the cache's keep)."""
    out = ["## Where a step's time goes", "", "| method | τ | ms per step | drafting | verification | rest |",
           "|---|---|---|---|---|---|"]
    for s in overall:
        split = s.draft_ms is not None and s.verify_ms is not None
        rest = s.step_ms - s.draft_ms - s.verify_ms if split else None
        out.append(f"| `{s.method}` | {_fmt(s.tau)} | {_fmt(s.step_ms, '.1f')} | {_fmt(s.draft_ms, '.1f')} | "
                   f"{_fmt(s.verify_ms, '.1f')} | {_fmt(rest, '.1f')} |")
    return out + ["", "ms per step = the method's wall time over its steps (plain's step: one token; an engine's: "
                  "its own generate() call), each call's prefill included; drafting and verification: opttree's "
                  "own clocks of each step's phases.", ""]


@dataclass
class BenchResult:
    records: list[TurnRecord]
    methods: list[str]
    header: dict = field(default_factory=dict)

    def summaries(self) -> list[Summary]:
        return summarise(self.records, self.methods)

    @property
    def mismatches(self) -> list[TurnRecord]:
        """The turns whose output differs from plain greedy generate()'s other than at near-ties."""
        return [r for r in self.records if r.method != REFERENCE and r.verdict != Outcome.EQUAL
                and r.verdict != Outcome.TIE]

    @property
    def ties(self) -> list[TurnRecord]:
        """The turns that leave plain's output only at near-ties of the target's scores (any dtype)."""
        return [r for r in self.records if r.verdict == Outcome.TIE]

    @property
    def ok(self) -> bool:
        """True when every method reproduced plain greedy generate() on every turn, up to near-ties
        within the dtype's rounding (:mod:`opttree.tools.ties`); False on any mismatch."""
        return not self.mismatches

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def markdown(self) -> str:
        summaries = self.summaries()
        overall = [s for s in summaries if s.group == ALL]
        per_group = [s for s in summaries if s.group != ALL]
        env = self.header.get("environment", {})
        settings = self.header.get("settings", {})
        out = ["# opttree bench: Spec-Bench, greedy, batch 1", ""]
        if not self.ok:
            bad = sorted({r.method for r in self.mismatches})
            out += [f"> **FAILED: {len(self.mismatches)} turn(s) of {', '.join(bad)} differ from plain greedy "
                    "generate(). Their speedups below do not count.**", ""]
        out += [markdown_table(overall, groups=False), "", "## Per category", "", markdown_table(per_group), ""]
        out += self.ties_section() + engines_section(overall) + steps_section(overall) + ["## Set-up", ""]
        for key in ("date_utc", "cpu", "cpu_count", "cuda", "torch_threads", "torch_interop_threads", "platform",
                    "python", "torch", "transformers", "opttree", "linear", "seed", "load_average_at_start"):
            if key in env:
                out.append(f"- {key}: {env[key]}")
        for role in ("target", "draft"):
            info = env.get(role)
            if info:
                facts = [f"{_count(info['parameters'])} parameters" if info["parameters"] else "",
                         f"{info['layers']} layers" if info["layers"] else "",
                         info["dtype"], info["device"], info["attn_implementation"] or ""]
                out.append(f"- {role}: {info['class']} {info['name_or_path'] or ''} "
                           f"({', '.join(f for f in facts if f)})")
        for key, value in self.header.items():
            if key not in ("environment", "settings", "methods", "warmup"):
                out.append(f"- {key}: {value}")
        out.append("- settings: " + ", ".join(f"{k}={v}" for k, v in settings.items()))
        warm = self.header.get("warmup", {})
        for name, value in self.header.get("methods", {}).items():
            out.append(f"- `{name}`: " + ", ".join(f"{k}={v}" for k, v in value.items()) + self._compile_words(
                name, warm.get(name)))
        out += ["", "Speedup = Σ plain time / Σ method time over the same turns (median: of per-turn ratios); "
                "τ = new tokens per target forward that emitted tokens (accepted + bonus); step cost = mean time of "
                "one decoding step in units of plain generate()'s time per token, so speedup ≈ τ / step cost "
                "(why a method is fast or slow: few tokens per step, or costly steps); E(A) = Σp̂ of each "
                "verified tree; draft % = drafting share of opttree's draft + verify time; greedy = plain: turns whose "
                "output is plain greedy generate()'s, or leaves it only at near-ties of the target's own scores "
                "(within rounding of the dtype: float32 included). Warm-up runs excluded."]
        return "\n".join(out) + "\n"

    def _compile_words(self, method: str, warm: dict | None) -> str:
        """``"; warm-up 41.2 s (2 graphs compiled), 0 recompiles while timed"``: a method's compile cost."""
        if not warm:
            return ""
        timed = sum(r.graphs_compiled for r in self.records if r.method == method)
        return (f"; warm-up {warm['seconds']:.1f} s ({warm['graphs_compiled']} graphs compiled), "
                f"{timed} graphs compiled while timed")

    def ties_section(self) -> list[str]:
        """Markdown lines on the near-ties (none: no lines)."""
        if not self.ties:
            return []
        out = ["## Near-ties", "", f"{len(self.ties)} turn(s) left plain's output only where plain's own top "
               f"scores were within {TIE_EPS_MULTIPLE:g} eps(dtype) × max|score| of each other (rounding of a "
               "tree forward vs a one-token forward, in any dtype; DESIGN.md, *Lossless up to rounding*); "
               "they count as correct.", "", "| method | question | turn | new token | plain | got | gap | bound |",
               "|---|---|---|---|---|---|---|---|"]
        for r in self.ties:
            for t in r.ties:
                out.append(f"| `{r.method}` | {r.question_id} | {r.turn + 1} | {t['step']} | {t['expected']} | "
                           f"{t['got']} | {t['gap']:.3g} | {t['bound']:.3g} |")
        return out + [""]

    def spec_bench_answers(self, method: str) -> list[dict]:
        """Spec-Bench's answer records for one method: one per question, per-turn lists in
        ``choices[0]`` (``accept_lengths`` flattened over turns, as Spec-Bench's speed.py reads it)."""
        rows: dict = {}
        for r in self.records:
            if r.method != method:
                continue
            row = rows.setdefault(r.question_index, {
                "question_id": r.question_id, "category": r.category, "answer_id": f"{method}-{r.question_id}",
                "model_id": method, "choices": [{"index": 0, "turns": [], "decoding_steps": [], "new_tokens": [],
                                                  "wall_time": [], "accept_lengths": []}],
                "tstamp": time.time(),
            })
            choice = row["choices"][0]
            choice["turns"].append(r.text)
            choice["decoding_steps"].append(r.steps)
            choice["new_tokens"].append(r.new_tokens)
            choice["wall_time"].append(r.wall_time)
            choice["accept_lengths"].extend(r.accept_lengths)
        return list(rows.values())

    def write(self, out_dir: str | Path, plots: bool = True) -> dict[str, Path]:
        """Write records.jsonl, answers/<method>.jsonl, summary.md, header.json and the plots."""
        out = Path(out_dir)
        (out / "answers").mkdir(parents=True, exist_ok=True)
        written = {"records": out / "records.jsonl", "summary": out / "summary.md", "header": out / "header.json"}
        with written["records"].open("w") as f:
            for r in self.records:
                f.write(json.dumps(asdict(r)) + "\n")
        for method in self.methods:
            path = out / "answers" / f"{_safe(method)}.jsonl"
            with path.open("w") as f:
                for row in self.spec_bench_answers(method):
                    f.write(json.dumps(row) + "\n")
            written[f"answers/{method}"] = path
        written["summary"].write_text(self.markdown())
        written["header"].write_text(json.dumps(self.header, indent=2, default=str) + "\n")
        if plots:
            written.update(write_plots(self, out))
        return written


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_.=" else "_" for c in name)
