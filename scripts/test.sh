#!/usr/bin/env bash
# Install (if needed) and run the whole test suite, the real SmolLM2 model included.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"
