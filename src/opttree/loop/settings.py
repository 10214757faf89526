"""What one decode runs with, as generate() prepared it: everything but the models, the prompts and
the cache (the loop's steps and the rows' bookkeeping both read it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..hf.compiled import VerifyForward
from ..tree.config import TreeConfig
from ..tree.plan import BudgetPolicy


@dataclass(frozen=True)
class DecodeSettings:
    """What one decode runs with, as generate() prepared it: everything but the models, the prompts
    and the cache."""

    config: TreeConfig
    logits_processor: object  # generate()'s LogitsProcessorList (processors and warpers); may be empty
    stopping_criteria: object  # generate()'s StoppingCriteriaList
    max_length: int  # a row stops at this many tokens (padding included, as generate() counts)
    context_length: int  # the most tokens the models can hold
    pad_token_id: int | None = None
    # generate() pads a finished row (with pad_token_id) only when its stopping criteria include an
    # EOS one; otherwise every row goes on until all have stopped
    pad_finished: bool = True
    do_sample: bool = False
    streamer: object | None = None  # batch 1 only, as generate()
    generator: torch.Generator | None = None  # the sampling's randomness (tree draws, verifiers)
    output_scores: bool = False
    output_logits: bool = False
    new_policy: Callable[[], BudgetPolicy] | None = None  # makes each row's budget policy; None: config's fixed one
    verify_forward: VerifyForward | None = None  # the verification forward (hf.compiled); None: the target, eager


__all__ = ["DecodeSettings"]
