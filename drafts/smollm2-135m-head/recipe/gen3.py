"""Round 3 of self-distillation data for the SmolLM2 feature head (no Spec-Bench text).

A bf16 target answers, greedily, prompts built on this machine:
- the library's templates x topics (built-in topics + whole-word vocabulary tokens, new seed);
- extra templates written for this round: roleplay personas, logic puzzles, multi-step word
  problems, short factual questions, "explain this code" over local Python stdlib functions,
  JSON extraction and question answering over local documents;
- "Translate German to English:" over German gettext strings of this machine;
- summarise / extract / answer over pieces of local English documents.
Prompts are answered in parts of 512 (part_00, part_01, ...) so that a run stopped early still
holds a mix of every kind. Usage: gen3.py OUT_DIR SEED N_PARTS
"""
import logging, random, sys, torch
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
torch.set_num_threads(2)
from pathlib import Path
from opttree.distill.data import DataConfig, generate_round
from opttree.smollm2 import load_smollm2
from mix import Mix

out, seed, parts = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
t, tok = load_smollm2(dtype=torch.bfloat16)
mix = Mix(tok, rng)
prompts = [mix.part(k, seed) for k in range(parts)]
print(parts, "parts of 512 prompts;", len(mix.funcs), "functions,", len(mix.german), "German strings,", len(mix.docs), "documents", flush=True)
cfg = DataConfig(max_new_tokens=128, batch_size=64, topk=16, max_prompt_tokens=640)
for k, part in enumerate(prompts):
    generate_round(t, tok, part, out / f"part_{k:02d}", cfg)
