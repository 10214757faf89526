"""More, more varied self-distillation data (no Spec-Bench text): a bf16 target answers
(1) templates x topics (built-in + random whole-word vocabulary tokens),
(2) "Translate German to English:" over real German UI strings (gettext catalogues on this machine),
(3) summarise / answer / extract over long local English documents (/usr/share/doc, pydoc topics),
then (4) tasks over its own answers."""
import glob, gettext, gzip, logging, random, sys, torch
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
torch.set_num_threads(2)
from pathlib import Path
import pydoc_data.topics as T
from opttree.distill import prompts as P
from opttree.distill.data import DataConfig, generate_round, load_round
from opttree.smollm2 import load_smollm2
seed, n = int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
t, tok = load_smollm2(dtype=torch.bfloat16)
words = sorted(w[1:] for w in tok.get_vocab() if w.startswith("Ġ") and w[1:].isalpha() and len(w) >= 7 and w[1].islower())
rng.shuffle(words)
P.TOPICS = P.TOPICS + words[:3000]
first = P.seed_prompts(n, seed)
# German
german = []
for f in sorted(glob.glob("/usr/share/locale/de/LC_MESSAGES/*.mo")):
    try:
        cat = gettext.GNUTranslations(open(f, "rb"))._catalog
    except Exception:
        continue
    german += [v for k, v in cat.items() if isinstance(v, str) and len(v.split()) >= 6 and "%" not in v and "\n" not in v.strip()]
rng.shuffle(german)
for i in range(n // 4):
    passage = " ".join(german[3 * i: 3 * i + rng.randint(1, 3)])
    first.append(P.Prompt(f"Translate German to English: {passage}", "de-en"))
# long English documents
docs = []
for f in sorted(glob.glob("/usr/share/doc/**/*", recursive=True)):
    p = Path(f)
    if not p.is_file() or p.stat().st_size < 3000 or "copyright" in p.name or "changelog" in p.name.lower():
        continue
    try:
        text = (gzip.open(p, "rt", errors="ignore") if p.suffix == ".gz" else open(p, errors="ignore")).read()
    except Exception:
        continue
    if sum(c.isalpha() or c.isspace() for c in text[:3000]) > 0.85 * 3000:
        docs.append(text)
docs += list(T.topics.values())
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
