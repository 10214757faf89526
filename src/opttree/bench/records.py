"""What a benchmark records and sums up: one :class:`TurnRecord` per method and turn, one
:class:`Summary` per (category, method). Plain data, shared by the runner that makes the records,
the report that writes them and the plots that draw them: the runner imports the report, the report
the plots, all three this module, and this module none of them.

Definitions (Spec-Bench's, greedy, batch 1): see :mod:`opttree.bench.report`. A turn's ``verdict``
is :mod:`opttree.tools.ties`'s: ``equal`` (plain's tokens), ``tie`` (an output that leaves plain's only at
near-ties of the target's own scores, within the dtype's rounding, float32 included) or ``mismatch`` (an error).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Protocol

from ..tools.ties import Outcome

REFERENCE = "plain"  # the method every other one is checked against
EAGLE3_CHAINS = "vllm-eagle3"  # the engine's EAGLE-3 chains: one method "vllm-eagle3(k=K)" per k (bench.peers)
ALL = "all"  # the summary group over every category


@dataclass
class TurnRecord:
    """One method on one turn of one question (Spec-Bench's per-turn fields and ours)."""

    method: str
    question_id: int | str
    category: str
    group: str
    turn: int  # 0-based
    question_index: int  # position in the run (question ids need not be unique)
    prompt_tokens: int
    new_tokens: int
    wall_time: float  # seconds of the generate() call
    accept_lengths: list[int]  # tokens per decoding step (accepted + bonus)
    tokens: list[int] = field(default_factory=list)  # the new token ids
    text: str = ""
    matches_plain: bool | None = None  # the tokens equal plain's (None for the reference itself)
    first_mismatch: int | None = None  # index of the first new token that differs from plain's
    verdict: str | None = None  # "equal", "tie" or "mismatch" (opttree.tools.ties.Outcome); None for the reference
    ties: list[dict] = field(default_factory=list)  # each tie's step, expected, got, gap, bound (ties.Divergence)
    expected_lengths: list[float] = field(default_factory=list)  # opttree: E(A) of each step's tree
    accepted: list[int] = field(default_factory=list)  # opttree: draft tokens accepted per step
    tree_sizes: list[int] = field(default_factory=list)  # opttree: nodes verified per step
    draft_seconds: float | None = None  # opttree: time spent drafting
    verify_seconds: float | None = None  # opttree: time spent verifying
    graphs_compiled: int = 0  # graphs torch.compile made during this (timed) call: a recompile
    drafts: int | None = None  # an engine's chain: verifications of a draft (vLLM's own counter)
    accepted_per_pos: list[int] = field(default_factory=list)  # of those, how many accepted position i

    @property
    def steps(self) -> int:
        return len(self.accept_lengths)

    @property
    def mismatched(self) -> bool:
        return self.verdict == Outcome.MISMATCH


@dataclass(frozen=True)
class Summary:
    group: str
    method: str
    turns: int
    new_tokens: int
    wall_time: float
    tokens_per_second: float
    speedup: float  # Σ plain time / Σ method time
    median_speedup: float  # median over turns of plain time / method time
    tau: float  # mean tokens per decoding step
    step_cost: float  # mean time of one decoding step / plain's mean time per token: speedup = τ / step_cost
    equal: int  # turns whose tokens equal plain generate()'s
    ties: int  # turns that leave plain's tokens only at near-ties (any dtype; opttree.tools.ties)
    mean_expected_length: float | None = None  # opttree: mean E(A) per step
    mean_tree_size: float | None = None
    draft_share: float | None = None  # opttree: drafting time / (drafting + verifying)
    acceptance: tuple[float, ...] | None = None  # an engine's chain: Σ accepted at position i / Σ drafts
    drafts: int = 0  # an engine's chain: Σ verifications of a draft
    step_ms: float = float("nan")  # mean wall time of one decoding step (plain's: one token), prefill shared out
    draft_ms: float | None = None  # opttree: of which drafting, per step
    verify_ms: float | None = None  # opttree: of which the target's verification forward, per step

    @property
    def mean_acceptance_length(self) -> float | None:
        """vLLM's own figure: 1 + accepted draft tokens per draft (its prefill's token not counted)."""
        return None if self.acceptance is None else 1.0 + sum(self.acceptance)

    @property
    def mismatches(self) -> int:
        return self.turns - self.equal - self.ties

    @property
    def ok(self) -> bool:
        return self.mismatches == 0


def _summary(group: str, method: str, mine: list[TurnRecord], plain: dict) -> Summary:
    time_sum = sum(r.wall_time for r in mine)
    plain_sum = sum(plain[(r.question_index, r.turn)].wall_time for r in mine)
    tokens = sum(r.new_tokens for r in mine)
    steps = sum(r.steps for r in mine)
    plain_tokens = sum(plain[(r.question_index, r.turn)].new_tokens for r in mine)
    plain_per_token = plain_sum / plain_tokens if plain_tokens else float("nan")
    ratios = [plain[(r.question_index, r.turn)].wall_time / r.wall_time for r in mine if r.wall_time > 0]
    expected = [e for r in mine for e in r.expected_lengths]
    sizes = [s for r in mine for s in r.tree_sizes]
    draft = sum(r.draft_seconds or 0.0 for r in mine)
    drafts = sum(r.drafts or 0 for r in mine)
    positions = max((len(r.accepted_per_pos) for r in mine), default=0)
    accepted = [sum(r.accepted_per_pos[i] for r in mine if i < len(r.accepted_per_pos)) for i in range(positions)]
    verify = sum(r.verify_seconds or 0.0 for r in mine)
    return Summary(
        group=group, method=method, turns=len(mine), new_tokens=tokens, wall_time=time_sum,
        tokens_per_second=tokens / time_sum if time_sum > 0 else float("nan"),
        speedup=plain_sum / time_sum if time_sum > 0 else float("nan"),
        median_speedup=statistics.median(ratios) if ratios else float("nan"),
        tau=tokens / steps if steps else float("nan"),
        step_cost=time_sum / steps / plain_per_token if steps and plain_per_token > 0 else float("nan"),
        equal=sum(1 for r in mine if r.matches_plain is not False),
        ties=sum(1 for r in mine if r.verdict == Outcome.TIE),
        mean_expected_length=sum(expected) / len(expected) if expected else None,
        mean_tree_size=sum(sizes) / len(sizes) if sizes else None,
        draft_share=draft / (draft + verify) if draft + verify > 0 else None,
        acceptance=tuple(a / drafts for a in accepted) if drafts else None, drafts=drafts,
        step_ms=1e3 * time_sum / steps if steps else float("nan"),
        draft_ms=1e3 * draft / steps if steps and any(r.draft_seconds is not None for r in mine) else None,
        verify_ms=1e3 * verify / steps if steps and any(r.verify_seconds is not None for r in mine) else None,
    )


def summarise(records: list[TurnRecord], methods: list[str]) -> list[Summary]:
    """One Summary per (group, method), groups in first-seen order, then the ``all`` rows."""
    plain = {(r.question_index, r.turn): r for r in records if r.method == REFERENCE}
    groups = list(dict.fromkeys(r.group for r in records))
    out = []
    for group in groups + [ALL]:
        for method in methods:
            mine = [r for r in records if r.method == method and group in (ALL, r.group)]
            if mine:
                out.append(_summary(group, method, mine, plain))
    return out


class Results(Protocol):
    """What the plots read from a benchmark's result (:class:`~opttree.bench.report.BenchResult`)."""

    records: list[TurnRecord]
    methods: list[str]

    def summaries(self) -> list[Summary]:
        ...


def best_chain(summaries: list[Summary]) -> Summary | None:
    """The engine's EAGLE-3 chain (one k) of the highest speedup over every category, or None."""
    chains = [s for s in summaries if s.group == ALL and s.method.startswith(EAGLE3_CHAINS + "(")]
    return max(chains, key=lambda s: s.speedup if s.speedup == s.speedup else float("-inf"), default=None)


__all__ = ["ALL", "EAGLE3_CHAINS", "REFERENCE", "best_chain", "Results", "Summary", "TurnRecord", "summarise"]
