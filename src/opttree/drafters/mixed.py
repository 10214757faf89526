"""Two drafters as one: the draft's q is a mixture of a model drafter's and an n-gram drafter's.

q = weight · q_ngram + (1 − weight) · q_model wherever the n-gram drafter found a match, and
q_model alone where it found none (its row is all zeros there). The tree then holds the model's
likely tokens and the text's repeated continuations side by side, ranked by one p̂. Lossless
whatever the mixture: verification never trusts q, it only checks the tokens drafted from it
(opttree.verify). Both drafters see every call (the n-gram one is model-free, so this costs nothing but
the lookups) and keep their own state.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..tree.draft_probs import DraftProbs, kept_columns, mix
from ..tree.draft_tree import DraftTree
from .base import Drafter, ToProbs
from .make import make_drafter


class MixedDrafter(Drafter):
    """model_drafter, ngram_drafter: anything ``draft_model=`` accepts (a causal LM, a Drafter,
    ``"prompt_lookup"``, a draft folder); weight: the n-gram share of q where it matched, in [0, 1]."""

    def __init__(self, model_drafter, ngram_drafter="prompt_lookup", weight: float = 0.5):
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0.0 <= weight <= 1.0:
            raise ValueError(f"weight must be a number in [0, 1] (the n-gram drafter's share of q), got {weight!r}")
        self.model_drafter = model_drafter
        self.ngram_drafter = ngram_drafter
        self.weight = float(weight)
        self._columns: tuple[torch.Tensor, torch.Tensor | None] | None = None  # (model token_ids, kept_columns of them)

    def bind(self, target, to_probs: ToProbs | None) -> "MixedDrafter":
        """Fresh inner drafters bound to ``target`` (one per generate() call), both with the
        sampling warpers ``to_probs``."""
        return MixedDrafter(make_drafter(self.model_drafter, target, to_probs),
                            make_drafter(self.ngram_drafter, target, to_probs), self.weight)

    def fresh(self) -> "MixedDrafter":
        return MixedDrafter(self.model_drafter.fresh(), self.ngram_drafter.fresh(), self.weight)

    @property
    def context_length(self) -> int | None:
        return self.model_drafter.context_length if isinstance(self.model_drafter, Drafter) else None

    @property
    def forwards(self) -> int:
        return self.model_drafter.forwards + self.ngram_drafter.forwards

    @property
    def wants_hidden_states(self) -> bool:  # a feature head inside wants the target's features
        return self.model_drafter.wants_hidden_states

    def caches(self) -> list:
        return self.model_drafter.caches() + self.ngram_drafter.caches()

    def modules(self) -> list[torch.nn.Module]:
        return self.model_drafter.modules() + self.ngram_drafter.modules()

    def features_from(self, hidden_states: Sequence[torch.Tensor]) -> torch.Tensor:
        return self.model_drafter.features_from(hidden_states)

    def add_features(self, features: torch.Tensor) -> None:
        self.model_drafter.add_features(features)

    def root_probs(self, sequence: torch.Tensor) -> torch.Tensor:
        """sequence: [T] long -> [vocab]."""
        model = DraftProbs.dense(self.model_drafter.root_probs(sequence)[None])
        return mix(model, DraftProbs.dense(self.ngram_drafter.root_probs(sequence)[None]), self.weight).full()[0]

    def expand(self, pool: DraftTree, frontier: torch.Tensor) -> torch.Tensor:
        """frontier: [k] long pool ids -> [k, vocab]."""
        return self.expand_probs(pool, frontier).full()

    def expand_probs(self, pool: DraftTree, frontier: torch.Tensor) -> DraftProbs:
        """frontier: [k] long pool ids -> the mixture over the tokens either drafter proposes
        (tree/draft_probs.mix), never spread over the vocabulary when neither needs it."""
        model = self.model_drafter.expand_probs(pool, frontier)
        return mix(model, self.ngram_drafter.expand_probs(pool, frontier), self.weight, self._model_columns(model))

    def _model_columns(self, model: DraftProbs) -> torch.Tensor | None:
        """kept_columns of the model drafter's shared token_ids, made once (the same tensor every layer)."""
        if model.token_ids is None or model.token_ids.dim() == 2:
            return None
        if self._columns is None or self._columns[0] is not model.token_ids:
            self._columns = (model.token_ids, kept_columns(model.token_ids, model.vocab))
        return self._columns[1]

    def commit(self, accepted_pool_ids: list[int]) -> None:
        self.model_drafter.commit(accepted_pool_ids)
        self.ngram_drafter.commit(accepted_pool_ids)
