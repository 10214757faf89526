"""The decoding loop for a batch of left-padded prompts: the steps of generation.py, per row.

Each row has its own draft tree and accepts its own number of tokens; one target forward verifies
every row's tree, and the rows' tree builders share their draft forwards (lockstep.py). Rows that
finish leave the batch (target cache, draft cache, trees), so they stop costing work.

Layout: the rows share the caches' slots but not their positions. ``valid`` [R, L] marks the slots
holding each row's committed tokens (all but its root); left padding, a row's unused slots in a
step (the *holes*, when another row accepted more) and the dummy nodes that pad every tree to the
batch's largest are hidden by each row's 4D additive mask. A row's rotary positions count only its
own tokens, as generate() computes them from the attention mask; so a row's logits are those of
the row decoded alone (up to rounding), and greedy output equals the target's batched greedy generate() row by row
(with generate()'s pad tokens after a row's EOS).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import torch

from . import kv_cache
from .builder import BuiltTree
from .config import TreeConfig
from .drafters.model import BatchModelDrafter
from .generation import DecodeResult, node_choice, tree_depth
from .lockstep import run_in_lockstep
from .masks import batch_verification_inputs
from .stats import GenerationStats, StepStats
from .strategies import build_tree
from .tree import DraftTree
from .verify import Acceptance, greedy_choice, sampled_choice, verify

logger = logging.getLogger(__name__)

# Squeeze the holes out of a cache (kv_cache.compact_rows) once they make up this share of its slots
# beyond the longest row's: holes cost attention over slots no row reads, compacting costs one copy.
COMPACT_SHARE = 0.25
COMPACT_MIN_HOLES = 16


def worth_compacting(valid: torch.Tensor) -> bool:
    """valid: [R, L] bool, each row's used slots."""
    holes = valid.shape[1] - int(valid.sum(dim=1).max())
    return holes >= max(COMPACT_MIN_HOLES, COMPACT_SHARE * valid.shape[1])


@dataclass
class Row:
    """One prompt of the batch while it is being decoded."""

    index: int  # its place in the caller's batch
    sequence: torch.Tensor  # [pad + T + new] long: left padding, prompt, committed tokens (generate()'s view)
    pad: int  # left padding
    limit: int  # the length at which it stops (max_length; see ``finish_together``)
    stats: GenerationStats = field(default_factory=GenerationStats)
    fired_at: int | None = None  # length at which a stopping criterion first fired
    done: bool = False

    @property
    def tokens(self) -> torch.Tensor:
        """[T + new] long: the row without its padding (the drafter's view)."""
        return self.sequence[self.pad:]


def left_padding(attention_mask: torch.Tensor) -> torch.Tensor:
    """attention_mask: [B, T] (1 = token, 0 = padding) -> [B] long, each row's left padding.
    Refuses padding anywhere but on the left, and rows without any token."""
    mask = attention_mask.bool()
    if not bool((mask[:, 1:] >= mask[:, :-1]).all()) or not bool(mask[:, -1].all()):
        raise ValueError(
            "opttree needs LEFT padding for batches (the last column must be every row's last prompt "
            "token): set tokenizer.padding_side = 'left' before tokenizing the prompts"
        )
    return (~mask).sum(dim=1)


def check_batch(drafter, config: TreeConfig, generation_config, streamer) -> None:
    """What a batch (or a padded prompt) cannot do yet, each refusal naming the fix."""
    from .drafters.model import ModelDrafter

    if type(drafter) is not ModelDrafter:
        raise NotImplementedError(
            f"batches (several or padded prompts) need a draft model (draft_model=<a causal LM with the "
            f"target's vocabulary>); {type(drafter).__name__} drafts one prompt at a time: call generate() "
            "once per prompt, without padding"
        )
    if config.nodes == "auto" or config.threshold == "auto":
        raise NotImplementedError("nodes/threshold='auto' time one prompt's tree; for a batch pass numbers, "
                                  "e.g. nodes=16, threshold=0.3")
    if streamer is not None:
        raise NotImplementedError("streamers take one sequence: stream one prompt per generate() call")
    if generation_config.output_scores or generation_config.output_logits:
        raise NotImplementedError("output_scores/output_logits are per-step batch tensors that a batch with rows "
                                  "at different lengths does not have: call generate() once per prompt for them")


def _build(root_probs: torch.Tensor, config: TreeConfig, cap: int, row: int, generator):
    """A lockstep task: row ``row``'s tree; its draft requests are ``(row, pool, frontier)``."""

    def task(call):
        if cap < 1:
            return BuiltTree(DraftTree.empty(root_probs.device), torch.empty(0, dtype=torch.long))
        return build_tree(root_probs, lambda pool, frontier: call((row, pool, frontier)), config, cap,
                          generator=generator)

    return task


def draft_trees(drafter: BatchModelDrafter, rows: list[Row], caps: list[int], config: TreeConfig,
                generator) -> list[BuiltTree]:
    """Every row's tree: one catch-up forward, then one draft forward per layer for all rows."""
    root_probs = drafter.root_probs([row.tokens for row in rows])  # [R, vocab]

    def expand_all(requests):  # [(row, pool, frontier)] of the rows still growing
        per_row = [None] * len(rows)
        for b, pool, frontier in requests:
            per_row[b] = (pool, frontier)
        answers = drafter.expand(per_row)
        return [answers[b] for b, _, _ in requests]

    tasks = [_build(root_probs[b], config, cap, b, generator) for b, cap in enumerate(caps)]
    return run_in_lockstep(tasks, expand_all)


def accepted_slots(acceptances: list[Acceptance], past_len: int) -> torch.Tensor:
    """[R, 1 + max accepted] long: each row's root slot and its accepted nodes' slots (the verify
    forward put the root at ``past_len`` and node i at ``past_len + 1 + i``), padded with the root's
    slot (holes)."""
    width = 1 + max(a.accepted for a in acceptances)
    return torch.tensor([[past_len] + [past_len + 1 + n for n in a.nodes] + [past_len] * (width - 1 - a.accepted)
                         for a in acceptances], dtype=torch.long)


def speculative_decode_batch(
    target,
    drafter: BatchModelDrafter,
    input_ids: torch.Tensor,  # [B, T] long, left-padded
    attention_mask: torch.Tensor,  # [B, T], 0 on the left padding
    cache,
    logits_processor,
    stopping_criteria,
    config: TreeConfig,
    *,
    max_length: int,
    context_length: int,
    pad_token_id: int | None,
    pad_finished: bool = True,
    do_sample: bool = False,
    generator: torch.Generator | None = None,
) -> DecodeResult:
    """pad_finished: generate() pads a finished row (with ``pad_token_id``) only when its stopping
    criteria include an EOS one; otherwise every row goes on until all have stopped."""
    pick = sampled_choice if do_sample else greedy_choice
    device = input_ids.device
    pads = left_padding(attention_mask)
    mask = attention_mask.bool()
    rows = [Row(b, input_ids[b], int(pads[b]), max_length) for b in range(input_ids.shape[0])]
    every_row = list(rows)
    for row in rows:
        row.stats.prompt_tokens = len(row.tokens)
    stats = GenerationStats(prompt_tokens=sum(len(row.tokens) for row in rows), rows=[row.stats for row in rows])

    # 0. prefill the target with all prompt columns but the last (every row's root), positions as generate()'s
    if input_ids.shape[1] > 1:
        positions = (attention_mask.long().cumsum(-1) - 1).masked_fill(~mask, 0)
        target(input_ids=input_ids[:, :-1], attention_mask=attention_mask[:, :-1], position_ids=positions[:, :-1],
               past_key_values=cache, use_cache=True, logits_to_keep=1)
    valid = mask[:, :-1].clone()  # [R, L]: the slots of each row's committed tokens (roots excluded)

    while rows:
        # 1. draft every row's tree (not deeper than its tokens still allowed and the context)
        caps = [min(row.limit - len(row.sequence) - 1, context_length - len(row.tokens)) for row in rows]
        t0 = time.perf_counter()
        forwards_before = drafter.forwards
        builts = draft_trees(drafter, rows, caps, config, generator)
        trees = [DraftTree(b.tree.tokens.to(device), b.tree.parents.to(device), b.tree.path_probs) for b in builts]
        t1 = time.perf_counter()

        # 2. verify: ONE target forward over every row's root and tree
        roots = torch.stack([row.sequence[-1] for row in rows])
        inputs = batch_verification_inputs(roots, trees, valid.sum(dim=1), valid, target.dtype)
        out = target(**inputs.as_kwargs(), past_key_values=cache, use_cache=True, logits_to_keep=0)
        logits = out.logits.float().to(device)  # [R, q, vocab]

        # 3. walk each row's tree
        acceptances = []
        for b, (row, built, tree) in enumerate(zip(rows, builts, trees)):
            choose, process = node_choice(row.sequence, logits_processor, pick, generator)
            acceptances.append(verify(built, tree, logits[b, :len(tree) + 1], choose, config,
                                      process=process if do_sample else None, generator=generator))
        t2 = time.perf_counter()

        # 4. caches: each row's root and accepted path move to the front of the step's slots
        past_len = valid.shape[1]
        slots = accepted_slots(acceptances, past_len)  # [R, width]
        kv_cache.keep_row_slots(cache, past_len, slots.to(device))
        kept = torch.tensor([1 + a.accepted for a in acceptances], device=device)
        valid = torch.cat([valid, torch.arange(slots.shape[1], device=device)[None, :] < kept[:, None]], dim=1)
        drafter.commit([[int(built.pool_ids[i]) for i in a.nodes] for built, a in zip(builts, acceptances)])
        if worth_compacting(valid):
            valid = kv_cache.compact_rows(cache, valid)
        if worth_compacting(drafter.valid):
            drafter.compact()

        # 5. commit each row's tokens one by one until a stopping criterion fires
        forwards = drafter.forwards - forwards_before
        for row, tree, acceptance in zip(rows, trees, acceptances):
            emitted = commit_row(row, acceptance, stopping_criteria, pad_finished)
            if not row.done and len(row.tokens) > context_length:
                logger.warning("row %d stopped at the model's context length (%d tokens)", row.index, context_length)
                row.done = True
            row.stats.new_tokens += emitted
            row.stats.steps.append(StepStats(
                tree_size=len(tree),
                tree_depth=tree_depth(tree),
                expected_length=tree.expected_length,
                accepted=acceptance.accepted,
                emitted=emitted,
                draft_forwards=forwards,
                draft_seconds=t1 - t0,
                verify_seconds=t2 - t1,
                tree=tree,
                accepted_nodes=list(acceptance.nodes),
            ))
        if not pad_finished:
            finish_together(every_row)
        step = [row.stats.steps[-1] for row in rows]
        stats.steps.append(StepStats(
            tree_size=sum(s.tree_size for s in step),
            tree_depth=max(s.tree_depth for s in step),
            expected_length=sum(s.expected_length for s in step),
            accepted=sum(s.accepted for s in step),
            emitted=sum(s.emitted for s in step),
            draft_forwards=forwards,
            draft_seconds=t1 - t0,
            verify_seconds=t2 - t1,
            rows=len(rows),
        ))

        # 6. finished rows leave the batch, and slots no remaining row uses leave the caches
        keep = [b for b, row in enumerate(rows) if not row.done]
        if len(keep) < len(rows):
            rows = [rows[b] for b in keep]
            if rows:
                index = torch.tensor(keep, dtype=torch.long, device=device)
                valid = valid[index]
                columns = torch.nonzero(valid.any(dim=0)).flatten()
                compact = len(columns) < valid.shape[1]
                kv_cache.select(cache, index, columns if compact else None)
                valid = valid[:, columns] if compact else valid
                drafter.select_rows(index.to(drafter.device))

    # 7. the output: every row, right-padded to the longest as generate() pads finished rows
    width = max(len(row.sequence) for row in every_row)
    fill = pad_token_id if pad_token_id is not None else 0
    sequences = torch.full((len(every_row), width), fill, dtype=input_ids.dtype, device=device)
    for row in every_row:
        sequences[row.index, :len(row.sequence)] = row.sequence
    stats.new_tokens = sum(row.stats.new_tokens for row in every_row)
    return DecodeResult(sequences=sequences, stats=stats)


def commit_row(row: Row, acceptance: Acceptance, stopping_criteria, pad_finished: bool) -> int:
    """Append the step's tokens to ``row`` one by one, running the stopping criteria after each
    (on the row alone, as generate() runs them per row). Returns how many were appended."""
    emitted = 0
    for token, scores in zip(acceptance.tokens, acceptance.scores):
        row.sequence = torch.cat([row.sequence, torch.tensor([token], dtype=row.sequence.dtype,
                                                             device=row.sequence.device)])
        emitted += 1
        if row.fired_at is None and bool(stopping_criteria(row.sequence[None, :], scores[None]).any()):
            row.fired_at = len(row.sequence)
            if pad_finished:
                row.done = True
        if row.done or len(row.sequence) >= row.limit:
            row.done = True
            break
    return emitted


def finish_together(rows: list[Row]) -> None:
    """Without an EOS criterion generate() pads nothing: a row whose criteria fired goes on until
    every row's have, and all end at the same length, the largest first-firing length."""
    if any(row.fired_at is None for row in rows):
        return
    end = max(row.fired_at for row in rows)
    for row in rows:
        row.limit = end
        if len(row.sequence) >= end:
            row.stats.new_tokens -= len(row.sequence) - end
            row.sequence = row.sequence[:end]
            row.done = True
