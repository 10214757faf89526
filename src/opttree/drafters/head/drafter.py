"""The per-call drafter of a head (:mod:`opttree.drafters.head.feature_head` and :mod:`.eagle` hold the
weights): :class:`FeatureHeadDrafter` runs every forward through the one step of
:mod:`opttree.drafters.head.graph` on a KV cache of fixed size, eagerly at each forward's own width,
or (:meth:`FeatureHeadDrafter.compiled`, where the target's verification compiles) compiled on
padded widths over the whole buffer, so that shapes repeat. The real rows' q is the same either way."""

from __future__ import annotations

import torch

from ...hf.compiled import MIN_SLOTS, cache_slots
from ...tree.draft_probs import DraftProbs
from ...tree.draft_tree import DraftTree
from ...tree.sizes import padded_size
from ..base import Drafter, ToProbs
from .graph import HeadBuffers, HeadSteps
from ..model import on


class FeatureHeadDrafter(Drafter):
    """Drafts trees with a head (:class:`~opttree.drafters.head.base.DraftHead`: opttree's FeatureHead or an
    EAGLE head); one instance per generate() call and batch row. ``steps``: the head's step, eager
    (the default) or compiled (:meth:`compiled`); ``slots``: its cache's first size."""

    wants_hidden_states = True  # the generation loop calls add_features with the target's features
    context_length = None  # RoPE: no limit of its own

    def __init__(self, head, to_probs: ToProbs | None = None, steps: HeadSteps | None = None, slots: int = MIN_SLOTS):
        self.head = head
        self.to_probs = to_probs  # full logits [k, V] -> probabilities; None: softmax (fast path)
        self.steps = HeadSteps() if steps is None else steps
        self.buffers = HeadBuffers.allocate(head, slots)
        self.cached = 0  # entries 0..cached-1 of the buffers hold committed tokens (true target features)
        # the fed features of entries cached, cached + 1, ...: opttree's head starts with a zero feature
        # for the first token, an EAGLE head with the first token's feature (DraftHead.first_entry)
        self.pending = torch.zeros(1 - head.first_entry, head.c.hidden_size, device=head.device)
        self.fed = torch.empty(0, dtype=torch.long, device=head.device)  # [f] pool id of each tree entry (slots cached..cached+f-1)
        self.predicted = torch.zeros(1, head.c.hidden_size, device=head.device)  # [1 + m, H]: g of the root (row 0) and of pool node p (row 1 + p, once fed)
        self.root_position = 0
        self.forwards = 0

    def bind(self, target, to_probs: ToProbs | None) -> "FeatureHeadDrafter":
        """A fresh drafter on the same head and step, checked to fit ``target``; sampling:
        ``to_probs`` turns the head's full logits into its q."""
        self.head.check_fits(target)
        return FeatureHeadDrafter(self.head, to_probs or self.to_probs, self.steps, self.buffers.slots)

    def fresh(self) -> "FeatureHeadDrafter":
        return FeatureHeadDrafter(self.head, self.to_probs, self.steps, self.buffers.slots)

    def compiled(self, compile_config, room: int) -> "FeatureHeadDrafter":
        """This head drafting with its step compiled with ``compile_config``, on a cache of
        :func:`~opttree.hf.compiled.cache_slots` ``(room)`` slots (see :mod:`.graph`)."""
        if self.steps.compiles:
            return self
        return FeatureHeadDrafter(self.head, self.to_probs, HeadSteps.of(compile_config), cache_slots(room))

    def modules(self) -> list[torch.nn.Module]:
        return [] if self.steps.compiles else [self.head]  # compiled, its linears are the compiler's

    def features_from(self, hidden_states: tuple) -> torch.Tensor:
        """The target's ``output_hidden_states`` (each [1, T, H]) -> what :meth:`add_features` takes,
        [T, H]: the head's ``feature_layers`` fused (the last hidden state itself for a plain head)."""
        with torch.inference_mode():
            return self.head.target_features(hidden_states)[0]

    def add_features(self, features: torch.Tensor) -> None:
        """The target's features [m, H] of the next m committed positions."""
        self.pending = torch.cat([self.pending, features.to(self.pending.device, self.pending.dtype)])

    def _forward(self, prefill: bool, features, tokens, positions, slots, visible) -> tuple[torch.Tensor, torch.Tensor]:
        """[w, H], [w], [w], [w], [w, n] -> (g [w, H], logits over the kept tokens [w, K]): one
        :func:`~opttree.drafters.head.graph.head_step`, eager for the prefill."""
        head = self.head
        with torch.inference_mode():
            out = self.steps(prefill, head, self.buffers.keys, self.buffers.values, head.output_rows(), head.out_bias,
                             features, tokens, positions, slots, visible)
        self.forwards += 1
        return out

    def width(self, rows: int, prefill: bool = False) -> int:
        """A forward's width for ``rows`` real rows: its own eagerly (and for the prefill), padded
        to a verification size compiled."""
        return padded_size(rows) if self.steps.compiles and not prefill else rows

    def entries(self, sequence: torch.Tensor) -> tuple[int, int]:
        """The committed ``sequence`` -> (the first token index to feed, how many): entry e is token
        e + first_entry (DraftHead.first_entry), at rotary position e."""
        start = self.cached + self.head.first_entry
        q = len(sequence) - start
        if q > len(self.pending):
            raise AssertionError("the feature head lacks target features for committed tokens; this is a bug")
        return start, q

    def nothing_to_read(self) -> torch.Tensor:
        """An EAGLE head before its first entry (a one-token prompt has no feature yet): the root's
        children drafted from a zero feature (any q is lossless; the next step reads the target's)."""
        self.predicted = self.pending.new_zeros(1, self.head.c.hidden_size)
        self.root_position = self.cached - 1
        return self._probs(self.predicted).full()[0]

    def root_probs(self, sequence: torch.Tensor) -> torch.Tensor:
        start, q = self.entries(sequence)
        self.fed = self.fed[:0]
        if q == 0:
            return self.nothing_to_read()
        cached = self.cached
        w = self.width(q, prefill=cached == 0)  # the prompt: at its own length
        self.buffers = self.buffers.holding(cached + w, cached)
        ids = self.buffers.slot_ids
        slots = ids[cached:cached + w]  # [w]
        positions = slots.clamp(max=cached + q - 1)  # [w]: pad rows repeat the last committed token (not a view of slots: no aliased inputs)
        tokens, features = on(sequence[start:], self.head.device), self.pending[:q]  # [q], [q, H]
        if self.steps.compiles:  # pad rows; and no views among the inputs, whose storage offsets dynamo guards
            rows = positions - cached  # [w]
            tokens, features = tokens.index_select(0, rows), features.index_select(0, rows)
        visible = ids[None] <= positions[:, None]  # [w, S]: causal over the committed slots
        g, logits = self._forward(cached == 0, features, tokens, positions, slots, visible)
        self.cached = cached + q
        self.pending = self.pending[q:]
        self.root_position = cached + q - 1
        self.predicted = g[q - 1:q].clone()  # a compiled run's outputs may be overwritten by the next run
        return self.probs_of(logits[q - 1:q]).full()[0]

    def _probs(self, g: torch.Tensor) -> DraftProbs:
        """Predicted features [k, H] -> the draft's q (:meth:`probs_of`)."""
        return self.probs_of(self.head.reduced_logits(g))

    def probs_of(self, small: torch.Tensor) -> DraftProbs:
        """Logits over the kept tokens [k, K] -> the draft's q, float32: over the K kept tokens (the
        others have q = 0) or, with sampling's warpers, over the whole vocabulary."""
        if self.to_probs is not None:
            return DraftProbs.dense(self.to_probs(self.head.spread(small)))
        return DraftProbs(torch.softmax(small, dim=-1, dtype=torch.float32), self.head.token_ids, self.head.c.vocab_size)

    def predicted_feature(self, pool_id: int) -> torch.Tensor:
        """[H]: the head's predicted feature g of pool node ``pool_id`` fed this step (-1: the root)."""
        return self.predicted[1 + pool_id]

    def expand(self, pool: DraftTree, frontier: torch.Tensor) -> torch.Tensor:
        """frontier: [k] long pool ids -> [k, vocab] (:meth:`expand_probs` over the whole vocabulary)."""
        return self.expand_probs(pool, frontier).full()

    def expand_probs(self, pool: DraftTree, frontier: torch.Tensor) -> DraftProbs:
        """frontier: [k] long pool ids -> their children's q over the kept tokens, from one forward of
        ``width(k)`` rows; no host read. Each node reads its parent's predicted feature and sees the
        cached entries and its ancestors' tree entries."""
        frontier = on(frontier, self.head.device)
        k, f, cached = frontier.shape[0], self.fed.shape[0], self.cached
        w = self.width(k)
        self.buffers = self.buffers.holding(cached + f + w, cached + f)
        padded = frontier if w == k else torch.cat([frontier, frontier[:1].expand(w - k)])  # [w] pool ids
        features = self.predicted.index_select(0, pool.parents.index_select(0, padded) + 1)  # [w, H] the parents' g
        ancestors = pool.ancestor_mask().index_select(0, padded)  # [w, m]
        columns = torch.cat([self.fed, frontier])  # [f + k] pool ids of the tree entries after this forward
        visible = torch.nn.functional.pad(ancestors.index_select(1, columns), (cached, 0), value=True)  # [w, cached + f + k]
        visible = torch.nn.functional.pad(visible, (0, self.buffers.slots - cached - f - k), value=False)  # [w, S]
        positions = ancestors.sum(dim=1) + self.root_position  # depth = ancestors, self included
        slots = self.buffers.slot_ids[cached + f:cached + f + w]
        g, logits = self._forward(False, features, pool.tokens.index_select(0, padded), positions, slots, visible)
        self.fed = columns
        if w > k:
            g, logits = g[:k], logits[:k]
        self._store_predicted(len(pool), frontier, g)
        return self.probs_of(logits)

    def _store_predicted(self, nodes: int, frontier: torch.Tensor, g: torch.Tensor) -> None:
        """Row 1 + p of ``predicted`` takes pool node p's g ([k] ids, [k, H]); room for every one of the
        pool's ``nodes`` (twice what is short: not a pad per layer)."""
        if self.predicted.shape[0] < 1 + nodes:
            grow = max(1 + nodes, 2 * self.predicted.shape[0]) - self.predicted.shape[0]
            self.predicted = torch.nn.functional.pad(self.predicted, (0, 0, 0, grow))
        self.predicted[1:].index_copy_(0, frontier, g)

    def commit(self, accepted_pool_ids: list[int]) -> None:
        # Tree entries read predicted features: their slots past ``cached`` stay unseen until overwritten.
        # The accepted tokens are fed again, with the target's features, by the next root_probs.
        self.fed = self.fed[:0]


__all__ = ["FeatureHeadDrafter"]
