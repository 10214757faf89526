"""Greedy equality up to rounding: EQUAL, a near-TIE of the target's own scores, or a MISMATCH.

The verification forward (n tokens at once) and plain decoding's one-token forward multiply
different numbers of rows and sum in different orders, so the same logit may differ in its last
bits between the two, in every floating dtype: bfloat16 and float16 by a few units of their coarse
rounding, float32 by a few of its fine one. Where plain's top two scores are that close the argmax
may fall the other way (HF's own assisted generation leaves plain's output at the same float32
near-tie). The rule (DESIGN.md, *Lossless up to rounding*), the same in every dtype: an output is
correct when it equals plain's, or equals it up to its first divergence and there the token it
chose scores within :func:`tie_bound` of plain's own token in plain's OWN scores at that step (the
scores plain generate() took its argmax over). The bound is ``TIE_EPS_MULTIPLE * eps(dtype) *
max|score|``: two logits, each within two roundings at the largest logit's scale (what
``tests/test_devices.py`` pins for tree-vs-path logits in half precision); eps(float32) = 2^-23
makes it 65,536 times tighter than bfloat16's.

:func:`classify` is the pure rule on given scores; :func:`plain_greedy` produces plain's tokens and
scores with ``generate()`` itself; :func:`check_greedy` applies the rule with a model and also
checks the continuation after each tie (the target's own greedy from the diverged context).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Callable, Sequence

import torch

__all__ = ["Divergence", "Outcome", "PlainGreedy", "TIE_EPS_MULTIPLE", "Verdict", "check_greedy", "classify",
           "first_divergence", "gap_in_ulps", "plain_greedy", "tie_bound"]

TIE_EPS_MULTIPLE = 4.0  # a tie's gap is at most this many eps(dtype) at the largest |score|


class Outcome(str, Enum):
    EQUAL = "equal"  # token for token plain's output
    TIE = "tie"  # diverged only where plain's own scores were within the bound
    MISMATCH = "mismatch"  # diverged anywhere else: an error

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Divergence:
    """Where an output first leaves plain greedy's, and by how much plain preferred its own token."""

    step: int  # index of the first new token that differs
    expected: int | None  # plain's token there (None: plain had stopped)
    got: int | None  # the checked output's token (None: it had stopped)
    gap: float | None  # plain's score of ``expected`` minus its score of ``got`` (None: a token is missing)
    bound: float  # the largest gap a tie may have at this step

    def describe(self) -> str:
        text = f"new token {self.step}: plain {self.expected}, got {self.got}"
        if self.expected is None or self.got is None:
            return text + " (a length difference)"
        return text if self.gap is None else text + f", gap {self.gap:.3g} (tie bound {self.bound:.3g})"


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    ties: tuple[Divergence, ...] = ()  # every divergence explained as a near-tie, in order
    mismatch: Divergence | None = None  # the divergence that is not one

    @property
    def ok(self) -> bool:
        return self.outcome is not Outcome.MISMATCH

    def describe(self) -> str:
        parts = [f"tie at {t.describe()}" for t in self.ties]
        if self.mismatch is not None:
            parts.append(f"{'then ' if self.ties else ''}at {self.mismatch.describe()}")
        return f"{self.outcome}" + (": " + "; ".join(parts) if parts else "")


@dataclass(frozen=True)
class PlainGreedy:
    """Plain greedy generate() on one prompt: its new tokens and the scores it chose them from."""

    tokens: list[int]
    scores: list[torch.Tensor]  # one [vocab] float32 row per new token, after the logits processors


def tie_bound(scores: torch.Tensor, dtype: torch.dtype, eps_multiple: float = TIE_EPS_MULTIPLE) -> float:
    """The largest score gap that rounding in ``dtype`` may close. scores: [vocab], one step's.

    ``eps_multiple * eps(dtype) * max|finite score|`` (eps * max is one to two units in the last
    place at that scale), for every floating dtype (float32: eps = 2^-23)."""
    finite = scores[torch.isfinite(scores)]
    scale = float(finite.abs().max()) if finite.numel() else 0.0
    return eps_multiple * torch.finfo(dtype).eps * scale


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first position where two token lists differ (None if equal)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def divergence_at(step: int, plain: Sequence[int], other: Sequence[int], scores: Sequence[torch.Tensor] | None,
                  dtype: torch.dtype, eps_multiple: float = TIE_EPS_MULTIPLE) -> Divergence:
    """The divergence at ``step``, with plain's gap there (scores[step]: [vocab] plain's scores;
    None: no gap)."""
    expected = plain[step] if step < len(plain) else None
    got = other[step] if step < len(other) else None
    if expected is None or got is None or scores is None:
        return Divergence(step, expected, got, None, 0.0)
    row = scores[step].to(torch.promote_types(scores[step].dtype, torch.float32))  # [vocab], float64 kept
    gap = float(row[expected] - row[got])
    if gap < 0:
        raise ValueError(f"at new token {step} plain chose {expected} but its scores prefer {got}: "
                         "these are not the scores plain chose from")
    return Divergence(step, expected, got, gap, tie_bound(row, dtype, eps_multiple))


def is_tie(divergence: Divergence) -> bool:
    return divergence.gap is not None and divergence.gap <= divergence.bound


def classify(plain: Sequence[int], other: Sequence[int], scores: Sequence[torch.Tensor] | None,
             dtype: torch.dtype, eps_multiple: float = TIE_EPS_MULTIPLE) -> Verdict:
    """The rule, on plain greedy's new tokens, the checked output's new tokens and plain's scores.

    scores: plain's per-step [vocab] rows (scores[t] is what plain took token t's argmax over:
    generate()'s ``scores`` with ``output_scores=True``; its ``logits`` where no logits processor
    applies), or None where none were kept (then no divergence can be shown to be a tie);
    dtype: the target's. A length difference with no token difference is a MISMATCH (the two
    stopped at different places)."""
    step = first_divergence(plain, other)
    if step is None:
        return Verdict(Outcome.EQUAL)
    divergence = divergence_at(step, plain, other, scores, dtype, eps_multiple)
    if is_tie(divergence):
        return Verdict(Outcome.TIE, ties=(divergence,))
    return Verdict(Outcome.MISMATCH, mismatch=divergence)


def plain_greedy(model, input_ids: torch.Tensor, **generate_kwargs) -> PlainGreedy:
    """Run plain greedy ``model.generate()`` on one unpadded prompt (input_ids: [1, T] long) and
    keep the scores of each step, exactly the ones generate() chose from. generate_kwargs: as for
    generate() (``max_new_tokens``, ...); decoding is greedy and the attention mask all ones
    whatever they say."""
    if input_ids.shape[0] != 1:
        raise ValueError(f"plain_greedy takes one prompt, got {input_ids.shape[0]}")
    kwargs = {**generate_kwargs, "attention_mask": torch.ones_like(input_ids), "do_sample": False,
              "output_scores": True, "return_dict_in_generate": True}
    with torch.no_grad():
        out = model.generate(input_ids, **kwargs)
    tokens = out.sequences[0, input_ids.shape[1]:].tolist()
    return PlainGreedy(tokens, [s[0] for s in out.scores])


def _eos_ids(model, generate_kwargs: dict) -> set[int]:
    eos = generate_kwargs.get("eos_token_id", model.generation_config.eos_token_id)
    if eos is None:
        return set()
    return {int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])}


def check_greedy(model, input_ids: torch.Tensor, tokens: Sequence[int], *, max_new_tokens: int,
                 max_ties: int = 8, eps_multiple: float = TIE_EPS_MULTIPLE, plain: PlainGreedy | None = None,
                 rerun: Callable[[torch.Tensor, int], PlainGreedy] | None = None, **generate_kwargs) -> Verdict:
    """Check ``tokens`` (the new tokens of a greedy output for the prompt input_ids [1, T]) against
    the target ``model``'s own greedy decoding, in the model's dtype.

    First :func:`classify` against plain greedy generate(). At a tie, the output has left plain's
    context, so what follows is checked against plain greedy from the output's own prefix up to and
    including the tied token, again by the rule, and so on: every divergence must be a tie, up to
    ``max_ties`` of them (more: a MISMATCH, as a run of "ties" is no longer rounding). A tied EOS
    token ends the check. plain: plain's run on input_ids if already made (e.g. by a benchmark). rerun(prefix
    [1, T'] long, n): plain greedy from ``prefix`` for n new tokens, as :func:`plain_greedy` runs it (the default);
    a benchmark passes one that keeps its runs, so that methods parting from plain at the same ties share them."""
    dtype = model.dtype
    tokens = list(tokens)
    eos = _eos_ids(model, generate_kwargs)
    if rerun is None:
        def rerun(prefix: torch.Tensor, n: int) -> PlainGreedy:
            return plain_greedy(model, prefix, max_new_tokens=n, **generate_kwargs)
    plain = plain or rerun(input_ids, max_new_tokens)
    done, ties = 0, []  # tokens already checked; the ties found so far
    while True:
        verdict = classify(plain.tokens, tokens[done:], plain.scores, dtype, eps_multiple)
        found = [shift(t, done) for t in verdict.ties]
        if verdict.outcome is not Outcome.TIE:
            mismatch = None if verdict.mismatch is None else shift(verdict.mismatch, done)
            outcome = Outcome.MISMATCH if mismatch is not None else Outcome.TIE if ties else Outcome.EQUAL
            return Verdict(outcome, tuple(ties), mismatch)
        ties += found
        tie = found[0]
        done = tie.step + 1
        if len(ties) > max_ties:
            return Verdict(Outcome.MISMATCH, tuple(ties[:-1]), tie)
        if tie.got in eos or done >= max_new_tokens:
            if done < len(tokens):  # went on after its last allowed token
                return Verdict(Outcome.MISMATCH, tuple(ties), Divergence(done, None, tokens[done], None, 0.0))
            return Verdict(Outcome.TIE, tuple(ties))
        agreed = torch.tensor([tokens[:done]], dtype=input_ids.dtype, device=input_ids.device)  # [1, done]
        prefix = torch.cat([input_ids, agreed], 1)  # [1, T + done]
        plain = rerun(prefix, max_new_tokens - done)


def shift(divergence: Divergence, offset: int) -> Divergence:
    """The same divergence, its step counted from ``offset`` tokens earlier."""
    return Divergence(divergence.step + offset, divergence.expected, divergence.got, divergence.gap, divergence.bound)


def gap_in_ulps(gap: float, scores: torch.Tensor, dtype: torch.dtype) -> float:
    """A gap in units in the last place of ``dtype`` at the largest |score|'s scale (for reports)."""
    scale = float(scores[torch.isfinite(scores)].abs().max())
    ulp = torch.finfo(dtype).eps * 2.0 ** math.floor(math.log2(scale)) if scale > 0 else torch.finfo(dtype).tiny
    return gap / ulp
