"""What one decode runs with, as generate() prepared it: everything but the models, the prompts and
the cache (the loop's steps and the rows' bookkeeping both read it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..hf.compat import prepared_pad_token_id
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

    @classmethod
    def of(cls, config: TreeConfig, generation_config, logits_processor, stopping_criteria, *, max_length: int,
           context_length: int | None, streamer=None, generator: torch.Generator | None = None,
           new_policy: Callable[[], BudgetPolicy] | None = None,
           verify_forward: VerifyForward | None = None) -> "DecodeSettings":
        """The settings of one generate() call: its generation config, logits processors and stopping
        criteria as generate() prepared them, and what the call resolved (the tree, the lengths, the
        budget policies, the verification forward). ``context_length`` None: unbounded."""
        return cls(
            config, logits_processor, stopping_criteria,
            max_length=max_length,
            context_length=context_length or (1 << 62),
            pad_token_id=prepared_pad_token_id(generation_config),
            pad_finished=any(hasattr(c, "eos_token_id") for c in stopping_criteria),  # generate()'s own test
            do_sample=bool(generation_config.do_sample),
            streamer=streamer,
            generator=generator,
            output_scores=bool(generation_config.output_scores),
            output_logits=bool(generation_config.output_logits),
            new_policy=new_policy,
            verify_forward=verify_forward,
        )


__all__ = ["DecodeSettings"]
