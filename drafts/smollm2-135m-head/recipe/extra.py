"""Extra feature data: Python reference topics (pydoc_data) and stdlib code, chat-wrapped."""
import logging, random, glob, os, torch
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
torch.set_num_threads(2)
import pydoc_data.topics as T
from opttree.distill.features import extract_features
from opttree.smollm2 import load_smollm2
rng = random.Random(0)
def chunks(text, size=1500):
    paras, out, cur = text.split("\n\n"), [], ""
    for p in paras:
        if len(cur) + len(p) > size and cur:
            out.append(cur.strip()); cur = ""
        cur += p + "\n\n"
    if cur.strip(): out.append(cur.strip())
    return [c for c in out if len(c) > 300]
items = []
for name, text in T.topics.items():
    for c in chunks(text):
        items.append((f"Explain the Python topic '{name}'.", c))
rng.shuffle(items); items = items[:150]
libdir = os.path.dirname(os.__file__)
files = sorted(glob.glob(libdir + "/*.py")); rng.shuffle(files)
code = []
for f in files[:80]:
    src = open(f, errors="ignore").read()
    cs = chunks(src, 1200)
    if cs: code.append((f"Show me part of the Python module {os.path.basename(f)[:-3]}.", "```python\n" + rng.choice(cs) + "\n```"))
items += code[:150]
t, tok = load_smollm2()
seqs = []
for q, a in items:
    ids = tok.apply_chat_template([{"role": "user", "content": q}, {"role": "assistant", "content": a}], tokenize=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    seqs.append(torch.tensor(ids[:768]))
rng.shuffle(seqs)
print(len(seqs), sum(len(s) for s in seqs))
extract_features(t, seqs, '/work/cache/eagle/features_extra', topk=16, shard_size=32)
