"""generate()'s outputs for the rows of a finished decode: the sequences padded as generate() pads
them, the per-token scores and logits, and the call's stats."""

from __future__ import annotations

import torch

from .rows import Row
from .stats import GenerationStats, StepStats


def output_sequences(rows: list[Row], pad_token_id: int | None) -> torch.Tensor:
    """[B, longest] long: every row, right-padded with ``pad_token_id`` as generate() pads finished rows."""
    if len(rows) == 1:
        return rows[0].sequence[None, :]
    width = max(len(row.sequence) for row in rows)
    first = rows[0].sequence
    fill = pad_token_id if pad_token_id is not None else 0
    sequences = torch.full((len(rows), width), fill, dtype=first.dtype, device=first.device)
    for row in rows:
        sequences[row.index, :len(row.sequence)] = row.sequence
    return sequences


def per_token(rows: list[Row], lists: list[list[torch.Tensor]]) -> tuple[torch.Tensor, ...]:
    """Per new token a [B, vocab] tensor, as generate()'s ``scores``/``logits``. A row that has
    already finished has no score for the later tokens (generate() would compute them for its
    padding): its rows there are NaN."""
    if len(rows) == 1:
        return tuple(row[None] for row in lists[0])
    count = max(map(len, lists))
    out = []
    for t in range(count):
        present = next(row[t] for row in lists if len(row) > t)
        out.append(torch.stack([row[t] if len(row) > t else torch.full_like(present, float("nan")) for row in lists]))
    return tuple(out)


def combined_stats(rows: list[Row], steps: list[StepStats]) -> GenerationStats:
    """One row: its stats. Several: ``steps`` (each batched step, summed over its rows), with each
    row's own stats in ``rows``."""
    if len(rows) == 1:
        return rows[0].stats
    return GenerationStats(prompt_tokens=sum(row.stats.prompt_tokens for row in rows),
                           new_tokens=sum(row.stats.new_tokens for row in rows),
                           steps=steps, rows=[row.stats for row in rows])


__all__ = ["combined_stats", "output_sequences", "per_token"]
