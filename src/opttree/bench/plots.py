"""The benchmark's pictures (matplotlib, Agg backend, PNG): speedup by category, tokens per step,
E(A) against the accepted length (OPT-Tree, arXiv 2406.17276, Figure 4), and the engine's acceptance
per draft position."""

from __future__ import annotations

from pathlib import Path

from .records import ALL, REFERENCE, Results


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_speedup(result: Results, path: Path) -> Path:
    plt = _plt()
    summaries = [s for s in result.summaries() if s.method != REFERENCE]
    groups = list(dict.fromkeys(s.group for s in summaries))
    methods = [m for m in result.methods if m != REFERENCE]
    width = 0.8 / max(len(methods), 1)
    fig, ax = plt.subplots(figsize=(1.6 + 1.3 * len(groups) * max(1, len(methods) / 3), 4))
    for k, method in enumerate(methods):
        for g, group in enumerate(groups):
            s = next((s for s in summaries if s.group == group and s.method == method), None)
            if s is None:
                continue
            x = g + (k - (len(methods) - 1) / 2) * width
            ax.bar(x, s.speedup, width, color=f"C{k}", label=method if g == 0 else None,
                         hatch=None if s.ok else "xx", edgecolor="red" if not s.ok else None)
            ax.text(x, s.speedup, f"{s.speedup:.2f}" + ("" if s.ok else "\n✗"), ha="center", va="bottom",
                    fontsize=7, color="black" if s.ok else "red")
    ax.axhline(1.0, color="0.4", linestyle="--", linewidth=0.8)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, rotation=20 if len(groups) > 4 else 0)
    ax.set_ylabel("speedup vs plain generate() (Σ time)")
    ax.set_title("Speedup by category (hatched red: output differs from plain greedy)", fontsize=9)
    ax.legend(fontsize=8)
    return _save(plt, fig, path)


def plot_accept_lengths(result: Results, path: Path) -> Path:
    plt = _plt()
    methods = [m for m in result.methods if m != REFERENCE]
    lengths = {m: [a for r in result.records if r.method == m for a in r.accept_lengths] for m in methods}
    top = max((max(v) for v in lengths.values() if v), default=1)
    width = 0.8 / max(len(methods), 1)
    fig, ax = plt.subplots(figsize=(max(5.0, 0.5 * top + 2), 3.8))
    for k, method in enumerate(methods):
        values = lengths[method]
        if not values:
            continue
        xs = list(range(1, top + 1))
        share = [values.count(x) / len(values) for x in xs]
        tau = sum(values) / len(values)
        ax.bar([x + (k - (len(methods) - 1) / 2) * width for x in xs], share, width, color=f"C{k}",
               label=f"{method} (τ={tau:.2f}, {len(values)} steps)")
    ax.set_xlabel("tokens per decoding step (accepted + bonus)")
    ax.set_ylabel("share of steps")
    ax.set_title("Accepted length per step", fontsize=9)
    ax.legend(fontsize=8)
    return _save(plt, fig, path)


def plot_expected(result: Results, path: Path) -> Path | None:
    from ..tools.viz import plot_expected_vs_accepted

    methods = [m for m in result.methods if any(r.method == m and r.expected_lengths for r in result.records)]
    if not methods:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, len(methods), figsize=(4.6 * len(methods), 4), squeeze=False)
    for ax, method in zip(axes[0], methods):
        mine = [r for r in result.records if r.method == method]
        expected = [e for r in mine for e in r.expected_lengths]
        accepted = [a for r in mine for a in r.accepted]
        plot_expected_vs_accepted(ax, expected, accepted)
        ax.set_title(f"{method}\n" + ax.get_title(), fontsize=9)
    return _save(plt, fig, path)


def plot_acceptance(result: Results, path: Path) -> Path | None:
    """Acceptance per draft position of every method that reports it (the engine's chains), over all turns."""
    chains = [s for s in result.summaries() if s.group == ALL and s.acceptance]
    if not chains:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.6, 3.8))
    for k, s in enumerate(chains):
        xs = list(range(1, len(s.acceptance) + 1))
        ax.plot(xs, s.acceptance, marker="o", color=f"C{k}", label=f"{s.method} (τ={s.tau:.2f}, {s.speedup:.2f}×)")
    ax.set_xlabel("draft position")
    ax.set_ylabel("accepted there / drafts")
    ax.set_ylim(0, 1)
    ax.set_title("Acceptance per position (the engine's own counters)", fontsize=9)
    ax.legend(fontsize=8)
    return _save(plt, fig, path)


def write_plots(result: Results, out_dir: str | Path) -> dict[str, Path]:
    out = Path(out_dir)
    written = {"speedup_plot": plot_speedup(result, out / "speedup_by_category.png"),
               "accept_plot": plot_accept_lengths(result, out / "accept_lengths.png")}
    expected = plot_expected(result, out / "expected_vs_accepted.png")
    if expected is not None:
        written["expected_plot"] = expected
    acceptance = plot_acceptance(result, out / "acceptance_per_position.png")
    if acceptance is not None:
        written["acceptance_plot"] = acceptance
    return written


__all__ = ["ALL", "write_plots", "plot_speedup", "plot_accept_lengths", "plot_expected", "plot_acceptance"]
