#!/usr/bin/env bash
# Create a venv and install opttree with what its tests, demo and benchmarks need.
# Idempotent: re-running it only re-installs when pyproject.toml, this script or the choice changed.
#   OPTTREE_VENV=<folder>            the venv (default .venv)
#   OPTTREE_TRANSFORMERS=lowest      transformers at pyproject's floor (default: the newest the range allows)
#   OPTTREE_TRANSFORMERS=<version>   that version
#   OPTTREE_TORCH=<version>          torch (default 2.13.0: the project's CPU machines take a local CPU build)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${OPTTREE_VENV:-.venv}
want_tf=${OPTTREE_TRANSFORMERS:-}
if [ "$want_tf" = lowest ]; then
  want_tf=$("$PY" - <<'PYEOF'
import re, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
print(next(re.search(r">=\s*([\w.]+)", d).group(1) for d in deps if d.startswith("transformers")))
PYEOF
)
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
stamp=$VENV/.opttree-installed
want=$( (sha1sum pyproject.toml scripts/setup.sh; echo "tf=$want_tf torch=${OPTTREE_TORCH:-}") | sha1sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q "torch==${OPTTREE_TORCH:-2.13.0}"
  "$VENV/bin/python" -m pip install -q -e ".[test,bench]" ${want_tf:+"transformers==$want_tf"}
  echo "$want" > "$stamp"
fi
