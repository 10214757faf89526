"""The rows of one decode (batch size 1 is one row): each prompt while it is decoded (:class:`Row`: its
sequence, padding, length limit, budget policy and figures), and where a prompt batch's attention mask
hides tokens (:class:`Padding`). Where their tokens sit in the target's cache: :mod:`.slots`; how a step's
tokens are committed: :mod:`.committing`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..tree.plan import BudgetPolicy, FixedPolicy
from .settings import DecodeSettings
from .stats import GenerationStats


def refuse_empty_rows(mask: torch.Tensor) -> None:
    """ValueError naming the rows of ``mask`` ([B, T] bool) that hide every token. Such a prompt has
    nothing to continue: plain generate() runs it on what its attention implementation makes of a query
    that sees no key (sdpa and eager score it differently for the same weights), so there is no one
    output to reproduce losslessly."""
    empty = torch.nonzero(~mask.any(dim=1)).flatten().tolist()
    if empty:
        many = len(empty) > 1
        raise ValueError(
            f"attention_mask hides every token of row{'s' if many else ''} {', '.join(map(str, empty))}: an empty "
            "prompt has nothing to continue (plain generate() writes whatever its attention implementation makes of "
            f"it); drop {'them' if many else 'it'} from the batch, or give {'each' if many else 'it'} at least one "
            "unmasked token"
        )


@dataclass(frozen=True)
class Padding:
    """Where a prompt batch's attention mask hides tokens: each row's left padding, and the tokens it
    hides after it (generate() masks a prompt's every pad-token id when it is given no mask)."""

    left: list[int]
    hidden: list[int]

    @classmethod
    def of(cls, attention_mask: torch.Tensor) -> "Padding":
        """attention_mask: [B, T] (1 = token, 0 = hidden). Refuses a row with no token (see
        :func:`refuse_empty_rows`) and a row whose last token is hidden."""
        mask = attention_mask.bool()
        refuse_empty_rows(mask)
        if not bool(mask[:, -1].all()):
            raise ValueError(
                "opttree needs every prompt's last token unmasked (the last column of attention_mask all 1): for a "
                "batch, set tokenizer.padding_side = 'left' before tokenizing the prompts; a prompt that ends with "
                "the pad token's id is masked there by generate() when no attention_mask is given, so pass "
                "attention_mask=torch.ones_like(input_ids)"
            )
        left = (mask.long().cumsum(dim=1) == 0).sum(dim=1)  # [B] zeros before the first token
        hidden = (~mask).sum(dim=1) - left  # [B]
        return cls(left.tolist(), hidden.tolist())


@dataclass
class Row:
    """One prompt while it is being decoded."""

    index: int  # its place in the caller's batch
    sequence: torch.Tensor  # [pad + T + new] long: left padding, prompt, committed tokens (generate()'s view)
    pad: int  # left padding
    limit: int  # the length at which it stops (max_length; see ``committing.finish_together``)
    policy: BudgetPolicy  # its tree budget, step by step
    hidden: int = 0  # prompt tokens after the left padding that the attention mask hides (pad-token ids)
    stats: GenerationStats = field(default_factory=GenerationStats)
    scores: list[torch.Tensor] = field(default_factory=list)  # [vocab] per new token (output_scores)
    logits: list[torch.Tensor] = field(default_factory=list)  # [vocab] per new token (output_logits)
    fired_at: int | None = None  # length at which a stopping criterion first fired
    done: bool = False

    @property
    def tokens(self) -> torch.Tensor:
        """[T + new] long: the row without its padding (the drafter's view)."""
        return self.sequence[self.pad:]

    @property
    def root_index(self) -> int:
        """The root's index in :attr:`tokens` (what a window counts)."""
        return len(self.sequence) - self.pad - 1

    @property
    def root_position(self) -> int:
        """The root's rotary position: the row's visible tokens before it (generate()'s from the mask)."""
        return self.root_index - self.hidden


def new_rows(input_ids: torch.Tensor, padding: Padding, settings: DecodeSettings) -> list[Row]:
    """One :class:`Row` per prompt ([B, T] long), each with its own budget policy."""
    new_policy = settings.new_policy or (lambda: FixedPolicy(settings.config))
    rows = [Row(b, input_ids[b], padding.left[b], settings.max_length, new_policy(), hidden=padding.hidden[b])
            for b in range(input_ids.shape[0])]
    for row in rows:
        row.stats.prompt_tokens = len(row.tokens)
    return rows


__all__ = ["Padding", "Row", "new_rows", "refuse_empty_rows"]
