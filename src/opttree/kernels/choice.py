"""Which kernel each product key takes under ``OPTTREE_LINEAR=auto``: timed in two rounds, stock always
among the candidates.

A key is (dtype, torch threads, rows, out, in): every row count has its own choice, so a kernel that
wins at 4 rows is never used at 1 row unless it also won there. For each key:

0. **a row count that may not recur** (above ONCE_ROWS and no power of two: a prompt's prefill,
   mostly) takes stock, untimed, until it meets a weight a second time: a one-off's trials and
   packed copies would be pure cost. Powers of two (the sizes verification forwards are padded to,
   plain decoding's 1 row) and small row counts are tried at their first meeting;
1. **first trials**: the candidates take turns, one timed product each, until each has TRIALS;
   the fastest median becomes the key's *provisional* kernel (it serves the key from then on), stock
   unless the fastest is clearly faster (:func:`clearly_faster`: median STOCK_MARGIN lower, and no
   trial of it as slow as any of stock's);
2. **the re-check, after warm-up**: once the provisional kernel has met every weight of the key (it
   meets one a second time: the layers come round again, so a oneDNN kernel has packed each) and
   at least RECHECK_AFTER products have gone through the kernels since, every candidate is timed
   TRIALS times again, and the fastest median of this round alone is the key's final kernel. A
   packed candidate is re-timed only on a weight packed before (``ready``): a copy packed right
   before its product would be hot in the cache, which decoding never sees. A candidate that finds
   no such weight within the round's budget (RECHECK_BUDGET) is left out of the re-check; stock
   needs nothing and is always timed.

A weight too big for any cache (``in_place``) runs each round's trials back to back at one product.
A candidate that raises is dropped for its key (stock, the caller's own error, is never dropped).
The bookkeeping is under one lock: decodes in several threads share it; the final choices are read
without it on the hot path (one dict read). Times come from the chooser's ``clock`` (a declared
parameter, ``time.perf_counter`` by default): the tests give it a fake clock that their fake kernels
advance, so no choice test depends on this machine's speed or load.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

Key = tuple[torch.dtype, int, int, int, int]  # (dtype, torch threads, rows, out, in)

TRIALS = 3  # timed products of each candidate per key and round
RECHECK_AFTER = 64  # products through the kernels, at least, between a key's provisional choice and its re-check
RECHECK_BUDGET = 8  # the re-check ends after this many products per candidate and trial, complete or not
ONCE_ROWS = 8  # row counts above this that are no power of two wait for their second meeting
STOCK_MARGIN = 0.05  # another kernel replaces stock only where its median is this much below stock's, at least


def tried_at_first_meeting(rows: int) -> bool:
    """Whether a key of ``rows`` rows starts its trials at its first product (else at its second meeting)."""
    return rows <= ONCE_ROWS or rows & (rows - 1) == 0


def clearly_faster(kernel: list[float], stock: list[float]) -> bool:
    """Whether ``kernel``'s trials beat ``stock``'s beyond a shared machine's noise: its median at least
    STOCK_MARGIN lower, and its slowest trial faster than stock's fastest (the two never overlap)."""
    return statistics.median(kernel) <= (1 - STOCK_MARGIN) * statistics.median(stock) and max(kernel) < min(stock)


def pick(times: dict[str, list[float]]) -> str:
    """The kernel with the lowest median time (ties: the earlier candidate), but stock unless that one
    is :func:`clearly_faster` than stock: medians of TRIALS products on a shared machine move by more
    than STOCK_MARGIN, two kernels within noise of each other (bfloat16 on an AVX-512 CPU, where stock
    is oneDNN's matmul too) would be chosen by chance, and stock is what runs without opttree."""
    best = min(times, key=lambda name: statistics.median(times[name]))
    if best != "stock" and "stock" in times and not clearly_faster(times[best], times["stock"]):
        return "stock"
    return best


def trial_order(times: dict[str, list[float]], names: tuple[str, ...]) -> list[str]:
    """``names`` still short of TRIALS timed products, fewest first (candidates' order on ties)."""
    short = [n for n in names if len(times.get(n, ())) < TRIALS]
    return sorted(short, key=lambda name: len(times.get(name, ())))


def round_done(times: dict[str, list[float]], names: tuple[str, ...]) -> bool:
    return not trial_order(times, names)


def recheck_due(products: int, since: int, met_again: bool) -> bool:
    """Whether a key chosen provisionally when the product count was ``since`` is due its re-check at
    ``products``, its provisional kernel meeting a weight it met before (``met_again``) or not."""
    return met_again and products - since >= RECHECK_AFTER


@dataclass
class Provisional:
    """A key's kernel between its first trials and its re-check."""

    name: str
    since: int  # the product count when it was chosen
    met: set[int] = field(default_factory=set)  # ids of the weights it has served


@dataclass
class Round:
    """One key's trials in progress: ``second`` is the re-check; ``serving`` the kernel that takes a
    product no candidate can be timed on (the provisional one, during the re-check)."""

    second: bool = False
    serving: str = "stock"
    times: dict[str, list[float]] = field(default_factory=dict)
    products: int = 0  # products of the key in this round


class Chooser:
    """The kernel choices of one process (see the module docstring). ``run(name)`` computes the
    product with kernel ``name`` (raising if it cannot); ``ready(name, second)`` says whether ``name``
    can be timed on this product now (a oneDNN candidate packs its weight there in the first round,
    and in the re-check only takes one packed before). ``clock`` times the trials: seconds, any origin."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self.lock = threading.Lock()
        self.chosen: dict[Key, str] = {}  # final choices: the hot path reads this dict alone
        self.provisional: dict[Key, Provisional] = {}
        self.rounds: dict[Key, Round] = {}
        self.dropped: dict[Key, set[str]] = {}
        self.waiting: dict[Key, set[int]] = {}  # keys met once so far: ids of the weights met (see 0.)
        self.products = 0  # products through the kernels (auto), counted approximately under threads
        self.undecided = 0  # products of keys without a final kernel (trials, provisional), as approximately

    # -- what the process has chosen

    def decisions(self) -> dict[Key, str]:
        """The kernel each key takes now: final or provisional."""
        with self.lock:
            return {**{k: p.name for k, p in self.provisional.items()}, **self.chosen}

    def final(self) -> dict[Key, str]:
        with self.lock:
            return dict(self.chosen)

    def settled(self) -> bool:
        """No key still trying or waiting for its re-check (a row count met once takes stock: settled)."""
        with self.lock:
            return not self.rounds and not self.provisional

    def forget(self) -> None:
        with self.lock:
            self.chosen.clear()
            self.provisional.clear()
            self.rounds.clear()
            self.dropped.clear()
            self.waiting.clear()

    # -- a product of a key without a final choice

    def product(self, key: Key, names: tuple[str, ...], run: Callable[[str], torch.Tensor],
                ready: Callable[[str, bool], bool], weight: int, in_place: bool = False) -> torch.Tensor:
        """One product of ``key`` on the weight whose id is ``weight``: by the key's provisional kernel,
        or a trial (see the module docstring)."""
        with self.lock:
            self.undecided += 1
            serving = self._serving(key, weight)
        if serving is not None:
            return run(serving)
        out, timed = self._trial_once(key, names, run, ready)
        while in_place and timed and key in self.rounds:  # a weight from memory every time: the round now
            timed = self._trial_once(key, names, run, ready)[1]
        if in_place and not timed:  # the same weight next time: what cannot be timed now never will
            with self.lock:
                self._close_if_over_budget(key, names, self.rounds.get(key), now=True)
        return out

    def _serving(self, key: Key, weight: int) -> str | None:
        """The kernel that takes this product untimed, or None for a trial; starts the re-check when due. Under lock."""
        if key in self.chosen:
            return self.chosen[key]
        provisional = self.provisional.get(key)
        if provisional is not None:
            if not recheck_due(self.products, provisional.since, weight in provisional.met):
                provisional.met.add(weight)
                return provisional.name
            del self.provisional[key]
            self.rounds[key] = Round(second=True, serving=provisional.name)
        elif key not in self.rounds and not tried_at_first_meeting(key[2]):
            met = self.waiting.setdefault(key, set())
            if weight not in met:
                met.add(weight)
                return "stock"
            del self.waiting[key]
        self.rounds.setdefault(key, Round())
        return None

    def _left(self, key: Key, names: tuple[str, ...]) -> tuple[str, ...]:
        gone = self.dropped.get(key, ())
        return tuple(n for n in names if n not in gone)

    def _trial_once(self, key: Key, names: tuple[str, ...], run, ready) -> tuple[torch.Tensor, bool]:
        """(the product, whether a candidate was timed or dropped on it)."""
        with self.lock:
            state = self.rounds.get(key)
            if state is None:  # another thread finished the round meanwhile
                provisional = self.provisional.get(key)
                return run(self.chosen.get(key) or (provisional.name if provisional else "stock")), False
            state.products += 1
            order = trial_order(state.times, self._left(key, names))
            second = state.second
        name = next((n for n in order if ready(n, second)), None)
        if name is None:  # the re-check: the candidates left cannot be timed on this product
            with self.lock:
                self._close_if_over_budget(key, names, state)
            return run(state.serving), False
        start = self.clock()
        try:
            out = run(name)
        except (RuntimeError, NotImplementedError):  # a kernel this CPU, build or shape cannot run after all
            if name == "stock":
                raise  # what F.linear itself raises (mixed dtypes, wrong shapes): the caller's error
            with self.lock:
                self.dropped.setdefault(key, set()).add(name)
                if self.rounds.get(key) is state:
                    self._close_if_done(key, names, state)
            return run("stock"), True
        seconds = self.clock() - start
        with self.lock:
            if self.rounds.get(key) is state:  # not finished by another thread meanwhile
                state.times.setdefault(name, []).append(seconds)
                self._close_if_done(key, names, state)
        return out, True

    def _close_if_done(self, key: Key, names: tuple[str, ...], state: Round) -> None:
        left = self._left(key, names)
        if round_done(state.times, left):
            self._close(key, {n: state.times[n] for n in left}, state)

    def _close_if_over_budget(self, key: Key, names: tuple[str, ...], state: Round | None,
                              now: bool = False) -> None:
        """End ``state``'s round with the candidates timed TRIALS times, once past its budget (or ``now``)."""
        left = self._left(key, names)
        if state is None or self.rounds.get(key) is not state:
            return
        if now or state.products >= RECHECK_BUDGET * TRIALS * len(left):
            self._close(key, {n: t for n in left if len(t := state.times.get(n, ())) >= TRIALS}, state)

    def _close(self, key: Key, times: dict[str, list[float]], state: Round) -> None:
        del self.rounds[key]
        name = pick(times) if times else "stock"
        if state.second:
            self.chosen[key] = name
        else:
            self.provisional[key] = Provisional(name, self.products)


__all__ = ["ONCE_ROWS", "RECHECK_AFTER", "RECHECK_BUDGET", "STOCK_MARGIN", "TRIALS", "Chooser", "Key", "Provisional", "Round",
           "clearly_faster", "pick", "recheck_due", "round_done", "trial_order", "tried_at_first_meeting"]
