"""The rows of one decode (batch size 1 is one row): where their tokens sit in the target's cache,
how each row commits a step's tokens and stops, and generate()'s output for all of them.

Cache layout: the rows share the cache's slots but not their positions. :class:`Slots` keeps
``valid`` [R, L], the slots holding each row's committed tokens (all but its root); left padding,
a row's unused slots in a step (the *holes*, when another row accepted more) and the dummy nodes
that pad every tree to the batch's largest are hidden by each row's 4D mask. A row's rotary
positions count only its own tokens, as generate() computes them from the attention mask, so a
row's logits are those of the row decoded alone (up to rounding). One unpadded row needs none of
this: ``valid`` is None, every slot is the row's, and each step keeps its accepted path with one
in-place move (kv_cache.keep_slots).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from ..hf import kv_cache
from ..tree.draft_tree import DraftTree
from ..tree.masks import ForwardInputs, batch_verification_inputs, verification_inputs
from ..tree.plan import BudgetPolicy
from ..tree.sizes import padded_size
from ..verify.acceptance import Acceptance
from .stats import GenerationStats, StepStats
from .stopping import StopRule

logger = logging.getLogger(__name__)


def left_padding(attention_mask: torch.Tensor) -> torch.Tensor:
    """attention_mask: [B, T] (1 = token, 0 = padding) -> [B] long, each row's left padding.
    Refuses padding anywhere but on the left."""
    mask = attention_mask.bool()
    if not bool((mask[:, 1:] >= mask[:, :-1]).all()) or not bool(mask[:, -1].all()):
        raise ValueError(
            "opttree needs LEFT padding for batches (the last column must be every row's last prompt "
            "token): set tokenizer.padding_side = 'left' before tokenizing the prompts"
        )
    return (~mask).sum(dim=1)


@dataclass
class Row:
    """One prompt while it is being decoded."""

    index: int  # its place in the caller's batch
    sequence: torch.Tensor  # [pad + T + new] long: left padding, prompt, committed tokens (generate()'s view)
    pad: int  # left padding
    limit: int  # the length at which it stops (max_length; see ``finish_together``)
    policy: BudgetPolicy  # its tree budget, step by step
    stats: GenerationStats = field(default_factory=GenerationStats)
    scores: list[torch.Tensor] = field(default_factory=list)  # [vocab] per new token (output_scores)
    logits: list[torch.Tensor] = field(default_factory=list)  # [vocab] per new token (output_logits)
    fired_at: int | None = None  # length at which a stopping criterion first fired
    done: bool = False

    @property
    def tokens(self) -> torch.Tensor:
        """[T + new] long: the row without its padding (the drafter's view)."""
        return self.sequence[self.pad:]


@dataclass
class Slots:
    """Where the rows' committed tokens (all but each row's root) sit in the target's cache."""

    length: int  # cache slots before this step's roots
    valid: torch.Tensor | None  # [R, length] bool, each row's own slots; None: all are the one row's
    fixed_sizes: bool = True  # pad each verification forward to one of tree.sizes.VERIFY_SIZES rows
    kv_len: int | None = None  # a static cache's slots (the mask spans them); None: a cache that grows

    def root_positions(self, rows: list[Row]) -> list[int]:
        """Each row's root position: its committed tokens before the root."""
        return [len(row.tokens) - 1 for row in rows]

    def size(self, trees: list[DraftTree], rows: list[Row]) -> int:
        """The rows of this step's verification forward: the root and the largest tree, padded to the
        size the row's policy picks (one row) or the smallest that holds them (a batch)."""
        needed = 1 + max(len(tree) for tree in trees)
        if not self.fixed_sizes:
            return needed
        if len(rows) == 1:
            return rows[0].policy.verify_rows(needed - 1)
        return padded_size(needed)

    def inputs(self, roots: torch.Tensor, trees: list[DraftTree], rows: list[Row], dtype: torch.dtype) -> ForwardInputs:
        """The verification forward's inputs: roots [R] long, then each row's tree, then dummy rows
        up to :meth:`size`."""
        size = self.size(trees, rows)
        if self.valid is None:
            return verification_inputs(roots, trees[0], self.length, dtype, size=size, kv_len=self.kv_len)
        positions = torch.tensor(self.root_positions(rows), device=roots.device)
        return batch_verification_inputs(roots, trees, positions, self.valid, dtype, size=size)

    def keep(self, cache, acceptances: list[Acceptance]) -> None:
        """Each row keeps its root and accepted path (the verify forward put row b's root at
        ``length`` and its node i at ``length + 1 + i``); everything else of the step (rejected
        nodes, dummy rows) is dropped."""
        past = self.length
        if self.valid is None:
            nodes, on_device = acceptances[0].nodes, acceptances[0].device_rows
            kv_cache.keep_slots(cache, past + 1, [past + 1 + i for i in nodes],
                                None if on_device is None else on_device[1:] + past)
            self.length = past + 1 + len(nodes)
            return
        width = 1 + max(a.accepted for a in acceptances)  # shorter rows are padded with holes
        slots = torch.tensor([[past] + [past + 1 + n for n in a.nodes] + [past] * (width - 1 - a.accepted)
                              for a in acceptances], dtype=torch.long, device=self.valid.device)  # [R, width]
        kv_cache.keep_row_slots(cache, past, slots)
        kept = torch.tensor([1 + a.accepted for a in acceptances], device=self.valid.device)  # [R]
        self.valid = torch.cat([self.valid, torch.arange(width, device=self.valid.device)[None, :] < kept[:, None]], dim=1)
        if kv_cache.worth_compacting(self.valid):
            self.valid = kv_cache.compact_rows(cache, self.valid)
        self.length = self.valid.shape[1]

    def select(self, cache, keep: list[int]) -> None:
        """Only rows ``keep`` go on; slots no remaining row uses leave the cache."""
        index = torch.tensor(keep, dtype=torch.long, device=self.valid.device)
        valid = self.valid[index]
        columns = torch.nonzero(valid.any(dim=0)).flatten()
        compact = len(columns) < valid.shape[1]
        kv_cache.select(cache, index, columns if compact else None)
        self.valid = valid[:, columns] if compact else valid
        self.length = self.valid.shape[1]


def new_tokens(acceptance: Acceptance, tokens: list[int], sequence: torch.Tensor) -> torch.Tensor:
    """[len(tokens)] the step's first tokens as ``sequence``'s kind of tensor: the walk's own copy on
    the device where it has one (no host-to-device copy), else made from the host ints."""
    on_device = acceptance.device_tokens
    if on_device is None:
        return torch.tensor(tokens, dtype=sequence.dtype, device=sequence.device)
    return on_device[:len(tokens)].to(sequence.device, sequence.dtype)


def commit_tokens(row: Row, acceptance: Acceptance, stop: StopRule, stopping_criteria, pad_finished: bool) -> int:
    """Append a step's tokens to ``row`` up to the first one after which a stopping criterion fires
    (asked as generate() asks them, on the row alone); with ``pad_finished`` False (no EOS criterion)
    a row whose criteria fired goes on, as in generate(), until :func:`finish_together`.
    Returns how many tokens were appended."""
    tokens = acceptance.tokens[:max(row.limit - len(row.sequence), 0)]
    if row.fired_at is None:
        def ask(j: int) -> bool:  # generate()'s other criteria on the sequence ending with token j
            ids = torch.tensor(tokens[:j + 1], dtype=row.sequence.dtype, device=row.sequence.device)
            context = torch.cat([row.sequence, ids])[None, :]
            return bool(stopping_criteria(context, acceptance.scores[j][None]).any())

        cut = stop.cut(len(row.sequence), tokens, ask)
        if cut is not None:
            row.fired_at = len(row.sequence) + cut
            if pad_finished:
                tokens = tokens[:cut]
                row.done = True
    row.sequence = torch.cat([row.sequence, new_tokens(acceptance, tokens, row.sequence)])
    row.done = row.done or len(row.sequence) >= row.limit
    return len(tokens)


def finish_together(rows: list[Row]) -> None:
    """Without an EOS criterion generate() pads nothing: a row whose criteria fired goes on until
    every row's have, and all end at the same length, the largest first-firing length."""
    if any(row.fired_at is None for row in rows):
        return
    end = max(row.fired_at for row in rows)
    for row in rows:
        row.limit = end
        if len(row.sequence) >= end:
            extra = len(row.sequence) - end
            row.stats.new_tokens -= extra
            row.sequence = row.sequence[:end]
            if extra:
                del row.scores[len(row.scores) - extra:], row.logits[len(row.logits) - extra:]
            row.done = True


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


def batch_step(steps: list[StepStats], draft_forwards: int, draft_seconds: float, verify_seconds: float) -> StepStats:
    """A batched step's figures: its rows' steps summed (the tree's depth: the deepest)."""
    return StepStats(
        tree_size=sum(s.tree_size for s in steps),
        tree_depth=max(s.tree_depth for s in steps),
        expected_length=sum(s.expected_length for s in steps),
        accepted=sum(s.accepted for s in steps),
        emitted=sum(s.emitted for s in steps),
        draft_forwards=draft_forwards,
        draft_seconds=draft_seconds,
        verify_seconds=verify_seconds,
        rows=len(steps),
    )
