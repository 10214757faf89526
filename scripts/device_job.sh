#!/usr/bin/env bash
# What a lent GPU machine runs once `scripts/device_kit.py assemble` has put the kit in place (the
# last call of `device_kit.py pack`'s plan runs one job; later calls, while the machine is warm,
# run others with no carry):
#   bash scripts/device_job.sh tests   -m gpu, then -m real_model; output in $OUT/tests.log.
#                                      One call; cut at the time limit (the log says where).
#   bash scripts/device_job.sh bench   Spec-Bench, 13 categories x 1 question, 64 tokens, bf16 on cuda, on
#                                      SmolLM2 inflated to a 7 B's cost (smollm2:7b) then SmolLM2-135M itself:
#                                      plain eager and compiled, HF assisted eager and compiled, opttree
#                                      default and compiled at nodes 16 and 32 (records streamed as each
#                                      turn is judged). $OUT/bench.log, bench-summary.md, bench.tar.gz. One
#                                      call; each target gets its share of the time left.
#                                      OPTTREE_BENCH_TARGETS / _DEVICE / _DTYPE / _METHODS / _EXTRA override (the CPU
#                                      dry run of tests/test_device_kit.py).
#   bash scripts/device_job.sh round [eagle3|head]
#                                      round-gpu-eagle3.toml (default: an EAGLE-3 folder) or round-gpu.toml (opttree's
#                                      feature head), in ONE call, everything in memory
#                                      (python -m opttree.distill.recipes.resident): the target's answers to the kit's
#                                      prompts (round-prompts.jsonl.gz, from `device_kit.py pack --job round`),
#                                      their features, the stages; the round gets the job's time less 45 s and
#                                      ends with a head however far it got. $OUT/round.log and head-next.tar.gz
#                                      (the head's files and round.json: each step's seconds, tokens and rates);
#                                      a model.safetensors over 15 MiB comes back in pieces, model.safetensors.partNN.
# Device time: 15 minutes per task, all calls together (the machine's start, idle waits and the
# copies included). Each job stops itself after OPTTREE_JOB_SECONDS (default 420 s: the kit's carry
# calls, one job and a rerun of a short one fit), and its log comes back inside the tool's 10-minute call.
# The tool brings back at most 8 files of $OUT (16 MiB each): folders go back as one .tar.gz each.
# Environment: the wheels in $OPTTREE_SITE (/tmp/site) ahead of the device's own packages; the GGUF
# where opttree.smollm2 looks ($OPTTREE_CACHE/smollm2); Spec-Bench's questions from the kit.
set -euo pipefail
cd "$(dirname "$0")/.."
KIT=${OPTTREE_KIT:-/tmp/opttree-kit}
SITE=${OPTTREE_SITE:-/tmp/site}
OUT=${OUT:-$KIT/out}
LIMIT=${OPTTREE_JOB_SECONDS:-420}  # device_kit.py's JOB_SECONDS
CATEGORIES=writing,roleplay,reasoning,math,coding,extraction,stem,humanities,translation,summarization,qa,math_reasoning,rag
job=${1:-}
# `round`'s recipes: eagle3 (the default, issue 51.c: a head vLLM and SGLang serve) or head (opttree's feature head);
# both answer the same prompts (one seed and source), so one kit serves either
declare -A ROUND_RECIPES=([eagle3]=drafts/smollm2-135m-head/round-gpu-eagle3.toml [head]=drafts/smollm2-135m-head/round-gpu.toml)

die() { echo "device_job.sh: error: $*" >&2; exit 2; }
case "$job" in tests|bench|round) ;; *) die "usage: bash scripts/device_job.sh tests|bench|round [eagle3|head]" ;; esac
[ -f "$KIT/assembled.json" ] || die "no assembled kit in $KIT (the machine went cold, or assemble did not run): \
run device_kit.py's calls again from call 1 (python scripts/device_kit.py commands)"
export PYTHONPATH="$SITE:$PWD/src" OPTTREE_CACHE="$KIT/opttree-cache" OPTTREE_SPEC_BENCH="$KIT/spec_bench_questions.jsonl"
mkdir -p "$OUT"
deadline=$((SECONDS + LIMIT))
left() { echo $((deadline > SECONDS + 5 ? deadline - SECONDS : 5)); }
versions() {
  python3 -c 'import sys, torch, transformers, gguf; print("python", sys.version.split()[0], "| torch", torch.__version__,
"| transformers", transformers.__version__, "from", transformers.__file__, "| gguf", gguf.__file__,
"| cuda:", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")'
}
has_matplotlib() { python3 -c 'import matplotlib' 2>/dev/null; }

case "$job" in
tests)
  log=$OUT/tests.log
  versions | tee "$log"
  skip=()
  if ! has_matplotlib; then  # tests/test_bench.py and test_notebook.py import it at module level
    skip=(--ignore=tests/test_bench.py --ignore=tests/test_notebook.py)
    echo "no matplotlib here: ${skip[*]}" | tee -a "$log"
  fi
  rc_gpu=0 rc_real=0
  timeout -s INT -k 30 "$(left)" python3 -m pytest -q -m gpu "${skip[@]}" tests/ 2>&1 | tee -a "$log" || rc_gpu=$?
  timeout -s INT -k 30 "$(left)" python3 -m pytest -q -m "real_model and not gpu" "${skip[@]}" tests/ 2>&1 \
    | tee -a "$log" || rc_real=$?
  echo "tests: -m gpu exit $rc_gpu, -m real_model exit $rc_real (124: stopped at the time limit)" | tee -a "$log"
  [ "$rc_gpu" = 0 ] && [ "$rc_real" = 0 ]
  ;;
bench)
  [ -f "$OPTTREE_SPEC_BENCH" ] || die "no Spec-Bench questions in the kit: pack found none (pack --questions PATH)"
  plots=()
  has_matplotlib || plots=(--no-plots)
  read -r -a targets <<< "${OPTTREE_BENCH_TARGETS:-smollm2:7b smollm2}"
  read -r -a extra <<< "${OPTTREE_BENCH_EXTRA:-}"
  rm -rf "$KIT"/bench-*
  versions | tee "$OUT/bench.log"
  rc=0 i=0
  for target in "${targets[@]}"; do
    share=$(( $(left) / (${#targets[@]} - i) )); i=$((i + 1))
    name=bench-${target//[^a-z0-9]/-}
    echo "== $target: $share s" | tee -a "$OUT/bench.log"
    # --assistant: HF assisted generation needs a whole draft model; the feature head cannot be one
    timeout "$share" python3 -m opttree.bench --target "$target" --questions "$OPTTREE_SPEC_BENCH" \
      --draft drafts/smollm2-135m-head --assistant drafts/smollm2-135m-draft \
      --dtype "${OPTTREE_BENCH_DTYPE:-bfloat16}" --device "${OPTTREE_BENCH_DEVICE:-cuda}" \
      --methods "${OPTTREE_BENCH_METHODS:-plain,plain-compiled,assisted,assisted-compiled,opttree}" \
      --opttree nodes=16,compiled=1 --opttree nodes=32,compiled=1 \
      --categories "$CATEGORIES" --per-category 1 --max-turns 1 --max-new-tokens 64 --out "$KIT/$name" \
      --no-progress "${plots[@]}" "${extra[@]}" 2>&1 | tee -a "$OUT/bench.log" || rc=$?
    [ ! -f "$KIT/$name/summary.md" ] || { echo "# $target"; cat "$KIT/$name/summary.md"; } >> "$OUT/bench-summary.md"
  done
  (cd "$KIT" && ls -d bench-* >/dev/null 2>&1) && tar -czf "$OUT/bench.tar.gz" -C "$KIT" $(cd "$KIT" && ls -d bench-*)
  echo "bench: exit $rc (1: an output differed from plain greedy; 124: stopped at the time limit; records.partial.jsonl keeps a cut-off run's turns)" | tee -a "$OUT/bench.log"
  exit "$rc"
  ;;
round)
  [ -f "$KIT/round-prompts.jsonl.gz" ] || die "no round prompts in the kit: pack it with \
\`python scripts/device_kit.py pack --job round\` and make its calls again from call 1"
  recipe=${ROUND_RECIPES[${2:-eagle3}]:-}
  [ -n "$recipe" ] || die "bash scripts/device_job.sh round [eagle3|head]: no round '$2'"
  versions | tee "$OUT/round.log"
  echo "round: $recipe" | tee -a "$OUT/round.log"
  rc=0
  budget=$(( $(left) - 45 ))  # the round's own clock; the rest packs what comes back
  timeout "$(left)" python3 -m opttree.distill.recipes.resident --recipe "$recipe" \
    --prompts "$KIT/round-prompts.jsonl.gz" --out "$KIT/head-next" --device cuda --seconds "$budget" 2>&1 \
    | tee -a "$OUT/round.log" || rc=$?
  [ "$rc" = 0 ] || { echo "round: exit $rc (124: stopped at the time limit)" | tee -a "$OUT/round.log"; exit "$rc"; }
  files=()
  for f in config.json opttree_draft.json training.json round.json; do
    [ -f "$KIT/head-next/$f" ] && files+=("head-next/$f"); done
  size=$(stat -c %s "$KIT/head-next/model.safetensors")
  if [ "$size" -le $((15 * 1024 * 1024)) ]; then files+=(head-next/model.safetensors); else
    # over what one file brings back (16 MiB): in pieces of 15 MiB beside the tar, joined here with cat
    split -b $((15 * 1024 * 1024)) -d "$KIT/head-next/model.safetensors" "$OUT/model.safetensors.part"
    echo "round: model.safetensors is $size bytes (sha256 $(sha256sum "$KIT/head-next/model.safetensors" | cut -c1-64)):" \
      "in $(ls "$OUT" | grep -c '^model.safetensors.part') pieces; cat model.safetensors.part* > head-next/model.safetensors" \
      | tee -a "$OUT/round.log"; fi
  tar -czf "$OUT/head-next.tar.gz" -C "$KIT" "${files[@]}"
  echo "round: done; $OUT/head-next.tar.gz holds ${files[*]}" | tee -a "$OUT/round.log"
  ;;
esac
