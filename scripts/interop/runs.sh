#!/usr/bin/env bash
# One engine's runs for scripts/interop.sh's vLLM check, one after another (under one CPU slot where the
# machine is shared): for every dtype, the exported head and its shifted-taps control.
#   runs.sh opttree|vllm PYTHON WORK_DIR K TOKENS DTYPE...   (vLLM's environment is set by the caller)
set -euo pipefail
engine=$1 py=$2 W=$3 k=$4 tokens=$5
shift 5
for dtype in "$@"; do
  for head in taps shifted; do
    out=$W/results/$engine-$head-$dtype
    if [ "$engine" = vllm ]; then
      "$py" scripts/interop/vllm_run.py "$W/smollm2" "$W/export-$head" "$W/prompts.json" "$dtype" "$k" "$tokens" \
        "$out.json" >"$out.log" 2>&1
    else
      "$py" scripts/interop/opttree_run.py run "$W/smollm2" "$W/export-$head" "$W/prompts.json" "$dtype" "$k" \
        "$tokens" "$out.json" 2>"$out.log"
    fi || { echo "$engine failed: see $out.log"; exit 1; }
  done
done
