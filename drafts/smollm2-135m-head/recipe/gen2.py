"""More, more varied self-distillation data (no Spec-Bench text): a bf16 target answers
(1) templates x topics (built-in + random whole-word vocabulary tokens),
(2) "Translate German to English:" over real German UI strings (gettext catalogues on this machine),
(3) summarise / answer / extract over long local English documents (/usr/share/doc, pydoc topics),
then (4) tasks over its own answers."""
import logging, random, sys, torch
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
torch.set_num_threads(2)
from pathlib import Path
from opttree.distill import prompts as P
from opttree.distill.data import DataConfig, generate_round, load_round
from opttree.smollm2 import load_smollm2
from local_texts import english_documents, german_strings
seed, n = int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
t, tok = load_smollm2(dtype=torch.bfloat16)
words = sorted(w[1:] for w in tok.get_vocab() if w.startswith("Ġ") and w[1:].isalpha() and len(w) >= 7 and w[1].islower())
rng.shuffle(words)
P.TOPICS = P.TOPICS + words[:3000]
first = P.seed_prompts(n, seed)
# German
german = german_strings()
rng.shuffle(german)
for i in range(n // 4):
    passage = " ".join(german[3 * i: 3 * i + rng.randint(1, 3)])
    first.append(P.Prompt(f"Translate German to English: {passage}", "de-en"))
# long English documents
docs = english_documents()
rng.shuffle(docs)
for i in range(n // 3):
    d = docs[i % len(docs)]
    start = rng.randrange(max(1, len(d) - 2500))
    text = d[start:start + rng.randint(1200, 2500)].strip()
    first.append(P.Prompt(rng.choice(P.CONTEXT_TEMPLATES).format(text=text), "doc"))
rng.shuffle(first)
print(len(first), "round-1 prompts;", len(german), "German strings;", len(docs), "documents", flush=True)
cfg = DataConfig(max_new_tokens=128, batch_size=32, topk=16, max_prompt_tokens=768)
out = Path(sys.argv[1])
generate_round(t, tok, first, out / "round1", cfg)
recs = load_round(out / "round1")
answered = [(P.Prompt(r["prompt"], r["kind"]), r["text"]) for r in recs]
generate_round(t, tok, P.context_prompts(answered, n // 3, seed), out / "round2", cfg)
