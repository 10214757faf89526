"""Threads for the tests that run the real model: two, or this worker's share of the cores.

Tiny-model tests run on one thread (conftest.py). The real-model tests take up to two; under
pytest-xdist (scripts/test.sh runs one worker per core) each worker takes only its share of the
cores, so that workers never ask for more threads than the machine has (an oversubscribed
2-core machine ran tiny models ~13x slower).
"""

from __future__ import annotations

import os


def real_model_threads() -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    return max(1, min(2, cores // max(workers, 1)))
