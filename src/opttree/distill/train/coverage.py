"""How many kept tokens a head needs, measured: the share of the target's greedy tokens that a
kept vocabulary of each size covers (``opttree distill --recipe R --cache C --stage coverage``).

The kept tokens are ranked on training texts as training ranks them
(:func:`opttree.distill.train.shared.ranked_tokens`) and the coverage is counted on held-out texts, so
it is what a head trained on the one would meet on the other. A greedy token outside the kept
vocabulary is one the head can never draft.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .shared import ranked_tokens, split_records

SIZES = (8192, 16384, 32768)


@dataclass(frozen=True)
class Coverage:
    """``covered`` of the ``tokens`` held-out greedy tokens are among the ``size`` kept ones."""

    size: int
    covered: float
    tokens: int


def greedy_tokens(records: list[dict]) -> torch.Tensor:
    """[N] long: the target's greedy token at every position of ``records`` (``topk_ids[:, 0]``)."""
    return torch.cat([r["topk_ids"][:, 0].long() for r in records]) if records else torch.zeros(0, dtype=torch.long)


def coverage(train: list[dict], held: list[dict], sizes: tuple[int, ...] = SIZES,
             always: list[int] = ()) -> list[Coverage]:
    """Coverage of ``held``'s greedy tokens by the first ``size`` tokens ranked on ``train``."""
    return tokens_coverage(train, greedy_tokens(held), sizes, always)


def tokens_coverage(train: list[dict], truth: torch.Tensor, sizes: tuple[int, ...] = SIZES,
                    always: list[int] = ()) -> list[Coverage]:
    """Coverage of the tokens ``truth`` [N] (e.g. a benchmark's greedy answers: measured, never
    trained on) by the first ``size`` tokens ranked on ``train``."""
    ids = [r["topk_ids"] for r in train]
    vocab = max([int(t.max()) for t in ids] + [int(truth.max()) if len(truth) else 0]) + 1
    ranked = ranked_tokens(train, vocab, list(always))  # [V]
    out = []
    for size in sizes:
        kept = ranked[:min(size, vocab)]
        covered = torch.isin(truth, kept).float().mean().item() if len(truth) else 0.0
        out.append(Coverage(size, covered, len(truth)))
    return out


def split_coverage(records: list[dict], sizes: tuple[int, ...] = SIZES, held_fraction: float = 0.1,
                   seed: int = 0) -> list[Coverage]:
    """:func:`coverage` with ``held_fraction`` of the texts held out (whole texts)."""
    train, held = split_records(records, held_fraction, seed)
    return coverage(train, held, sizes)


def extended_kept(kept: torch.Tensor, ranked: torch.Tensor, size: int) -> torch.Tensor:
    """A kept set of ``size`` ids [size] (sorted ascending) that starts from ``kept`` [K] (a head's
    own tokens, all of them) and adds the first ids of ``ranked`` [V] it lacks. ``size`` below K
    is refused: a head's kept set only widens (:func:`opttree.distill.train.head.widened`)."""
    kept = kept.cpu().long().unique()
    if size < len(kept):
        raise ValueError(f"a kept set of {size} cannot hold the head's own {len(kept)} tokens")
    extra = ranked.cpu().long()
    extra = extra[~torch.isin(extra, kept)][:size - len(kept)]
    return torch.cat([kept, extra]).sort().values


def id_ranking(vocab_size: int) -> torch.Tensor:
    """[V] every id in id order: a BPE vocabulary's low ids are its earliest (most frequent)
    merges, so without counts of the target's own tokens this is the ranking to fall back on."""
    return torch.arange(vocab_size)


def set_coverage(kept: torch.Tensor, truth: torch.Tensor) -> float:
    """The share of the tokens ``truth`` [N] that are among ``kept`` [K]."""
    return torch.isin(truth.cpu().long(), kept.cpu().long()).float().mean().item() if len(truth) else 0.0
