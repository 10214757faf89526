"""opttree's side of scripts/interop.sh's vLLM check (run in opttree's venv).

  opttree_run.py target FOLDER
      SmolLM2-135M-Instruct written as a plain HF folder (no GGUF) that vLLM serves
  opttree_run.py shift HEAD TARGET BY
      rewrites the EAGLE-3 folder HEAD's config.json to tap the layers BY above the default ones (2, L//2, L-3),
      in its documented field eagle_config.eagle_aux_hidden_state_layer_ids: the control
  opttree_run.py prompts TARGET QUESTIONS.jsonl N OUT.json
      the first turns of N Spec-Bench questions (two per task, in turn) as chat-template token ids
  opttree_run.py run TARGET HEAD PROMPTS.json DTYPE K MAX_TOKENS OUT.json
      greedy decoding of each prompt with HEAD as a chain of K nodes (strategy="chain", nodes=K); the
      acceptance at position i is the share of the steps that drafted a token there whose first i + 1 draft
      tokens were accepted (GenerationStats.steps[*].tree_size and .accepted), as vLLM's accepted at
      position i / drafts; written per prompt. (opttree drafts the first new token too, vLLM does not.)"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import opttree
from opttree.bench.questions import load_questions, prompt_ids, select_questions


def target(folder: str) -> int:
    try:
        from opttree.smollm2 import save_smollm2  # opttree's own (issue 57, item 2), where this tree has it
    except ImportError:
        save_smollm2 = None
    if save_smollm2 is not None:
        save_smollm2(folder)
        return 0
    from opttree.smollm2 import load_smollm2

    model, tokenizer = load_smollm2()  # dequantised from GGUF, copied into a fresh model without quantization_config
    config = type(model.config).from_dict({k: v for k, v in model.config.to_dict().items()
                                           if k not in ("quantization_config", "_name_or_path")})
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict())
    plain.generation_config = model.generation_config
    plain.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return 0


def shift(head: str, target_dir: str, by: str) -> int:
    from transformers import AutoConfig

    from opttree.drafters.head.eagle import default_taps

    layers = AutoConfig.from_pretrained(target_dir).num_hidden_layers
    path = Path(head) / "config.json"
    config = json.loads(path.read_text())
    config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [t + int(by) for t in default_taps(layers)],
                              "use_aux_hidden_state": True}
    path.write_text(json.dumps(config, indent=2))
    return 0


def prompts(target: str, questions: str, n: str, out_file: str) -> int:
    tokenizer = AutoTokenizer.from_pretrained(target)
    chosen = select_questions(load_questions(questions), per_category=2)[: int(n)]
    json.dump([prompt_ids(tokenizer, q.turns[:1], []) for q in chosen], open(out_file, "w"))
    return 0


def run(target_dir: str, head: str, prompts_file: str, dtype: str, k: str, max_tokens: str, out_file: str) -> int:
    torch.set_num_threads(1)
    torch_dtype = getattr(torch, dtype)
    target = opttree.speculative(AutoModelForCausalLM.from_pretrained(
        target_dir, dtype=torch_dtype, attn_implementation="sdpa").eval())
    draft = opttree.load_draft(head, target, dtype=torch_dtype)  # the draft in the target's dtype, as vLLM runs it
    k_nodes, drafts, accepted, outputs = int(k), [], [], []
    for ids in json.load(open(prompts_file)):
        out = target.generate(torch.tensor([ids]), draft_model=draft, strategy="chain", nodes=k_nodes,
                              do_sample=False, max_new_tokens=int(max_tokens), return_dict_in_generate=True)
        steps = out.stats.steps  # near max_new_tokens the chain is cut short (tree_size < K, the last one 0)
        drafts.append([sum(s.tree_size > i for s in steps) for i in range(k_nodes)])
        accepted.append([sum(s.accepted > i for s in steps) for i in range(k_nodes)])
        outputs.append(out.sequences[0, len(ids):].tolist())
    report = {"engine": "opttree", "dtype": dtype, "k": k_nodes, "drafts": drafts, "accepted_per_pos": accepted,
              "outputs": outputs}  # per prompt
    json.dump(report, open(out_file, "w"))
    return 0


if __name__ == "__main__":
    sys.exit({"target": target, "shift": shift, "prompts": prompts, "run": run}[sys.argv[1]](*sys.argv[2:]))
