#!/usr/bin/env bash
# Create .venv and install opttree with what its tests, demo and benchmarks need.
# Idempotent: re-running it only re-installs when pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=.venv/.opttree-installed
want=$(sha1sum pyproject.toml scripts/setup.sh | sha1sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  # torch 2.13.0: on the project's CPU machines pip takes a local CPU build; elsewhere PyPI's.
  .venv/bin/python -m pip install -q "torch==${OPTTREE_TORCH:-2.13.0}"
  .venv/bin/python -m pip install -q -e ".[test,bench]"
  echo "$want" > "$stamp"
fi
