"""Run one tree builder per batch row in lockstep, so that a layer's draft forward serves every row.

A tree builder (tree/strategies.py) calls ``expand(pool, frontier)`` and waits for the draft's answer
before it decides on the next layer. With a batch, each row has its own builder, yet all rows
should share ONE draft forward per layer. :func:`run_in_lockstep` runs the builders as coroutines
(each on its own thread, but only ever one at a time, in row order, so the result — and the order
of draws from a shared ``torch.Generator`` — is deterministic): when every unfinished builder
waits in ``expand``, one batched call answers all their requests; a builder that finishes early
simply drops out. The builders themselves are unchanged.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

import torch


class _Aborted(Exception):
    """Raised inside a waiting builder when the lockstep gives up (another one failed)."""


class _Task:
    """One builder on its own thread; ``go`` hands it control, ``back`` hands control back."""

    def __init__(self, fn: Callable[[Callable[[Any], Any]], Any], inference: bool, grad: bool):
        self.fn, self.inference, self.grad = fn, inference, grad
        self.go, self.back = threading.Semaphore(0), threading.Semaphore(0)
        self.request = self.answer = self.result = self.error = None
        self.finished = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.go.acquire()
        if self.answer is _Aborted:  # given up before it started
            return
        try:  # grad and inference mode are thread-local: take the caller's
            with torch.inference_mode(self.inference), torch.set_grad_enabled(self.grad):
                self.result = self.fn(self.call)
        except BaseException as error:  # handed to the caller
            self.error = error
        self.finished = True
        self.back.release()

    def call(self, request):
        """The builder's side: post a request, wait for the batched answer."""
        self.request = request
        self.back.release()
        self.go.acquire()
        if self.answer is _Aborted:
            raise _Aborted()
        answer, self.answer = self.answer, None
        return answer

    def resume(self) -> None:
        """The caller's side: let the task run until its next request or its end."""
        self.go.release()
        self.back.acquire()


def run_in_lockstep(tasks: Sequence[Callable[[Callable[[Any], Any]], Any]],
                    answer_all: Callable[[list], list]) -> list:
    """tasks[i](call) -> result_i, where ``call(request)`` blocks until ``answer_all`` has answered it.

    answer_all: [request of each waiting task, in task order] -> [answer of each], one call per
    round, while any task waits. Returns the tasks' results in order; re-raises a task's error.
    """
    if len(tasks) == 1:  # nothing to synchronise
        return [tasks[0](lambda request: answer_all([request])[0])]
    inference, grad = torch.is_inference_mode_enabled(), torch.is_grad_enabled()
    live = [_Task(fn, inference, grad) for fn in tasks]
    all_tasks = list(live)
    try:
        while live:
            for task in live:
                task.resume()
                if task.error is not None:
                    raise task.error
            live = [task for task in live if not task.finished]
            if live:
                answers = answer_all([task.request for task in live])
                for task, answer in zip(live, answers):
                    task.answer = answer
    except BaseException:
        for task in all_tasks:  # unblock every waiting builder so that its thread ends
            if not task.finished:
                task.answer = _Aborted
                task.go.release()
        raise
    return [task.result for task in all_tasks]
