"""Round 5 on one GPU (an H100 lent for a session): many more, and more varied, texts.

``gen``: a bf16 target on the GPU
- stage 0: answers the meta prompts of prompts5.py (news reports, reference passages, questions);
- stage 1: answers the mix prompts and tasks built on stage 0's texts: "Summarize: <report>",
  headlines, names/places/dates as JSON, "<passage>\\n<question>" (RAG-style), the questions alone;
- saves every text (chat prompt + greedy answer, cut at EOS) to WORK/texts5.npz (uint16).
Prompts are answered in shuffled chunks, so a run stopped by its deadline keeps a mix.

``train``: an fp32 target on the GPU extracts features of these texts and of the earlier
rounds' (OLD_IDS.npz, from the CPU caches), then INIT_HEAD goes on training
(``train_head(init=...)``), widened to KEPT tokens, answers only; MINUTES > 0 fits the schedule
to that time, else it runs EPOCHS (default 8). Validation: 3 % of the new texts.

Usage: gpu5.py gen PROMPTS.jsonl.gz WORK MINUTES BATCH
       gpu5.py train WORK OLD_IDS.npz INIT_HEAD OUT_HEAD MINUTES KEPT LR [EPOCHS]
The shipped head: C3a = train ... <stage-B head> head5 5.5 16384 1e-3; C3b = ... head5 head6 0 16384
6e-4 3; C3c = ... head6 head7 0 16384 3e-4 1.2 (RECIPE.md, stage C).
"""
import gzip, json, logging, random, sys, time
from pathlib import Path

import numpy as np
import torch

from opttree.distill.data import _left_pad, chat_ids, eos_ids
from opttree.smollm2 import load_smollm2

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
log = logging.getLogger("gpu5")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
MAX_PROMPT = 640


@torch.inference_mode()
def answer(model, tok, prompts: list[str], max_new: int, batch: int, deadline: float) -> list[tuple[list[int], list[int]]]:
    """Greedy answers ``(prompt_ids, answer_ids)`` (EOS kept), one per prompt, None for those
    not reached before ``deadline`` (time.time()); batches of similar length, shortest first."""
    stop = eos_ids(model, tok)
    pad = tok.pad_token_id if tok.pad_token_id is not None else min(stop)
    ids = [chat_ids(tok, p)[-MAX_PROMPT:] for p in prompts]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    out = [None] * len(ids)
    for s in range(0, len(order), batch):
        if time.time() > deadline:
            break
        rows = [ids[i] for i in order[s:s + batch]]
        x, mask = _left_pad(rows, pad)
        seq = model.generate(input_ids=x.to(DEVICE), attention_mask=mask.to(DEVICE), max_new_tokens=max_new,
                             do_sample=False, pad_token_id=pad, eos_token_id=sorted(stop))[:, x.shape[1]:].tolist()
        for i, a in zip(order[s:s + batch], seq):
            end = next((j + 1 for j, t in enumerate(a) if t in stop), len(a))
            out[i] = (ids[i], a[:end])
    return out


def first_question(text: str) -> str | None:
    for line in text.splitlines():
        line = line.strip().strip('"').strip()
        if ': "' in line:  # A student might ask: "...?
            line = line.split(': "', 1)[1]
        if line.endswith("?") and 10 < len(line) < 200:
            return line.split(": ", 1)[-1] if line.lower().startswith("question") else line
    return None


def derived(meta: list[dict], texts: list[str], rng: random.Random) -> list[dict]:
    """Stage-1 prompts built on stage-0 texts (see the module doc)."""
    news = [t for m, t in zip(meta, texts) if m["kind"] == "meta-news" and len(t) > 300]
    passages = [(m["topic"], t) for m, t in zip(meta, texts) if m["kind"] == "meta-passage" and len(t) > 300]
    questions = [(m["topic"], q) for m, t in zip(meta, texts) if m["kind"] == "meta-question" and (q := first_question(t))]
    out = []
    for t in news:
        tpl = rng.choice(["Summarize: {t}", "Summarize: {t}", "Summarize the following article in a few sentences:\n\n{t}",
                          "Write a headline for this article:\n{t}",
                          "Extract the names, places and dates mentioned in this article and return them as JSON:\n{t}",
                          "{t}\n\nWhat is the main point of this article?"])
        out.append({"text": tpl.format(t=t), "kind": "news"})
    by_topic = {}
    for topic, p in passages:
        by_topic.setdefault(topic, []).append(p)
    for topic, q in questions:
        out.append({"text": q, "kind": "qa"})
        if topic in by_topic:
            p = rng.choice(by_topic[topic])
            tpl = rng.choice(["{p}\n{q}", "{p}\n{q}", "Answer the question based on the text below.\n\n{p}\n\nQuestion: {q}"])
            out.append({"text": tpl.format(p=p, q=q), "kind": "rag"})
    return out


def save_texts(path: Path, texts: list[list[int]], prompt_lens: list[int], kinds: list[str]) -> None:
    names = sorted(set(kinds))
    np.savez_compressed(path, tokens=np.concatenate([np.array(t, dtype=np.uint16) for t in texts]),
                        offsets=np.cumsum([0] + [len(t) for t in texts]), prompt_lens=np.array(prompt_lens),
                        kinds=np.array([names.index(k) for k in kinds]), kind_names=np.array(names))


def load_ids(path) -> list[torch.Tensor]:
    z = np.load(path)
    tok, off = z["tokens"].astype(np.int64), z["offsets"]
    return [torch.from_numpy(tok[off[i]:off[i + 1]]) for i in range(len(off) - 1)]


def gen(prompts_path: str, work: Path, minutes: float, batch: int) -> None:
    deadline = time.time() + 60 * minutes
    rng = random.Random(5)
    rows = [json.loads(line) for line in gzip.open(prompts_path, "rt")]
    model, tok = load_smollm2(dtype=torch.bfloat16)
    model = model.to(DEVICE).eval()
    meta = [r for r in rows if r["kind"].startswith("meta")]
    t0 = time.time()
    done = []
    for kind, max_new in (("meta-question", 40), ("meta-news", 200), ("meta-passage", 200)):
        part = [r for r in meta if r["kind"] == kind]
        res = answer(model, tok, [r["text"] for r in part], max_new, batch, deadline)
        done += [(r, tok.decode(o[1], skip_special_tokens=True)) for r, o in zip(part, res) if o]
        log.info("stage 0 %s: %d texts, %.0f s", kind, sum(o is not None for o in res), time.time() - t0)
    stage1 = [r for r in rows if not r["kind"].startswith("meta")] + derived([r for r, _ in done], [t for _, t in done], rng)
    rng.shuffle(stage1)
    log.info("stage 1: %d prompts", len(stage1))
    texts, lens, kinds = [], [], []
    for s in range(0, len(stage1), 4096):
        chunk = stage1[s:s + 4096]
        res = answer(model, tok, [r["text"] for r in chunk], 128, batch, deadline)
        for r, o in zip(chunk, res):
            if o:
                texts.append(o[0] + o[1])
                lens.append(len(o[0]))
                kinds.append(r["kind"])
        log.info("stage 1: %d texts, %d tokens, %.0f s", len(texts), sum(map(len, texts)), time.time() - t0)
        if time.time() > deadline:
            break
    save_texts(work / "texts5.npz", texts, lens, kinds)


@torch.inference_mode()
def features(target, seqs: list[torch.Tensor], batch_tokens: int = 32768, topk: int = 16) -> list[dict]:
    """``opttree.distill.features.features_of`` for many texts at once (right-padded batches)."""
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    out = [None] * len(seqs)
    s = 0
    while s < len(order):
        width = len(seqs[order[s]])
        e = s
        while e < len(order) and len(seqs[order[e]]) * (e - s + 1) <= batch_tokens:
            e += 1
        e = max(e, s + 1)
        rows = [seqs[i] for i in order[s:e]]
        width = max(map(len, rows))
        x = torch.zeros(len(rows), width, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        for j, r in enumerate(rows):
            x[j, :len(r)], mask[j, :len(r)] = r, 1
        o = target(input_ids=x.to(DEVICE), attention_mask=mask.to(DEVICE), output_hidden_states=True, use_cache=False)
        top_logits, top_ids = o.logits.float().topk(topk, dim=-1)
        hidden = o.hidden_states[-1].to(torch.float16).cpu()
        top_ids, top_logits = top_ids.to(torch.int32).cpu(), top_logits.to(torch.float16).cpu()
        for j, i in enumerate(order[s:e]):
            n = len(seqs[i])
            out[i] = {"input_ids": seqs[i], "hidden": hidden[j, :n].clone(), "topk_ids": top_ids[j, :n].clone(),
                      "topk_logits": top_logits[j, :n].clone()}
        s = e
    return out


def train(work: Path, old_ids: str, init: str, out: str, minutes: float, kept: int, lr: float, epochs: float = 8) -> None:
    from opttree.distill.features import answer_marker
    from opttree.distill.head_train import HeadTrainConfig, train_head
    from opttree.distill.train import split_records
    t0 = time.time()
    target, tok = load_smollm2()
    target = target.to(DEVICE).eval()
    new = [x[:1024] for x in load_ids(work / "texts5.npz")]
    old = [x[:1024] for x in load_ids(old_ids)]
    new_f, old_f = features(target, new), features(target, old)
    log.info("features: %d new + %d old texts, %d tokens, %.0f s", len(new_f), len(old_f),
             sum(len(x) for x in new + old), time.time() - t0)
    new_train, val = split_records(new_f, 0.03, 0)
    cfg = HeadTrainConfig(num_kept_tokens=kept, unroll=3, epochs=epochs, batch_tokens=16384, max_len=512, lr=lr,
                          eval_every=200, seed=0, max_minutes=minutes or None, bf16=True, answers_only=True)
    r = train_head(target, new_train + old_f, out, cfg, always_keep=[2], answer_marker=answer_marker(tok),
                   init=init, val_records=val)
    log.info("%s", r)


if __name__ == "__main__":
    if sys.argv[1] == "gen":
        gen(sys.argv[2], Path(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]))
    else:
        train(Path(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], float(sys.argv[6]), int(sys.argv[7]),
              float(sys.argv[8]), *map(float, sys.argv[9:]))
