"""Feature records -> training pieces and padded batches for a feature head (:mod:`.head_train`).

A record (:mod:`.data.features`) holds one text's ``input_ids`` [L], the target's features ``hidden``
[L, len(layers) * H] (16-bit on disk) and its top-k soft labels ``topk_ids`` / ``topk_logits``
[L, k]. Texts are cut into pieces of at most ``max_len`` positions, grouped into batches of
similar length, and collated into float32 :class:`FeatureBatch` tensors.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch


@dataclass
class FeatureBatch:
    """Right-padded texts. ``tokens`` [B, L] long; ``features`` [B, L, F] float (the target's
    ``feature_layers`` at j, concatenated: F = len(feature_layers) * H; the last H columns are f_j);
    ``valid`` [B, L] bool; ``topk_ids`` [B, L, k] long and ``topk_logits`` [B, L, k] float;
    ``answer`` [B, L] bool: valid positions whose label is an answer token (see the module doc)."""

    tokens: torch.Tensor
    features: torch.Tensor
    valid: torch.Tensor
    topk_ids: torch.Tensor
    topk_logits: torch.Tensor
    answer: torch.Tensor

    def to(self, device: torch.device | str) -> "FeatureBatch":
        return FeatureBatch(**{k: v.to(device, non_blocking=True) for k, v in vars(self).items()})


def answer_start(ids: torch.Tensor, marker: list[int]) -> int:
    """Index of the first answer token of ``ids`` [L]: just after the LAST ``marker``; 0 when
    ``marker`` is empty or absent (then the whole text counts as answer)."""
    m = len(marker)
    if m == 0 or len(ids) < m:
        return 0
    hits = (ids.unfold(0, m, 1) == torch.tensor(marker, device=ids.device)).all(-1).nonzero()  # [n, 1]
    return int(hits[-1]) + m if len(hits) else 0


def pieces(length: int, max_len: int, from_end: bool) -> list[tuple[int, int]]:
    """``(start, end)`` of consecutive pieces of at most ``max_len`` covering ``range(length)``;
    ``from_end``: the last piece is a full one (the first may be short)."""
    if not from_end:
        return [(s, min(s + max_len, length)) for s in range(0, length, max_len)]
    return [(max(e - max_len, 0), e) for e in range(length, 0, -max_len)][::-1]


def pick_layers(hidden: torch.Tensor, stored: tuple[int, ...], wanted: tuple[int, ...]) -> torch.Tensor:
    """Features [L, len(stored) * H] of the target layers ``stored`` -> those of ``wanted``
    [L, len(wanted) * H] (each of which must be stored)."""
    stored, wanted = tuple(stored), tuple(wanted)
    if stored == wanted:
        return hidden
    missing = [i for i in wanted if i not in stored]
    if missing:
        raise ValueError(f"the cached features hold target layers {stored}, not {missing}: extract them again")
    h = hidden.shape[-1] // len(stored)
    return torch.cat([hidden[:, stored.index(i) * h:(stored.index(i) + 1) * h] for i in wanted], dim=-1)


def chunks(records: list[dict], max_len: int, marker: list[int] = (), answers_only: bool = False,
           layers: tuple[int, ...] = (-1,)) -> list[dict]:
    """Texts cut into pieces of at most ``max_len`` positions; each piece's ``answer_from`` is
    the first position whose label (the next token) is an answer token. ``answers_only``: cut
    from the end (so an answer keeps as much of its prompt as fits) and drop the pieces with no
    answer position, which would cost compute and teach nothing. ``layers``: the target layers
    the head reads, taken from each record's (``record["layers"]``, default the last alone)."""
    out = []
    for r in records:
        first = max(answer_start(r["input_ids"], list(marker)) - 1, 0)
        for s, e in pieces(len(r["input_ids"]), max_len, from_end=answers_only):
            if answers_only and e <= first:
                continue
            piece = {k: r[k][s:e] for k in ("input_ids", "topk_ids", "topk_logits")}
            piece["hidden"] = pick_layers(r["hidden"][s:e], tuple(r.get("layers", (-1,))), layers)
            out.append(dict(piece, answer_from=max(first - s, 0)))
    return out


def make_batch(records: list[dict], device: torch.device | str = "cpu") -> FeatureBatch:
    """The records collated where they lie (records kept on a GPU are batched there, with no trip
    through the host: :mod:`.recipes.resident`), then moved to ``device``."""
    b, width = len(records), max(len(r["input_ids"]) for r in records)
    h, k = records[0]["hidden"].shape[1], records[0]["topk_ids"].shape[1]
    where = records[0]["hidden"].device
    batch = FeatureBatch(
        tokens=torch.zeros(b, width, dtype=torch.long, device=where),
        features=torch.zeros(b, width, h, device=where),
        valid=torch.zeros(b, width, dtype=torch.bool, device=where),
        topk_ids=torch.zeros(b, width, k, dtype=torch.long, device=where),
        topk_logits=torch.zeros(b, width, k, device=where),
        answer=torch.zeros(b, width, dtype=torch.bool, device=where),
    )
    for i, r in enumerate(records):
        n = len(r["input_ids"])
        batch.tokens[i, :n] = r["input_ids"]
        batch.features[i, :n] = r["hidden"].float()
        batch.valid[i, :n] = True
        batch.answer[i, r.get("answer_from", 0):n] = True
        batch.topk_ids[i, :n] = r["topk_ids"].long()
        batch.topk_logits[i, :n] = r["topk_logits"].float()
    return batch.to(device)


def token_batches(records: list[dict], batch_tokens: int, rng: random.Random) -> list[list[int]]:
    """Shuffled batches of similar-length texts, about ``batch_tokens`` positions each."""
    order = sorted(range(len(records)), key=lambda i: (len(records[i]["input_ids"]), rng.random()))
    batches, current, width = [], [], 0
    for i in order:
        width = max(width, len(records[i]["input_ids"]))
        if current and width * (len(current) + 1) > batch_tokens:
            batches.append(current)
            current, width = [], len(records[i]["input_ids"])
        current.append(i)
    if current:
        batches.append(current)
    rng.shuffle(batches)
    return batches
