"""Round 5 prompts (no Spec-Bench text), built here and answered on a GPU by gpu5.py.

- ``PARTS`` parts of the round-3 mix (mix.py) with a new seed;
- ``N_META`` "meta" prompts for stage 0 on the GPU, where the target writes its own material:
  news reports (then summarised, given headlines, mined for names as JSON), reference passages
  (then questions are answered from them, RAG-style) and short search questions (then answered).

Writes one JSON object per line, ``{"text": ..., "kind": ...}``, gzipped; meta prompts have
kinds ``meta-news``, ``meta-passage`` and ``meta-question`` and carry their ``topic``.
Usage: prompts5.py OUT.jsonl.gz SEED PARTS N_META
"""
import gzip, json, random, sys

from opttree.smollm2 import load_smollm2
from mix import Mix

NEWS = ["Write a news report about {topic}.", "Write a newspaper article about {topic}, with a headline.",
        "Write a short news story about a recent event involving {topic}.",
        "Write a local news article about {topic} that quotes two people."]
PASSAGE = ["Write an encyclopedia entry about {topic}.", "Write a factual paragraph about {topic} for a reference book.",
           "Write a Wikipedia-style introduction to {topic}.", "Describe the history and key facts of {topic}."]
QUESTION = ["Write a question that someone might type into a search engine about {topic}. Write only the question.",
            "Write one short trivia question about {topic}. Write only the question.",
            "Ask a 'who', 'when' or 'where' question about {topic}. Write only the question.",
            "Write a question a student might ask a teacher about {topic}. Write only the question."]

if __name__ == "__main__":
    out, seed, parts, n_meta = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    rng = random.Random(seed)
    _, tok = load_smollm2()
    mix = Mix(tok, rng)
    rows = [{"text": p.text, "kind": p.kind} for k in range(parts) for p in mix.part(k, seed)]
    named = mix.topics[:len(mix.topics) - 4000]  # the built-in topics: real subjects
    for i in range(n_meta):
        kind, templates = [("meta-news", NEWS), ("meta-passage", PASSAGE), ("meta-question", QUESTION)][i % 3]
        topic = rng.choice(named) if rng.random() < 0.5 else rng.choice(mix.topics)
        rows.append({"text": rng.choice(templates).format(topic=topic), "kind": kind, "topic": topic})
    with gzip.open(out, "wt") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(len(rows), "prompts:", parts * 512, "from the mix,", n_meta, "meta")
