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
from .budget import BudgetPolicy, FixedPolicy
from .builder import BuiltTree
from .config import TreeConfig
from .drafters.clock import DraftClock
from .masks import verification_inputs
from .stats import GenerationStats, StepStats
from .tree import DraftTree
from .strategies import build_tree
from .verify import greedy_choice, sampled_choice, verify

logger = logging.getLogger(__name__)


@dataclass
class DecodeResult:
    sequences: torch.Tensor  # [1, T + new] long
    stats: GenerationStats
    scores: tuple | None = None  # processed scores per new token, each [1, vocab]
    logits: tuple | None = None  # raw target logits per new token, each [1, vocab]


def target_forward(target, inputs, cache, hidden: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One target forward over the root and the tree -> (logits [n + 1, vocab] float32, and with
    ``hidden`` its features [n + 1, H]: the last hidden state, the input of its output head)."""
    out = target(**inputs.as_kwargs(), past_key_values=cache, use_cache=True, logits_to_keep=0,
                 output_hidden_states=hidden)
    return out.logits[0].float(), out.hidden_states[-1][0] if hidden else None


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
    """policy: each step's tree budget (budget.py); default: ``config``'s fixed nodes and threshold."""
    policy = policy or FixedPolicy(config)
    pick = sampled_choice if do_sample else greedy_choice
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
            drafter.add_features(out.hidden_states[-1][0])  # [T - 1, H]
    past_len = len(sequence) - 1

    finished = False
    while not finished:
        # 1. draft a tree (not deeper than the tokens still allowed and the context)
        depth_cap = min(max_length - len(sequence) - 1, context_length - len(sequence))
        t0 = time.perf_counter()
        forwards_before = getattr(drafter, "forwards", 0)
        plan = policy.plan()  # this step's nodes, threshold, layer width (and for "auto" its rules)
        clock = DraftClock(drafter)  # times the drafter's calls, whatever the drafter
        if depth_cap >= 1:
            root_probs = clock.root_probs(sequence)
            built = build_tree(root_probs, clock.expand, config, depth_cap, generator=generator, plan=plan)
        else:
            built = BuiltTree(DraftTree.empty(sequence.device), torch.empty(0, dtype=torch.long))
        tree = DraftTree(built.tree.tokens.to(sequence.device), built.tree.parents.to(sequence.device),
                         built.tree.path_probs)
        t1 = time.perf_counter()

        # 2. verify: ONE target forward over the root and every tree node
        inputs = verification_inputs(int(sequence[-1]), tree, past_len, target.dtype)
        logits, hidden = target_forward(target, inputs, cache, wants_hidden)
        logits = logits.to(sequence.device)  # [n + 1, vocab], where generate() keeps ids

        # 3. walk the tree: the target's own token at the root and at each accepted node
        choose, process = node_choice(sequence, logits_processor, pick, generator)
        acceptance = verify(built, tree, logits, choose, config, process=process if do_sample else None,
                            generator=generator)
        t2 = time.perf_counter()

        # 4. keep only the root and the accepted path in both caches
        kv_cache.keep_slots(cache, past_len + 1, torch.tensor(acceptance.nodes, dtype=torch.long) + past_len + 1)
        if depth_cap >= 1:
            drafter.commit([int(built.pool_ids[i]) for i in acceptance.nodes])
        if wants_hidden:  # the features of the root and the accepted nodes
            drafter.add_features(hidden[torch.tensor([0] + [1 + i for i in acceptance.nodes], device=hidden.device)])
        past_len += 1 + acceptance.accepted

        # 5. commit the new tokens one by one until a stopping criterion fires
        new = []
        for token, scores, row in zip(acceptance.tokens, acceptance.scores, acceptance.logits):
            sequence = torch.cat([sequence, torch.tensor([token], dtype=sequence.dtype, device=sequence.device)])
            new.append(token)
            if output_scores:  # kept only on request: a [vocab] row per token adds up over long runs
                scores_out.append(scores[None])
            if output_logits:
                logits_out.append(row[None])
            if bool(stopping_criteria(sequence[None, :], scores[None]).any()):
                finished = True
                break
        if not finished and len(sequence) > context_length:
            logger.warning("stopped at the model's context length (%d tokens)", context_length)
            finished = True
        if streamer is not None:
            streamer.put(torch.tensor(new, dtype=torch.long))
        stats.new_tokens += len(new)
        stats.steps.append(StepStats(
            tree_size=len(tree),
            tree_depth=int(tree.depths().max()) if len(tree) else 0,
            expected_length=tree.expected_length,
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
