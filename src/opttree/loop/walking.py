"""The loop's step 3: each row's walk over its tree, the target's own token at the root and at each
accepted node, with generate()'s processors on the row's own context (:mod:`opttree.verify` walks)."""

from __future__ import annotations

import torch

from ..tree.builder import BuiltTree
from ..tree.draft_tree import DraftTree
from ..verify.walk import Acceptance, greedy_choice, greedy_walk, sampled_choice, verify, with_rows
from .rows import Row
from .settings import DecodeSettings


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


__all__ = ["node_choice", "walker"]
