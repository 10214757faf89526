"""The speculative decoding loop, one function in numbered steps, for any number of rows.

Invariant at the top of every step: each row's ``sequence`` = its committed tokens; the target's
cache holds all of them but the last one, the row's *root*, whose logits are computed by the
step's verification forward together with the row's tree. The prompts' prefill therefore stops
one token short, and the first step verifies each prompt's last token together with its first tree.

Batch size 1 is one row, not another loop: its drafter is the drafter itself
(:meth:`Drafter.rows`), its cache needs no holes (rows.Slots), and its builder runs alone in
the lockstep. Several rows share each draft forward where the drafter batches its rows (a
draft model), and always share the verification forward; each row keeps its own tree, budget
policy, stopping criteria and stats, and leaves the batch when it finishes.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

import torch

from ..drafters.base import Drafter, DrafterRows
from ..hf import kv_cache
from ..hf.compat import with_cache
from ..hf.compiled import VerifyForward, target_forward
from ..tree.builder import BuiltTree, Growth
from ..tree.config import TreeConfig
from ..tree.plan import BudgetPolicy, FixedPolicy, StepPlan
from .batch_context import processing
from .clock import DraftClock
from .lockstep import run_in_lockstep
from .model_inputs import ModelInputs
from .rows import (Padding, Row, Slots, batch_step, combined_stats, commit_tokens, finish_together,
                   output_sequences, per_token)
from ..tree.draft_tree import DraftTree
from ..tree.layout import MaskLayout
from ..tree.strategies import grow_tree
from ..verify.walk import Acceptance, greedy_choice, greedy_walk, sampled_choice, verify, with_rows
from .stats import GenerationStats, StepStats
from .stopping import StopRule

logger = logging.getLogger(__name__)


@dataclass
class DecodeResult:
    sequences: torch.Tensor  # [B, T + new] long (finished rows right-padded as generate() pads them)
    stats: GenerationStats
    scores: tuple | None = None  # processed scores per new token, each [B, vocab]
    logits: tuple | None = None  # raw target logits per new token, each [B, vocab]


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


def kept_rows(acceptance: Acceptance) -> torch.Tensor | list[int]:
    """The verify forward's rows of the root and the accepted nodes: [accepted + 1] long, on the device
    where the walk left them (indexing with a host list copies it there first)."""
    if acceptance.device_rows is None:
        return [0] + [1 + i for i in acceptance.nodes]
    return acceptance.device_rows


def row_hidden(hidden_states: tuple, b: int) -> list[torch.Tensor]:
    """Row b of every hidden state: each [1, q, H]."""
    return [h[b:b + 1] for h in hidden_states]


def tree_depth(tree: DraftTree) -> int:
    """The deepest node's depth (a host read)."""
    return int(tree.depths().max()) if len(tree) else 0


def node_choice(sequence: torch.Tensor, logits_processor, pick, generator=None, apply=None):
    """verify()'s ``choose`` and ``process`` at the nodes of a tree hanging under ``sequence``
    ([T] long, every committed token: what generate()'s processors see as the context).
    apply(context [L], scores [vocab]) -> [vocab]: the processors on this row of a batch
    (batch_context.processing); None: ``logits_processor`` on the row alone."""

    def process(emitted: list[int], row: torch.Tensor) -> torch.Tensor:  # the node's processed scores
        context = torch.cat([sequence, torch.tensor(emitted, dtype=sequence.dtype, device=sequence.device)])
        if apply is not None:
            return apply(context, row)
        return logits_processor(context[None, :], row[None, :])[0]

    def choose(emitted: list[int], row: torch.Tensor):
        scores = process(emitted, row)
        return pick(scores, generator), scores

    return choose, process


def empty_tree(device: torch.device) -> BuiltTree:
    return BuiltTree(DraftTree.empty(device), torch.empty(0, dtype=torch.long), depth_bound=0, expected_length=0.0)


def no_tree(device: torch.device) -> Growth:
    """The builder of a row with no room left to draft: the empty tree, without asking the drafter."""
    yield from ()
    return empty_tree(device)


def draft_trees(clock: DraftClock, rows: list[Row], caps: list[int], plans: list[StepPlan],
                settings: DecodeSettings) -> list[BuiltTree] | None:
    """Every row's tree (not deeper than its cap): one catch-up call, then one drafter call per
    layer for all rows still growing (their builders run in lockstep). None: no row may draft."""
    if all(cap < 1 for cap in caps):
        return None
    root_probs = clock.root_probs([row.tokens for row in rows])
    builders = [grow_tree(root_probs[b], settings.config, caps[b], generator=settings.generator, plan=plans[b])
                if caps[b] >= 1 else no_tree(rows[b].sequence.device) for b in range(len(rows))]
    return run_in_lockstep(builders, clock.expand)


def prefill(target, input_ids: torch.Tensor, mask: torch.Tensor, cache, slots: Slots, drafters: DrafterRows,
            rows: list[Row], model_inputs: ModelInputs | None = None) -> None:
    """The target's forward over every prompt column but the last, positions as generate()'s; a
    drafter that wants the target's features gets those of every row's tokens (padding excluded)."""
    extra = {}
    if slots.valid is not None:  # padding or several rows: each row's positions count its own tokens
        positions = (mask.long().cumsum(-1) - 1).masked_fill(~mask, 0)
        extra = dict(attention_mask=mask[:, :-1].long(), position_ids=positions[:, :-1])
    inputs = model_inputs.prefill(input_ids) if model_inputs is not None else {"input_ids": input_ids[:, :-1]}
    out = target(**inputs, **with_cache(target, cache), use_cache=True, logits_to_keep=1,
                 output_hidden_states=drafters.wants_hidden_states, **extra)
    if drafters.wants_hidden_states:
        drafters.add_features([drafters.features_from(b, row_hidden(out.hidden_states, b))[row.pad:]
                               for b, row in enumerate(rows)])


def walker(settings: DecodeSettings, want_rows: bool, apply=None):
    """walk(row, built, tree, logits [n + 1, vocab]) -> the row's Acceptance: the target's own token
    at the root and at each accepted node. Greedy without processors: every node at once, one read.
    apply(b, context, scores): the processors on row b of a batch (batch_context.processing)."""
    config, logits_processor, do_sample, generator = (settings.config, settings.logits_processor, settings.do_sample,
                                                      settings.generator)
    pick = sampled_choice if do_sample else greedy_choice
    fast = not do_sample and len(logits_processor or []) == 0

    def walk(row: Row, built: BuiltTree, tree: DraftTree, logits: torch.Tensor) -> Acceptance:
        if fast:
            acceptance = greedy_walk(tree, logits, built.pool_ids, built.depth_bound)
            return with_rows(acceptance, logits) if want_rows else acceptance
        row_apply = None if apply is None else (lambda context, scores: apply(row.index, context, scores))
        choose, process = node_choice(row.sequence, logits_processor, pick, generator, row_apply)
        return verify(built, tree, logits, choose, config, process=process if do_sample else None, generator=generator)

    return walk


def step_stats(built: BuiltTree, tree: DraftTree, acceptance: Acceptance, emitted: int, forwards: int,
               draft_seconds: float, verify_seconds: float, root_seconds: float, layers) -> StepStats:
    """One row's figures for one step."""
    return StepStats(
        tree_size=len(tree),
        tree_depth=acceptance.tree_depth if acceptance.tree_depth is not None else tree_depth(tree),
        expected_length=built.expected_length if built.expected_length is not None else tree.expected_length,
        accepted=acceptance.accepted,
        emitted=emitted,
        draft_forwards=forwards,
        draft_seconds=draft_seconds,
        verify_seconds=verify_seconds,
        tree=tree,
        accepted_nodes=list(acceptance.nodes),
        root_seconds=root_seconds,
        layers=layers,
    )


def speculative_decode(target, drafter: Drafter | DrafterRows, input_ids: torch.Tensor, cache, settings: DecodeSettings,
                       attention_mask: torch.Tensor | None = None,
                       model_inputs: ModelInputs | None = None) -> DecodeResult:
    """Decode every row of ``input_ids`` ([B, T] long, left-padded when B > 1 and the prompts differ in
    length; ``attention_mask`` [B, T], 0 on the padding, None: no padding) with ``settings``;
    ``model_inputs``: the prompt's inputs_embeds / token_type_ids, fed as generate() feeds them.

    drafter: a Drafter (its :meth:`Drafter.rows` view is taken) or a DrafterRows for B rows.

    Host reads per step of one row (greedy, no logits processors): one per drafted layer (the
    builder's threshold test), one for the walk (the accepted path, its pool ids and the emitted
    tokens), one in a draft model's commit; everything else stays on the devices."""
    count = input_ids.shape[0]
    drafters = drafter.rows(count) if isinstance(drafter, Drafter) else drafter
    new_policy = settings.new_policy or (lambda: FixedPolicy(settings.config))
    stop = StopRule.of(settings.stopping_criteria)
    want_rows = settings.output_scores or settings.output_logits or stop.needs_scores
    padded = attention_mask is not None and not bool(attention_mask.bool().all())
    padding = Padding.of(attention_mask) if padded else Padding([0] * count, [0] * count)
    rows = [Row(b, input_ids[b], padding.left[b], settings.max_length, new_policy(), hidden=padding.hidden[b])
            for b in range(count)]
    every_row = list(rows)
    for row in rows:
        row.stats.prompt_tokens = len(row.tokens)
    timed = any(not isinstance(row.policy, FixedPolicy) for row in rows)  # "auto" learns from device times
    wants_hidden = drafters.wants_hidden_states  # the drafter reads the target's features
    batched = count > 1 and len(settings.logits_processor or []) > 0  # processors see row b at its batch index
    walk = walker(settings, want_rows,
                  processing(settings.logits_processor, rows, settings.pad_token_id) if batched else None)
    dtype = target.dtype  # the verify masks' (read once: HF's ``model.dtype`` walks the parameters)
    batch_steps: list[StepStats] = []

    # 0. prefill the target with all prompt columns but the last (every row's root)
    mask = attention_mask.bool() if attention_mask is not None else torch.ones_like(input_ids, dtype=torch.bool)
    slots = Slots.of(mask, padding if count > 1 or padded else None, MaskLayout.of(target.config),
                     kv_cache.capacity(cache))
    if input_ids.shape[1] > 1:
        prefill(target, input_ids, mask, cache, slots, drafters, rows, model_inputs)

    while rows:
        # 1. draft every row's tree (not deeper than its tokens still allowed and the context)
        caps = [min(row.limit - len(row.sequence) - 1, settings.context_length - len(row.tokens)) for row in rows]
        t0 = time.perf_counter()
        forwards_before = drafters.forwards
        plans = [row.policy.plan() for row in rows]  # each row's nodes, threshold, layer width
        clock = DraftClock(drafters, len(rows), sync=timed)
        builts = draft_trees(clock, rows, caps, plans, settings)
        drafted = builts is not None
        builts = builts or [empty_tree(row.sequence.device) for row in rows]
        trees = [built.tree.to(row.sequence.device) for built, row in zip(builts, rows)]
        t1 = time.perf_counter()

        # 2. verify: ONE target forward over every row's root and tree
        roots = rows[0].sequence[-1:] if len(rows) == 1 else torch.stack([row.sequence[-1] for row in rows])
        inputs = slots.inputs(roots, trees, rows, dtype, cache)
        first = not every_row[0].stats.steps  # the roots are the prompts' last tokens
        extra = None if model_inputs is None else model_inputs.verify(target, inputs.input_ids,
                                                                     [row.index for row in rows], first)
        logits, hidden = target_forward(target, inputs, cache, wants_hidden, extra, settings.verify_forward)
        logits = logits.to(roots.device)  # [R, q, vocab], where generate() keeps ids

        # 3. walk each row's tree: the target's own token at the root and at each accepted node
        acceptances = [walk(row, built, tree, logits[b, :len(tree) + 1])  # [n_b + 1, vocab] each
                       for b, (row, built, tree) in enumerate(zip(rows, builts, trees))]
        t2 = time.perf_counter()

        # 4. keep only each row's root and accepted path in both caches
        slots.keep(cache, acceptances, rows)
        if drafted:
            drafters.commit([a.pool_ids if a.pool_ids is not None else built.pool_ids[a.nodes].tolist()
                             for a, built in zip(acceptances, builts)])
        if wants_hidden:  # the features of each row's root and accepted nodes
            drafters.add_features([drafters.features_from(b, row_hidden(hidden, b))[kept_rows(a)]
                                   for b, a in enumerate(acceptances)])

        # 5. commit each row's tokens, up to the first one after which a stopping criterion fires
        forwards = drafters.forwards - forwards_before
        share = 1.0 / len(rows)  # a row's share of the step's shared phases
        lengths = [len(row.sequence) for row in rows]
        for b, (row, built, tree, acceptance) in enumerate(zip(rows, builts, trees, acceptances)):
            emitted = commit_tokens(row, acceptance, stop, settings.stopping_criteria, settings.pad_finished)
            if settings.output_scores:  # kept only on request: a [vocab] row per token adds up over long runs
                row.scores.extend(acceptance.scores[:emitted])
            if settings.output_logits:
                row.logits.extend(acceptance.logits[:emitted])
            row.stats.new_tokens += emitted
            row.stats.steps.append(step_stats(built, tree, acceptance, emitted, forwards, (t1 - t0) * share,
                                              (t2 - t1) * share, clock.root_seconds[b], clock.layers[b]))
        if not settings.pad_finished:
            finish_together(every_row)
        if settings.streamer is not None:  # one row (the preparation checks it: generate()'s rule)
            settings.streamer.put(rows[0].sequence[lengths[0]:].cpu())
        for row in rows:
            if not row.done and len(row.tokens) > settings.context_length:
                logger.warning("stopped at the model's context length (%d tokens)", settings.context_length)
                row.done = True
            row.policy.observe(row.stats.steps[-1])  # what the step cost ("auto" refreshes its latency model)
        if len(every_row) > 1:
            batch_steps.append(batch_step([row.stats.steps[-1] for row in rows], forwards, t1 - t0, t2 - t1))

        # 6. finished rows leave the batch (target cache, drafter, trees), so they stop costing work
        keep = [b for b, row in enumerate(rows) if not row.done]
        if len(keep) < len(rows):
            rows = [rows[b] for b in keep]
            if rows:
                slots.select(cache, keep)
                drafters.select(keep)

    if settings.streamer is not None:
        settings.streamer.end()
    return DecodeResult(
        sequences=output_sequences(every_row, settings.pad_token_id),
        stats=combined_stats(every_row, batch_steps),
        scores=per_token(every_row, [row.scores for row in every_row]) if settings.output_scores else None,
        logits=per_token(every_row, [row.logits for row in every_row]) if settings.output_logits else None,
    )
