#!/usr/bin/env bash
# Install (if needed) and run the whole test suite, the real SmolLM2 model included.
# OPTTREE_TRANSFORMERS=lowest OPTTREE_VENV=.venv-lowest bash scripts/test.sh: the same suite on the
# lowest transformers pyproject.toml supports (see scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "${OPTTREE_VENV:-.venv}/bin/python" -m pytest -q "$@"
