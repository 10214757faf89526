"""The draft vocabulary of an EAGLE-3 head: the ``size`` most frequent target tokens of the training
texts' answers (SafeAILab/EAGLE cb7e084 eagle/traineagle3/cnets.py ``scandata``: token counts of the
training data, the top Vd kept, sorted ascending; SpecForge's ``do_word_count`` counts only where the
loss mask is 1, the assistant's tokens: here a record's tokens from its ``prompt_len`` on, all of them
where it has none), and the layout's two maps of it:

- ``d2t`` [Vd] long, an OFFSET: target id = draft id + ``d2t[draft id]`` (``used[i] - i`` there);
- ``t2d`` [V] bool: which target ids the draft keeps.

Ties in the counts go to the lower id (a BPE vocabulary's low ids are its most frequent merges).
"""

from __future__ import annotations

import torch


def token_counts(records: list[dict], vocab_size: int) -> torch.Tensor:
    """[V] float64: how often each target id occurs in the records' answers (``input_ids`` from
    ``prompt_len`` on; the whole text where a record has no ``prompt_len``)."""
    counts = torch.zeros(vocab_size, dtype=torch.float64)
    for r in records:
        ids = r["input_ids"][int(r.get("prompt_len", 0)):]
        counts += torch.bincount(ids.long().cpu(), minlength=vocab_size).double()[:vocab_size]
    return counts


def draft_vocabulary(records: list[dict], vocab_size: int, size: int) -> torch.Tensor:
    """The kept target ids [min(size, V)] long, ascending: the most frequent ones, ties to the lower id."""
    order = torch.sort(token_counts(records, vocab_size), descending=True, stable=True).indices
    return order[:min(size, vocab_size)].sort().values


def d2t_of(used: torch.Tensor) -> torch.Tensor:
    """[Vd] long offsets: ``used[j] - j`` (the layout's d2t; never the absolute ids)."""
    return used.long() - torch.arange(len(used))


def t2d_of(used: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[V] bool: True at each kept target id."""
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[used.long()] = True
    return t2d


__all__ = ["d2t_of", "draft_vocabulary", "t2d_of", "token_counts"]
