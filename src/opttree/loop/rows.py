"""The rows of one decode (batch size 1 is one row): where their tokens sit in the target's cache,
and how each row commits a step's tokens and stops (the loop's step 5, :func:`commit_step`).

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
from ..tree.builder import BuiltTree
from ..tree.draft_tree import DraftTree
from ..tree.layout import MaskLayout
from ..tree.masks import ForwardInputs, batch_verification_inputs, verification_inputs
from ..tree.plan import BudgetPolicy, FixedPolicy
from ..tree.sizes import padded_size
from ..verify.acceptance import Acceptance
from .settings import DecodeSettings
from .stats import GenerationStats, LayerTiming, StepStats
from .stopping import StopRule

logger = logging.getLogger(__name__)


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
    limit: int  # the length at which it stops (max_length; see ``finish_together``)
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


@dataclass
class Slots:
    """Where the rows' committed tokens (all but each row's root) sit in the target's cache."""

    length: int  # cache slots before this step's roots
    valid: torch.Tensor | None  # [R, length] bool, each row's own slots; None: all are the one row's
    fixed_sizes: bool = True  # pad each verification forward to one of tree.sizes.VERIFY_SIZES rows
    kv_len: int | None = None  # a static cache's slots (the mask spans them); None: a cache that grows
    layout: MaskLayout | None = None  # the target's layer types and windows
    # [R, length] long, the index in its row's tokens of each slot's token (what a window counts), kept
    # beside ``valid`` when the layout has windows; None otherwise (one unpadded row: slot i holds index i)
    index: torch.Tensor | None = None

    @classmethod
    def of(cls, mask: torch.Tensor, padding: Padding | None, layout: MaskLayout, kv_len: int | None) -> "Slots":
        """The prompts' slots before their prefill: mask [B, T] bool (all True without padding); padding:
        None for one unpadded row (every slot is its own)."""
        length = mask.shape[1] - 1
        if padding is None:
            return cls(length, None, kv_len=kv_len, layout=layout)
        index = None
        if layout.windowed:
            left = torch.tensor(padding.left, device=mask.device)
            index = torch.arange(length, device=mask.device)[None, :] - left[:, None]  # [B, T - 1]
        return cls(length, mask[:, :-1].clone(), kv_len=kv_len, layout=layout, index=index)

    def root_positions(self, rows: list[Row]) -> list[int]:
        """Each row's root position: its committed tokens before the root."""
        return [row.root_position for row in rows]

    def size(self, trees: list[DraftTree], rows: list[Row]) -> int:
        """The rows of this step's verification forward: the root and the largest tree, padded to the
        size the row's policy picks (one row) or the smallest that holds them (a batch)."""
        needed = 1 + max(len(tree) for tree in trees)
        if not self.fixed_sizes:
            return needed
        if len(rows) == 1:
            return rows[0].policy.verify_rows(needed - 1)
        return padded_size(needed)

    def inputs(self, roots: torch.Tensor, trees: list[DraftTree], rows: list[Row], dtype: torch.dtype,
               cache) -> ForwardInputs:
        """The verification forward's inputs: roots [R] long, then each row's tree, then dummy rows
        up to :meth:`size` (masks as ``cache`` holds the slots: one row's keeps only a window's)."""
        size = self.size(trees, rows)
        if self.valid is None:
            dropped = kv_cache.window_offsets(cache) if self.layout is not None and self.layout.windowed else None
            return verification_inputs(roots, trees[0], self.length, dtype, size=size, kv_len=self.kv_len,
                                       layout=self.layout, dropped=dropped)
        positions = torch.tensor(self.root_positions(rows), device=roots.device)
        if self.index is None:
            return batch_verification_inputs(roots, trees, positions, self.valid, dtype, size=size, kv_len=self.kv_len)
        indices = torch.tensor([row.root_index for row in rows], device=roots.device)
        return batch_verification_inputs(roots, trees, positions, self.valid, dtype, size=size, layout=self.layout,
                                         prefix_indices=self.index, root_indices=indices, kv_len=self.kv_len)

    def keep(self, cache, acceptances: list[Acceptance], rows: list[Row]) -> None:
        """Each row keeps its root and accepted path (the verify forward put row b's root at
        ``length`` and its node i at ``length + 1 + i``); everything else of the step (rejected
        nodes, dummy rows) is dropped. rows: the step's rows, their roots not yet committed past."""
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
        steps = torch.arange(width, device=self.valid.device)[None, :]  # [1, width]
        self.valid = torch.cat([self.valid, steps < kept[:, None]], dim=1)
        if self.index is not None:  # the root's index, then one more per accepted node (holes: never read)
            roots = torch.tensor([row.root_index for row in rows], device=self.index.device)
            self.index = torch.cat([self.index, roots[:, None] + steps], dim=1)
        if self.kv_len is None and kv_cache.worth_compacting(self.valid):  # a static cache keeps its slots
            order = kv_cache.compact_rows(cache, self.valid)
            self.valid = self.valid.gather(1, order)
            self.index = None if self.index is None else self.index.gather(1, order)
        self.length = self.valid.shape[1]

    def select(self, cache, keep: list[int]) -> None:
        """Only rows ``keep`` go on; slots no remaining row uses leave the cache."""
        index = torch.tensor(keep, dtype=torch.long, device=self.valid.device)
        valid = self.valid[index]
        columns = torch.nonzero(valid.any(dim=0)).flatten()
        compact = len(columns) < valid.shape[1]
        kv_cache.select(cache, index, columns if compact else None)
        self.valid = valid[:, columns] if compact else valid
        if self.index is not None:
            self.index = self.index[index][:, columns] if compact else self.index[index]
        self.length = self.valid.shape[1]


def new_rows(input_ids: torch.Tensor, padding: Padding, settings: DecodeSettings) -> list[Row]:
    """One :class:`Row` per prompt ([B, T] long), each with its own budget policy."""
    new_policy = settings.new_policy or (lambda: FixedPolicy(settings.config))
    rows = [Row(b, input_ids[b], padding.left[b], settings.max_length, new_policy(), hidden=padding.hidden[b])
            for b in range(input_ids.shape[0])]
    for row in rows:
        row.stats.prompt_tokens = len(row.tokens)
    return rows


def new_tokens(acceptance: Acceptance, tokens: list[int], sequence: torch.Tensor) -> torch.Tensor:
    """[len(tokens)] the step's first tokens as ``sequence``'s kind of tensor: the walk's own copy on
    the device where it has one (no host-to-device copy), else made from the host ints."""
    on_device = acceptance.device_tokens
    if on_device is None:
        return torch.tensor(tokens, dtype=sequence.dtype, device=sequence.device)
    return on_device[:len(tokens)].to(sequence.device, sequence.dtype)


@dataclass(frozen=True)
class Drafted:
    """Step 1's trees, one per row still decoding, and what drafting them cost (the drafting is shared
    by the rows); step 5 records them with what each row's walk accepted (:meth:`row_stats`)."""

    builts: list[BuiltTree]
    trees: list[DraftTree]  # each on its row's device
    drafted: bool  # some row drafted (the drafter has a step to commit)
    forwards: int  # draft forwards of the step, every row's
    seconds: float  # the drafting phase
    root_seconds: list[float]  # each row's share of the drafter's catch-up call
    layers: list[list[LayerTiming]]  # each row's expand calls

    def row_stats(self, b: int, acceptance: Acceptance, emitted: int, verify_seconds: float) -> StepStats:
        """Row b's figures: its tree, what it accepted and emitted, its share (1/R) of the shared phases
        (``verify_seconds``: the verification forward and the walks)."""
        built, tree, share = self.builts[b], self.trees[b], 1.0 / len(self.trees)
        depth = acceptance.tree_depth if acceptance.tree_depth is not None else tree_depth(tree)
        expected = built.expected_length if built.expected_length is not None else tree.expected_length
        return StepStats(tree_size=len(tree), tree_depth=depth, expected_length=expected,
                         accepted=acceptance.accepted, emitted=emitted, draft_forwards=self.forwards,
                         draft_seconds=self.seconds * share, verify_seconds=verify_seconds * share,
                         tree=tree, accepted_nodes=list(acceptance.nodes), root_seconds=self.root_seconds[b],
                         layers=self.layers[b])


def tree_depth(tree: DraftTree) -> int:
    """The deepest node's depth (a host read)."""
    return int(tree.depths().max()) if len(tree) else 0


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
