"""The drafter protocol: three calls per decoding step."""

from __future__ import annotations

from typing import Protocol

import torch

from ..tree import DraftTree


class Drafter(Protocol):
    def root_probs(self, sequence: torch.Tensor) -> torch.Tensor:
        """Catch up with the committed ``sequence`` ([T] long, ending with the root token) and
        return the draft's probabilities for the root's children: [vocab] float."""

    def expand(self, pool: DraftTree, frontier: torch.Tensor) -> torch.Tensor:
        """Probabilities for the children of ``pool`` nodes ``frontier`` ([k] long): [k, vocab]."""

    def commit(self, accepted_pool_ids: list[int]) -> None:
        """The root's accepted descendants (pool ids, root-to-leaf order) are now committed;
        forget every other node of this step."""
