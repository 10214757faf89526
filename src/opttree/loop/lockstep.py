"""Run one tree builder per batch row in lockstep, so that a layer's draft forward serves every row.

A tree builder (tree/strategies.py) grows its tree as a generator: it yields each draft request
``(pool, frontier)`` and is sent the draft's answer before it decides on the next layer. With a
batch, each row has its own builder, yet all rows should share ONE draft forward per layer.
:func:`run_in_lockstep` advances the builders one at a time, in row order (so the result, and the
order of draws from a shared ``torch.Generator``, is deterministic), each until it asks for its
next layer or returns; one batched call then answers every builder that asked. A builder that
finishes early simply drops out. Everything runs in the caller's thread, under its grad and
inference modes; one row is the same loop with one builder.
"""

from __future__ import annotations

from typing import Any, Callable, Generator, Sequence


def run_in_lockstep(builders: Sequence[Generator[Any, Any, Any]], answer_all: Callable[[list], list]) -> list:
    """builders[i]: a generator that yields its requests (``answer = yield request``) and returns its result.

    answer_all: [each builder's request, None for one that has returned] -> [each one's answer, None
    where it asked nothing]: one call per round while any builder waits (a :class:`DrafterRows`'
    ``expand`` has this shape). Returns the builders' results in order. A builder's error propagates
    after every builder still waiting is closed.
    """
    results: list = [None] * len(builders)
    requests: list = [None] * len(builders)
    answers: list = [None] * len(builders)
    waiting = list(range(len(builders)))
    try:
        while waiting:
            for i in waiting:
                try:
                    requests[i] = builders[i].send(answers[i])
                except StopIteration as done:
                    results[i], requests[i] = done.value, None
            waiting = [i for i in waiting if requests[i] is not None]
            if waiting:
                answers = answer_all(list(requests))
    finally:
        for builder in builders:  # a no-op for those that returned
            builder.close()
    return results
