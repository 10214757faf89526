"""The loop's step 5 for every row still decoding (:func:`commit_step`): its tokens committed up to
the first one after which a stopping criterion fires, as generate() asks them; rows without an EOS
criterion going on together until every row has stopped (:func:`finish_together`); its figures
recorded, and the step's summed over the rows (:func:`batch_step`)."""

from __future__ import annotations

import logging

import torch

from ..verify.acceptance import Acceptance
from .drafting import Drafted
from .rows import Row
from .settings import DecodeSettings
from .stats import StepStats
from .stopping import StopRule

logger = logging.getLogger(__name__)


def commit_step(rows: list[Row], every_row: list[Row], drafted: Drafted, acceptances: list[Acceptance],
                verify_seconds: float, stop: StopRule, settings: DecodeSettings) -> StepStats:
    """The loop's step 5 for every row still decoding (``rows``; ``every_row``: all of the call's):
    its tokens committed up to the first one after which a stopping criterion fires, its scores and
    logits kept where asked, its figures recorded and told to its budget policy; the new tokens
    streamed. -> the step's figures summed over its rows (a batch's stats)."""
    first_new = len(rows[0].sequence)
    for b, row in enumerate(rows):
        acceptance = acceptances[b]
        emitted = commit_tokens(row, acceptance, stop, settings.stopping_criteria, settings.pad_finished)
        if settings.output_scores:  # kept only on request: a [vocab] row per token adds up over long runs
            row.scores.extend(acceptance.scores[:emitted])
        if settings.output_logits:
            row.logits.extend(acceptance.logits[:emitted])
        row.stats.new_tokens += emitted
        row.stats.steps.append(drafted.row_stats(b, acceptance, emitted, verify_seconds))
    if not settings.pad_finished:
        finish_together(every_row)
    if settings.streamer is not None:  # one row (the preparation checks it: generate()'s rule)
        settings.streamer.put(rows[0].sequence[first_new:].cpu())
    for row in rows:
        stop_at_context(row, settings.context_length)
        row.policy.observe(row.stats.steps[-1])  # what the step cost ("auto" refreshes its latency model)
    return batch_step([row.stats.steps[-1] for row in rows], drafted.forwards, drafted.seconds, verify_seconds)


def stop_at_context(row: Row, context_length: int) -> None:
    """A row that holds more tokens than the models can stops there, with a warning."""
    if not row.done and len(row.tokens) > context_length:
        logger.warning("stopped at the model's context length (%d tokens)", context_length)
        row.done = True


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


def new_tokens(acceptance: Acceptance, tokens: list[int], sequence: torch.Tensor) -> torch.Tensor:
    """[len(tokens)] the step's first tokens as ``sequence``'s kind of tensor: the walk's own copy on
    the device where it has one (no host-to-device copy), else made from the host ints."""
    on_device = acceptance.device_tokens
    if on_device is None:
        return torch.tensor(tokens, dtype=sequence.dtype, device=sequence.device)
    return on_device[:len(tokens)].to(sequence.device, sequence.dtype)


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


__all__ = ["batch_step", "commit_step", "commit_tokens", "finish_together", "new_tokens",
           "stop_at_context"]
