#!/usr/bin/env bash
# Install (if needed) and run the whole test suite, the real SmolLM2 model included.
# OPTTREE_TRANSFORMERS=lowest OPTTREE_VENV=.venv-lowest bash scripts/test.sh: the same suite on the
# lowest transformers pyproject.toml supports (see scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# One pytest worker per core (at most 4), each file on one worker (a file's real-model fixtures load once):
# the suite's tests run one thread each, so 2 cores run it in about half the time of one process. Files go out
# in collection order, the longest first (tests/conftest.py: LONGEST_FILES), not xdist's most-tests-first.
# OPTTREE_TEST_WORKERS=0 runs it in this process (no xdist), e.g. under a debugger.
workers=${OPTTREE_TEST_WORKERS:-$("${OPTTREE_VENV:-.venv}/bin/python" -c 'import os; print(max(1, min(4, len(os.sched_getaffinity(0)))))')}
exec "${OPTTREE_VENV:-.venv}/bin/python" -m pytest -q -n "$workers" --dist loadfile --no-loadscope-reorder "$@"
