"""DraftProbs: a layer's draft q, stored over the tokens a drafter can propose, not the whole vocabulary.

A feature head predicts only its K kept tokens (16,384 of SmolLM2's 49,152) and prompt lookup a
handful per node; spreading their q over [k, vocab] costs a zero-filled [k, vocab] tensor, a
scatter, and a top-k three or more times wider than the candidates, on every layer of every step.
A ``DraftProbs`` keeps q where it can be non-zero:

    q[i, token_ids[i, j]] = values[i, j]        (per-row columns, token_ids [k, C])
    q[i, token_ids[j]]    = values[i, j]        (columns shared by every row, token_ids [C])
    q[i, j]               = values[i, j]        (token_ids None: C = vocab, the dense q)

and q = 0 for every other token. Within a row a token has at most one column with a non-zero
value (a repeated token may only pad with zeros), so the row's best columns are its best tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DraftProbs:
    values: torch.Tensor  # [k, C] float
    token_ids: torch.Tensor | None  # [C] or [k, C] long, the token of each column; None: column j is token j
    vocab: int  # the length of a full q row

    @classmethod
    def dense(cls, probs: torch.Tensor) -> "DraftProbs":
        """probs: [k, vocab] float, the full q."""
        return cls(probs, None, probs.shape[-1])

    @property
    def device(self) -> torch.device:
        return self.values.device

    def to(self, dtype: torch.dtype) -> "DraftProbs":
        """The same q with values in ``dtype`` (itself when they are already)."""
        if self.values.dtype == dtype:
            return self
        return DraftProbs(self.values.to(dtype), self.token_ids, self.vocab)

    def full(self) -> torch.Tensor:
        """[k, vocab]: the q rows spread over the whole vocabulary (the dense values themselves
        when ``token_ids`` is None)."""
        if self.token_ids is None:
            return self.values
        k, columns = self.values.shape
        ids = self.token_ids if self.token_ids.dim() == 2 else self.token_ids.expand(k, columns)  # [k, C]
        return self.values.new_zeros(k, self.vocab).scatter_add_(1, ids, self.values)

    def tokens_at(self, rows: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
        """rows, columns: [c] long -> [c] long, the token of each (row, column)."""
        if self.token_ids is None:
            return columns
        if self.token_ids.dim() == 1:
            return self.token_ids.index_select(0, columns)
        return self.token_ids[rows, columns]


def kept_columns(token_ids: torch.Tensor | None, vocab: int) -> torch.Tensor | None:
    """[vocab] long: the column of each token in shared ``token_ids`` [C], -1 where it has none
    (None for dense q: column = token). Made once per drafter, not per layer."""
    if token_ids is None:
        return None
    column = torch.full((vocab,), -1, dtype=torch.long, device=token_ids.device)
    column[token_ids] = torch.arange(token_ids.shape[0], device=token_ids.device)
    return column


def mix(model: DraftProbs, ngram: DraftProbs, weight: float, model_columns: torch.Tensor | None = None) -> DraftProbs:
    """q = weight · q_ngram + (1 − weight) · q_model in the rows where ``ngram`` has any mass,
    q_model elsewhere (opttree.drafters.mixed), without spreading either over the vocabulary
    unless one of them is spread already.

    model: dense or shared columns [C] (per-row columns are spread first); ngram: columns per row
    [k, J] (zero-padded), shared [J], or dense; model_columns: :func:`kept_columns` of the model's
    shared token_ids. An n-gram token the model has a column for is added there; any other gets a
    column of its own (ids [k, C + J])."""
    if model.token_ids is not None and model.token_ids.dim() == 2:
        model, model_columns = DraftProbs.dense(model.full()), None
    values = ngram.values.to(device=model.device, dtype=model.values.dtype)  # [k, J]
    w = weight * (values.sum(dim=1, keepdim=True) > 0).to(values.dtype)  # [k, 1]
    if ngram.token_ids is None:  # a dense n-gram q: the mixture is dense
        return DraftProbs.dense(w * values + (1 - w) * model.full())
    ids = ngram.token_ids.to(model.device)
    ids = ids if ids.dim() == 2 else ids.expand(values.shape[0], -1)  # [k, J]
    ngram_q = w * values  # [k, J]
    column = ids if model_columns is None else model_columns[ids]  # [k, J], -1: not a model column
    inside = column >= 0
    mixed = ((1 - w) * model.values).scatter_add_(1, column.clamp(min=0), torch.where(inside, ngram_q, 0.0))  # [k, C]
    if model_columns is None:
        return DraftProbs(mixed, None, model.vocab)
    k, c = mixed.shape
    return DraftProbs(torch.cat([mixed, torch.where(inside, 0.0, ngram_q)], dim=1),
                      torch.cat([model.token_ids.expand(k, c), ids], dim=1), model.vocab)


__all__ = ["DraftProbs", "kept_columns", "mix"]
