"""Data: the texts a draft trains on and the target's labels and features of them (the ground room
of :mod:`opttree.distill`).

* :mod:`.prompts`: self-made prompts (templates × topics, tasks over the target's own answers, a
  JSONL file); :mod:`.chat_prompts`: chat prompts of Spec-Bench's 13 kinds of task; :mod:`.sources`:
  texts found on the machine (documents, prompts over them, teacher-forced pairs);
* :mod:`.targets`: the target a draft is made for; :mod:`.answers`: its greedy answers and top-k
  logits, cached and resumable; :mod:`.pipeline`: prompts → answers in two rounds (``--target``);
* :mod:`.features`: the target's hidden states and soft labels of any text (a feature head's data);
* :mod:`.shards`: the cache's shards (safetensors, no pickle);
* :mod:`.texts`: a round's texts to commit: prompts written by the library and the target's greedy
  answers as uint16 ids in shards any run goes on from (settings never mixed).

May import: the runtime (:mod:`opttree.loading`) and :mod:`opttree.smollm2`; no other room of
:mod:`opttree.distill`. Imported by :mod:`opttree.distill.train`, :mod:`opttree.distill.recipes` and
the command.
"""
