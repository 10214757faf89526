"""Two cheap changes to the shipped head, tried at depth 1 on draft_agreement.py's 39 Spec-Bench
prompts (3 per category, 64-token greedy answers): neither moves agreement by more than 0.3 points.

- full vocabulary: the 49,152-token output instead of the 16,384 kept tokens (the new tokens'
  bias at the 5th percentile of the kept ones, as `widened` sets it);
- attention window: the head reads only the last W prompt positions (the target's features still
  come from the whole text); it was trained on pieces of at most 512 positions, and the rag and
  summarization prompts are 600-800 tokens long.

Usage: probe_limits.py QUESTIONS.jsonl ANSWERS_CACHE.json  (run from the repository root)
"""
import json
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, "benchmarks")
import draft_agreement as da  # noqa: E402

from opttree.distill import load_draft  # noqa: E402
from opttree.distill.features import features_of  # noqa: E402
from opttree.distill.head import widened  # noqa: E402
from opttree.distill.head_train import make_batch, unrolled  # noqa: E402
from opttree.smollm2 import load_smollm2  # noqa: E402

torch.set_num_threads(2)
target, tokenizer = load_smollm2()
head = load_draft("drafts/smollm2-135m-head", target)
cache = Path(sys.argv[2])
if not cache.exists():
    questions = da.select_questions(Path(sys.argv[1]), 3)
    cache.write_text(json.dumps(da.target_answers(target, tokenizer, questions, 64, 8, 1024)))
answers = json.loads(cache.read_text())


@torch.inference_mode()
def depth1(h, window: int | None = None) -> None:
    hits = defaultdict(lambda: [0, 0])
    for a in answers:
        record = features_of(target, torch.tensor(a["prompt_ids"] + a["answer_ids"]), topk=1)
        cut = 0 if window is None else max(0, len(a["prompt_ids"]) - window)
        g = unrolled(h, make_batch([{k: v[cut:] for k, v in record.items()}]), 1, 0.0)[0]  # [1, L, H]
        first = len(a["prompt_ids"]) - 1 - cut  # predicts the first answer token
        guess = h.token_ids[h.reduced_logits(g[0, first:-1]).argmax(-1)]
        hits[a["category"]][0] += int((guess == torch.tensor(a["answer_ids"])).sum())
        hits[a["category"]][1] += len(a["answer_ids"])
    total = sum(v[0] for v in hits.values()) / sum(v[1] for v in hits.values())
    weak = {k: round(hits[k][0] / hits[k][1], 3) for k in ("rag", "summarization")}
    print(f"kept {len(h.token_ids):6d} window {window or 'all':>4}: {total:.4f} {weak}", flush=True)


depth1(head)
depth1(widened(head, target, torch.arange(target.config.vocab_size)).eval())
for w in (512, 256, 128):
    depth1(head, w)
