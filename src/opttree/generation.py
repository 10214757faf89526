"""The speculative decoding loop, one function, in numbered steps.

Invariant at the top of every step: ``sequence`` = every committed token; the target's cache holds
all of them but the last one, the *root*, whose logits are computed by the step's verification
forward together with the tree's. The prompt's prefill therefore stops one token short, and the
first step verifies the prompt's last token together with the first tree.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from . import kv_cache
from .plan import BudgetPolicy, FixedPolicy
from .builder import BuiltTree
from .config import TreeConfig
from .drafters.clock import DraftClock
from .masks import verification_inputs
from .stats import GenerationStats, StepStats
from .tree import DraftTree
from .strategies import build_tree
from .stopping import StopRule
from .verify import greedy_choice, greedy_walk, sampled_choice, verify, with_rows

logger = logging.getLogger(__name__)


@dataclass
class DecodeResult:
    sequences: torch.Tensor  # [1, T + new] long
    stats: GenerationStats
    scores: tuple | None = None  # processed scores per new token, each [1, vocab]
    logits: tuple | None = None  # raw target logits per new token, each [1, vocab]


def target_forward(target, inputs, cache, drafter=None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One target forward over the root and the tree -> (logits [n + 1, vocab] float32, and for a
    drafter that wants the target's features, those features [n + 1, H]: ``drafter.features_from``
    of the hidden states, e.g. the last one, the input of the output head, or a fusion of layers)."""
    out = target(**inputs.as_kwargs(), past_key_values=cache, use_cache=True, logits_to_keep=0,
                 output_hidden_states=drafter is not None)
    return out.logits[0].float(), drafter.features_from(out.hidden_states) if drafter is not None else None


def tree_depth(tree: DraftTree) -> int:
    """The deepest node's depth (a host read)."""
    return int(tree.depths().max()) if len(tree) else 0


def node_choice(sequence: torch.Tensor, logits_processor, pick, generator=None):
    """verify()'s ``choose`` and ``process`` at the nodes of a tree hanging under ``sequence``
    ([T] long, every committed token: what generate()'s processors see as the context)."""

    def process(emitted: list[int], row: torch.Tensor) -> torch.Tensor:  # the node's processed scores
        context = torch.cat([sequence, torch.tensor(emitted, dtype=sequence.dtype, device=sequence.device)])
        return logits_processor(context[None, :], row[None, :])[0]

    def choose(emitted: list[int], row: torch.Tensor):
        scores = process(emitted, row)
        return pick(scores, generator), scores

    return choose, process


def speculative_decode(
    target,
    drafter,
    input_ids: torch.Tensor,  # [1, T] long
    cache,
    logits_processor,
    stopping_criteria,
    config: TreeConfig,
    *,
    max_length: int,
    context_length: int,
    do_sample: bool = False,
    streamer=None,
    generator: torch.Generator | None = None,
    output_scores: bool = False,
    output_logits: bool = False,
    policy: BudgetPolicy | None = None,
) -> DecodeResult:
    """policy: each step's tree budget (budget.py); default: ``config``'s fixed nodes and threshold.

    Host reads per step (greedy, no logits processors): one per drafted layer (the builder's
    threshold test), one for the walk (the accepted path, its pool ids and the emitted tokens),
    one in the drafter's commit; everything else stays on the devices."""
    policy = policy or FixedPolicy(config)
    timed = not isinstance(policy, FixedPolicy)  # "auto" learns from device times: sync to read them
    pick = sampled_choice if do_sample else greedy_choice
    fast_walk = not do_sample and len(logits_processor or []) == 0  # argmax over every node at once
    stop = StopRule.of(stopping_criteria)
    want_rows = output_scores or output_logits or stop.needs_scores
    sequence = input_ids[0]
    stats = GenerationStats(prompt_tokens=len(sequence))
    scores_out: list[torch.Tensor] = []
    logits_out: list[torch.Tensor] = []

    # 0. prefill the target with all prompt tokens but the root (a feature head drafter reads
    #    the target's features of every committed token)
    wants_hidden = bool(getattr(drafter, "wants_hidden_states", False))
    if len(sequence) > 1:
        out = target(input_ids=input_ids[:, :-1], past_key_values=cache, use_cache=True, logits_to_keep=1,
                     output_hidden_states=wants_hidden)
        if wants_hidden:
            drafter.add_features(drafter.features_from(out.hidden_states))  # [T - 1, H]
    past_len = len(sequence) - 1
    length = len(sequence)

    finished = False
    while not finished:
        # 1. draft a tree (not deeper than the tokens still allowed and the context)
        depth_cap = min(max_length - length - 1, context_length - length)
        t0 = time.perf_counter()
        forwards_before = getattr(drafter, "forwards", 0)
        plan = policy.plan()  # this step's nodes, threshold, layer width (and for "auto" its rules)
        clock = DraftClock(drafter, sync=timed)  # times the drafter's calls, whatever the drafter
        if depth_cap >= 1:
            root_probs = clock.root_probs(sequence)
            built = build_tree(root_probs, clock.expand, config, depth_cap, generator=generator, plan=plan)
        else:
            built = BuiltTree(DraftTree.empty(sequence.device), torch.empty(0, dtype=torch.long), depth_bound=0,
                              expected_length=0.0)
        tree = built.tree.to(sequence.device)
        t1 = time.perf_counter()

        # 2. verify: ONE target forward over the root and every tree node
        inputs = verification_inputs(sequence[-1:], tree, past_len, target.dtype)
        logits, hidden = target_forward(target, inputs, cache, drafter if wants_hidden else None)
        logits = logits.to(sequence.device)  # [n + 1, vocab], where generate() keeps ids

        # 3. walk the tree: the target's own token at the root and at each accepted node
        if fast_walk:
            acceptance = greedy_walk(tree, logits, built.pool_ids, built.depth_bound)
            if want_rows:
                with_rows(acceptance, logits)
        else:
            choose, process = node_choice(sequence, logits_processor, pick, generator)
            acceptance = verify(built, tree, logits, choose, config, process=process if do_sample else None,
                                generator=generator)
        t2 = time.perf_counter()

        # 4. keep only the root and the accepted path in both caches
        kv_cache.keep_slots(cache, past_len + 1, [past_len + 1 + i for i in acceptance.nodes])
        if depth_cap >= 1:
            pool_ids = acceptance.pool_ids
            if pool_ids is None:
                pool_ids = built.pool_ids[acceptance.nodes].tolist()
            drafter.commit(pool_ids)
        if wants_hidden:  # the features of the root and the accepted nodes
            rows = torch.tensor([0] + [1 + i for i in acceptance.nodes], device=hidden.device)
            drafter.add_features(hidden[rows])
        past_len += 1 + acceptance.accepted

        # 5. commit the new tokens, up to the first one after which a stopping criterion fires
        def ask(j: int) -> bool:  # generate()'s other criteria on the sequence ending with token j
            ids = torch.tensor(acceptance.tokens[:j + 1], dtype=sequence.dtype, device=sequence.device)
            context = torch.cat([sequence, ids])[None, :]
            return bool(stopping_criteria(context, acceptance.scores[j][None]).any())

        keep = stop.cut(length, acceptance.tokens, ask)
        finished = keep is not None
        new = acceptance.tokens if keep is None else acceptance.tokens[:keep]
        sequence = torch.cat([sequence, torch.tensor(new, dtype=sequence.dtype, device=sequence.device)])
        length += len(new)
        if output_scores:  # kept only on request: a [vocab] row per token adds up over long runs
            scores_out.extend(row[None] for row in acceptance.scores[:len(new)])
        if output_logits:
            logits_out.extend(row[None] for row in acceptance.logits[:len(new)])
        if not finished and length > context_length:
            logger.warning("stopped at the model's context length (%d tokens)", context_length)
            finished = True
        if streamer is not None:
            streamer.put(torch.tensor(new, dtype=torch.long))
        stats.new_tokens += len(new)
        stats.steps.append(StepStats(
            tree_size=len(tree),
            tree_depth=acceptance.tree_depth if acceptance.tree_depth is not None else tree_depth(tree),
            expected_length=built.expected_length if built.expected_length is not None else tree.expected_length,
            accepted=acceptance.accepted,
            emitted=len(new),
            draft_forwards=getattr(drafter, "forwards", 0) - forwards_before,
            draft_seconds=t1 - t0,
            verify_seconds=t2 - t1,
            tree=tree,
            accepted_nodes=list(acceptance.nodes),
            root_seconds=clock.root_seconds,
            layers=clock.layers,
        ))
        policy.observe(stats.steps[-1])  # what the step cost ("auto" refreshes its latency model)

    if streamer is not None:
        streamer.end()
    return DecodeResult(
        sequences=sequence[None, :],
        stats=stats,
        scores=tuple(scores_out) if output_scores else None,
        logits=tuple(logits_out) if output_logits else None,
    )
