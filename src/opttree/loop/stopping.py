"""Where generation stops inside a step's emitted tokens, as generate()'s stopping criteria decide.

generate() asks its criteria after every token. A step emits several tokens at once, so the loop
must find the first one after which a criterion fires. The two criteria generate() builds by
itself are decided on the host from the token list, with no tensor op: ``MaxLengthCriteria``
(a length) and ``EosTokenCriteria`` (membership in a set read once per call). Any other criterion
(``stop_strings``, ``max_time``, a user's) is asked token by token, exactly as generate() does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria


@dataclass
class StopRule:
    max_length: int | None  # stop once the sequence has this many tokens
    eos: frozenset[int]  # stop after any of these tokens
    others: list  # criteria asked token by token: (input_ids [1, L], scores [1, vocab]) -> [1] bool

    @classmethod
    def of(cls, stopping_criteria) -> "StopRule":
        max_length, eos, others = None, set(), []
        for criterion in stopping_criteria or []:
            if type(criterion) is MaxLengthCriteria:
                limit = criterion.max_length
                max_length = limit if max_length is None else min(max_length, limit)
            elif type(criterion) is EosTokenCriteria:
                eos.update(torch.as_tensor(criterion.eos_token_id).flatten().tolist())
            else:
                others.append(criterion)
        return cls(max_length, frozenset(eos), others)

    @property
    def needs_scores(self) -> bool:
        """Whether :meth:`cut` calls criteria that read each token's scores."""
        return bool(self.others)

    def cut(self, length: int, tokens: list[int], ask: Callable[[int], bool] | None = None) -> int | None:
        """How many of ``tokens`` (emitted after ``length`` committed ones) to keep when a criterion
        fires, or None when none does. ``ask(j)``: the other criteria on the sequence that ends with
        token j (needed only when :attr:`needs_scores`)."""
        for j, token in enumerate(tokens):
            if token in self.eos or (self.max_length is not None and length + j + 1 >= self.max_length):
                return j + 1
            if self.others and ask(j):
                return j + 1
        return None
