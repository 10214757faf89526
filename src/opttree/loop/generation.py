"""The speculative decoding loop, one function in numbered steps, for any number of rows.

:func:`speculative_decode` is the steps: 0 prefill, then while rows remain 1 draft, 2 verify,
3 walk, 4 caches, 5 commit, 6 finished rows leave; each is a call of :class:`Decoding` (step 1: of
:mod:`.drafting`, 2: of :mod:`.verify_inputs`, 3: of :mod:`.walking`, 4: of :mod:`.slots`, 5: of
:mod:`.committing`), numbered as in DESIGN.md.

Invariant at the top of every step: each row's ``sequence`` = its committed tokens; the target's
cache holds all of them but the last one, the row's *root*, whose logits are computed by the
step's verification forward together with the row's tree. The prompts' prefill therefore stops
one token short, and the first step verifies each prompt's last token together with its first tree.

Batch size 1 is one row, not another loop: its drafter is the drafter itself
(:meth:`Drafter.rows`), its cache slots are the rows' layout without holes (slots.Slots: one
declared switch, for counts tests/test_overhead.py pins), and its builder runs alone in the
lockstep. Several rows share each draft forward where the drafter batches its rows (a draft
model), and always share the verification forward; each row keeps its own tree, budget
policy, stopping criteria and stats, and leaves the batch when it finishes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..drafters.base import Drafter, DrafterRows
from ..hf import kv_cache
from ..hf.compat import with_cache
from ..hf.compiled import target_forward
from ..tree.draft_tree import DraftTree
from ..tree.layout import MaskLayout
from ..tree.plan import FixedPolicy
from ..verify.acceptance import Acceptance
from .batch_context import processing
from .committing import commit_step
from .drafting import Drafted, draft_rows
from .model_inputs import ModelInputs
from .outputs import combined_stats, output_sequences, per_token
from .rows import Padding, Row, new_rows
from .settings import DecodeSettings
from .slots import Slots
from .stats import GenerationStats, StepStats
from .stopping import StopRule
from .verify_inputs import verify_inputs
from .walking import walker


@dataclass
class DecodeResult:
    sequences: torch.Tensor  # [B, T + new] long (finished rows right-padded as generate() pads them)
    stats: GenerationStats
    scores: tuple | None = None  # processed scores per new token, each [B, vocab]
    logits: tuple | None = None  # raw target logits per new token, each [B, vocab]


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
    run = Decoding.start(target, drafter, input_ids, attention_mask, cache, settings, model_inputs)
    # 0. prefill the target with all prompt columns but the last (every row's root)
    run.prefill(input_ids)
    while run.rows:
        # 1. draft every row's tree (not deeper than its tokens still allowed and the context)
        drafted = run.draft()
        # 2. verify: ONE target forward over every row's root and tree
        start = time.perf_counter()
        logits, hidden = run.verify(drafted.trees)
        # 3. walk each row's tree: the target's own token at the root and at each accepted node
        acceptances = run.walk_trees(drafted, logits)
        verified = time.perf_counter() - start
        # 4. keep only each row's root and accepted path in both caches
        run.keep(drafted, acceptances, hidden)
        # 5. commit each row's tokens, up to the first one after which a stopping criterion fires
        run.commit(drafted, acceptances, verified)
        # 6. finished rows leave the batch (target cache, drafter, trees), so they stop costing work
        run.leave()
    return run.result()


@dataclass
class Decoding:
    """One decode in progress: what its steps read, and the rows still decoding."""

    target: object
    drafters: DrafterRows
    cache: object
    settings: DecodeSettings
    model_inputs: ModelInputs | None
    every_row: list[Row]  # the call's rows, in the caller's order
    rows: list[Row]  # those still decoding
    slots: Slots
    stop: StopRule
    walk: Callable  # walker()'s
    timed: bool  # some row's policy learns from device times ("auto"): the drafter's calls are synced
    dtype: torch.dtype  # the verify masks' (read once: HF's ``model.dtype`` walks the parameters)
    batch_steps: list[StepStats] = field(default_factory=list)  # each step summed over its rows (B > 1)

    @classmethod
    def start(cls, target, drafter: Drafter | DrafterRows, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
              cache, settings: DecodeSettings, model_inputs: ModelInputs | None) -> "Decoding":
        """The decode of ``input_ids`` before its prefill (arguments: :func:`speculative_decode`'s)."""
        count = input_ids.shape[0]
        drafters = drafter.rows(count) if isinstance(drafter, Drafter) else drafter
        mask = attention_mask.bool() if attention_mask is not None else torch.ones_like(input_ids, dtype=torch.bool)
        padded = attention_mask is not None and not bool(mask.all())
        padding = Padding.of(mask) if padded else Padding([0] * count, [0] * count)
        rows = new_rows(input_ids, padding, settings)
        slots = Slots.of(mask, padding, MaskLayout.of(target.config), kv_cache.capacity(cache),
                         holes=count > 1 or padded)
        stop = StopRule.of(settings.stopping_criteria)
        want_rows = settings.output_scores or settings.output_logits or stop.needs_scores
        batched = count > 1 and len(settings.logits_processor or []) > 0  # processors see row b at its batch index
        walk = walker(settings, want_rows,
                      processing(settings.logits_processor, rows, settings.pad_token_id) if batched else None)
        timed = any(row.policy.timed for row in rows)  # "auto" learns from device times (not a sampled call's)
        return cls(target, drafters, cache, settings, model_inputs, rows, list(rows), slots, stop, walk, timed,
                   target.dtype)

    def prefill(self, input_ids: torch.Tensor) -> None:
        """Step 0: the target's forward over every prompt column but the last, positions as generate()'s;
        a drafter that wants the target's features gets those of every row's tokens (padding excluded)."""
        if input_ids.shape[1] < 2:
            return
        extra, valid = {}, self.slots.valid  # valid: [B, T - 1], the prompts' visible columns but the last
        if self.slots.holes:  # padding or several rows: each row's positions count its own tokens
            extra = dict(attention_mask=valid.long(), position_ids=(valid.long().cumsum(-1) - 1).masked_fill(~valid, 0))
        inputs = {"input_ids": input_ids[:, :-1]} if self.model_inputs is None else self.model_inputs.prefill(input_ids)
        wants = self.drafters.wants_hidden_states
        out = self.target(**inputs, **with_cache(self.target, self.cache), use_cache=True, logits_to_keep=1,
                          output_hidden_states=wants, **extra)
        if wants:
            self.drafters.add_features([self.drafters.features_from(b, row_hidden(out.hidden_states, b))[row.pad:]
                                        for b, row in enumerate(self.rows)])

    def draft(self) -> Drafted:
        """Step 1: every row's tree, not deeper than its tokens still allowed and the context."""
        return draft_rows(self.rows, self.drafters, self.settings, sync=self.timed)

    def verify(self, trees: list[DraftTree]) -> tuple[torch.Tensor, tuple | None]:
        """Step 2: ONE target forward over every row's root and tree -> (logits [R, q, vocab] where the
        rows' tokens are, the hidden states where the drafter wants the target's features)."""
        rows = self.rows
        roots = rows[0].sequence[-1:] if len(rows) == 1 else torch.stack([row.sequence[-1] for row in rows])
        inputs = verify_inputs(self.slots, roots, trees, rows, self.dtype, self.cache)
        first = not self.every_row[0].stats.steps  # the roots are the prompts' last tokens
        extra = None if self.model_inputs is None else self.model_inputs.verify(
            self.target, inputs.input_ids, [row.index for row in rows], first)
        logits, hidden = target_forward(self.target, inputs, self.cache, self.drafters.wants_hidden_states, extra,
                                        self.settings.verify_forward)
        return logits.to(roots.device), hidden

    def walk_trees(self, drafted: Drafted, logits: torch.Tensor) -> list[Acceptance]:
        """Step 3: each row's walk over its tree's rows of ``logits`` ([n_b + 1, vocab] each)."""
        return [self.walk(row, built, tree, logits[b, :len(tree) + 1])
                for b, (row, built, tree) in enumerate(zip(self.rows, drafted.builts, drafted.trees))]

    def keep(self, drafted: Drafted, acceptances: list[Acceptance], hidden: tuple | None) -> None:
        """Step 4: both caches keep only each row's root and accepted path; a drafter that wants the
        target's features gets those of each row's root and accepted nodes."""
        self.slots.keep(self.cache, acceptances, self.rows)
        if drafted.drafted:
            self.drafters.commit([a.pool_ids if a.pool_ids is not None else built.pool_ids[a.nodes].tolist()
                                  for a, built in zip(acceptances, drafted.builts)])
        if hidden is not None:
            self.drafters.add_features([self.drafters.features_from(b, row_hidden(hidden, b))[kept_rows(a)]
                                        for b, a in enumerate(acceptances)])

    def commit(self, drafted: Drafted, acceptances: list[Acceptance], verify_seconds: float) -> None:
        """Step 5: each row's tokens and figures (:func:`.committing.commit_step`)."""
        summed = commit_step(self.rows, self.every_row, drafted, acceptances, verify_seconds, self.stop, self.settings)
        if len(self.every_row) > 1:
            self.batch_steps.append(summed)

    def leave(self) -> None:
        """Step 6: finished rows leave the batch (target cache, drafter, trees), so they stop costing work."""
        keep = [b for b, row in enumerate(self.rows) if not row.done]
        if len(keep) == len(self.rows):
            return
        self.rows = [self.rows[b] for b in keep]
        if self.rows:
            self.slots.select(self.cache, keep)
            self.drafters.select(keep)

    def result(self) -> DecodeResult:
        """generate()'s output for every row (the streamer ended)."""
        settings, rows = self.settings, self.every_row
        if settings.streamer is not None:
            settings.streamer.end()
        return DecodeResult(
            sequences=output_sequences(rows, settings.pad_token_id),
            stats=combined_stats(rows, self.batch_steps),
            scores=per_token(rows, [row.scores for row in rows]) if settings.output_scores else None,
            logits=per_token(rows, [row.logits for row in rows]) if settings.output_logits else None,
        )


def kept_rows(acceptance: Acceptance) -> torch.Tensor | list[int]:
    """The verify forward's rows of the root and the accepted nodes: [accepted + 1] long, on the device
    where the walk left them (indexing with a host list copies it there first)."""
    if acceptance.device_rows is None:
        return [0] + [1 + i for i in acceptance.nodes]
    return acceptance.device_rows


def row_hidden(hidden_states: tuple, b: int) -> list[torch.Tensor]:
    """Row b of every hidden state: each [1, q, H]."""
    return [h[b:b + 1] for h in hidden_states]
