"""Pictures of what speculative decoding did: one step's draft tree, and a run's statistics.

Needs matplotlib (``pip install opttree[bench]``); imported lazily so the library never does.

* :func:`plot_tree` draws a :class:`~opttree.tree.DraftTree` left to right (root at the left, one
  column per depth), each node with its token and its path probability p̂ (OPT-Tree, arXiv
  2406.17276: the tree maximises E(A) = Σp̂); the path the target accepted is highlighted.
* :func:`plot_stats` summarises a :class:`~opttree.loop.stats.GenerationStats`: tokens per step,
  E(A) against the accepted length (the paper's Figure 4, with Pearson r), tree sizes per step.

Get a step's tree from generate()'s output: ``out.stats.steps[i].tree`` and
``out.stats.steps[i].accepted_nodes`` (filled on every step).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

from ..loop.stats import GenerationStats
from ..tree.draft_tree import DraftTree

ACCEPTED_COLOR = "#2ca02c"
NODE_COLOR = "#1f77b4"


def _pyplot():
    """pyplot with whatever backend the user chose (headless machines fall back to Agg)."""
    import matplotlib.pyplot as plt

    return plt


def token_label(decode) -> Callable[[int], str]:
    """``decode`` may be None (token ids), a tokenizer (``.decode([id])``) or a callable id -> str."""
    if decode is None:
        return str
    if hasattr(decode, "decode"):
        tokenizer = decode
        return lambda t: tokenizer.decode([t])
    return decode


def _printable(text: str, limit: int = 14) -> str:
    text = text.replace("\n", "⏎").replace("\t", "⇥")
    text = text if len(text) <= limit else text[: limit - 1] + "…"
    return repr(text)


@dataclass(frozen=True)
class TreeLayout:
    x: list[float]  # [n] column of each node (its depth; the root is at 0)
    y: list[float]  # [n] row of each node (leaves on consecutive rows, parents centred on children)
    root_y: float
    leaves: int


def tree_layout(tree: DraftTree) -> TreeLayout:
    """A tidy left-to-right layout: depth on x, leaves one row apart, a parent centred on its children."""
    kids = tree.children()
    n = len(tree)
    y = [0.0] * n
    next_row = 0

    def place(node: int) -> float:  # node -1 is the root
        nonlocal next_row
        children = kids[node + 1]
        if not children:
            row = float(next_row)
            next_row += 1
        else:
            rows = [place(c) for c in children]
            row = (rows[0] + rows[-1]) / 2
        if node >= 0:
            y[node] = row
        return row

    root_y = place(-1)
    x = [float(d) for d in tree.depths().tolist()]
    return TreeLayout(x=x, y=y, root_y=root_y, leaves=max(next_row, 1))


def plot_tree(tree: DraftTree, decode=None, accepted: Sequence[int] | None = None, ax=None,
              root_label: str = "root", title: str | None = None):
    """Draw one draft tree; returns the matplotlib Figure.

    tree:     a DraftTree (e.g. ``out.stats.steps[i].tree``).
    decode:   a tokenizer, a callable token id -> text, or None to show ids.
    accepted: node ids the target accepted (``steps[i].accepted_nodes``), drawn in green.
    ax:       an Axes to draw into (a new figure otherwise).
    """
    plt = _pyplot()
    label = token_label(decode)
    accepted_set = set(int(i) for i in (accepted or []))
    layout = tree_layout(tree)
    depth = int(max(layout.x, default=0))
    if ax is None:
        fig, ax = plt.subplots(figsize=(2.0 + 1.9 * (depth + 1), 1.0 + 0.42 * layout.leaves))
    else:
        fig = ax.figure
    parents = tree.parents.tolist()
    probs = tree.path_probs.float().tolist()
    tokens = tree.tokens.tolist()

    # edges first, so that the node boxes sit on top of them
    for i, p in enumerate(parents):
        px, py = (0.0, layout.root_y) if p < 0 else (layout.x[p], layout.y[p])
        on_path = i in accepted_set and (p < 0 or p in accepted_set)
        ax.plot([px, layout.x[i]], [py, layout.y[i]], color=ACCEPTED_COLOR if on_path else "0.7",
                linewidth=2.5 if on_path else 0.8, zorder=1)
    ax.text(0.0, layout.root_y, root_label, ha="center", va="center", fontsize=8, zorder=3,
            bbox=dict(boxstyle="round,pad=0.3", facecolor="0.85", edgecolor="0.3"))
    for i in range(len(tree)):
        good = i in accepted_set
        alpha = 0.15 + 0.75 * max(0.0, min(1.0, probs[i]))
        ax.text(layout.x[i], layout.y[i], f"{_printable(label(tokens[i]))}\np̂={probs[i]:.2f}",
                ha="center", va="center", fontsize=7, zorder=3,
                bbox=dict(boxstyle="round,pad=0.25", edgecolor=ACCEPTED_COLOR if good else NODE_COLOR,
                          linewidth=2.0 if good else 0.8,
                          facecolor=_blend(ACCEPTED_COLOR if good else NODE_COLOR, alpha)))
    ax.set_xlim(-0.6, depth + 0.6)
    ax.set_ylim(layout.leaves - 0.4, -0.6)
    ax.set_xticks(range(depth + 1))
    ax.set_xticklabels(["root"] + [f"depth {d}" for d in range(1, depth + 1)], fontsize=8)
    ax.set_yticks([])
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    ax.set_title(title or f"draft tree: {len(tree)} nodes, E(A)=Σp̂={tree.expected_length:.2f}, "
                          f"accepted {len(accepted_set)}", fontsize=9)
    fig.tight_layout()
    return fig


def _blend(hex_color: str, alpha: float) -> tuple[float, float, float]:
    """The colour at ``alpha`` over white (text stays readable on an opaque box)."""
    r, g, b = (int(hex_color[k:k + 2], 16) / 255 for k in (1, 3, 5))
    return (1 - alpha * (1 - r), 1 - alpha * (1 - g), 1 - alpha * (1 - b))


def pearson_r(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Pearson correlation; NaN when fewer than two points or a constant series."""
    n = len(xs)
    if n < 2 or len(ys) != n:
        return float("nan")
    mx, my = sum(xs) / n, sum(ys) / n
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    if sxx == 0 or syy == 0:
        return float("nan")
    return sxy / math.sqrt(sxx * syy)


def plot_expected_vs_accepted(ax, expected: Sequence[float], accepted: Sequence[int], label: str | None = None):
    """Scatter of E(A) (Σp̂ of each verified tree) against the draft tokens actually accepted,
    the mean accepted length per E(A) bin, and y = x. Returns Pearson r."""
    r = pearson_r(list(expected), [float(a) for a in accepted])
    if expected:
        ax.scatter(expected, accepted, s=8, alpha=0.3, label=label)
        top = max(max(expected), max(accepted), 1.0)
        ax.plot([0, top], [0, top], color="0.5", linestyle="--", linewidth=0.8)
        bins = max(1, min(12, len(expected) // 10))
        lo, hi = min(expected), max(expected)
        width = (hi - lo) / bins or 1.0
        centres, means = [], []
        for b in range(bins):
            inside = [a for e, a in zip(expected, accepted) if lo + b * width <= e <= lo + (b + 1) * width]
            if inside:
                centres.append(lo + (b + 0.5) * width)
                means.append(sum(inside) / len(inside))
        ax.plot(centres, means, marker="o", linewidth=1.5)
    ax.set_xlabel("E(A) = Σp̂ of the drafted tree")
    ax.set_ylabel("accepted draft tokens A")
    ax.set_title(f"E(A) vs A (Pearson r = {r:.2f}, {len(expected)} steps)", fontsize=9)
    return r


def plot_stats(stats: GenerationStats | Sequence[GenerationStats], title: str | None = None):
    """Three panels for one or several runs: tokens per step, E(A) vs accepted, tree size per step.
    Returns the matplotlib Figure."""
    plt = _pyplot()
    runs = [stats] if isinstance(stats, GenerationStats) else list(stats)
    steps = [s for run in runs for s in run.steps]
    emitted = [s.emitted for s in steps]
    new_tokens = sum(run.new_tokens for run in runs)
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(13, 3.6))
    if emitted:
        a.hist(emitted, bins=range(1, max(emitted) + 2), align="left", rwidth=0.85, color=NODE_COLOR)
    a.set_xlabel("tokens per step (accepted + bonus)")
    a.set_ylabel("steps")
    a.set_title(f"τ = {new_tokens / max(len(steps), 1):.2f} tokens per target forward", fontsize=9)
    plot_expected_vs_accepted(b, [s.expected_length for s in steps], [s.accepted for s in steps])
    c.plot([s.tree_size for s in steps], label="tree size", linewidth=1)
    c.plot([s.accepted for s in steps], label="accepted", linewidth=1, color=ACCEPTED_COLOR)
    c.set_xlabel("step")
    c.set_ylabel("nodes")
    c.legend(fontsize=8)
    c.set_title("per step", fontsize=9)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
