#!/usr/bin/env bash
# Install (if needed) and run the demo: speculative generation on the real SmolLM2 target.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python examples/demo.py "$@"
