"""Distil a small same-vocabulary draft model from a target model (``opttree distill``).

Pipeline: :mod:`.prompts` / :mod:`.sources` (self-made prompts, long-document tasks and
teacher-forced texts from the machine) → :mod:`.data` (the target's greedy answers and top-k
logits, cached and resumable) → :mod:`.features` (the target's hidden states, for a feature head)
→ :mod:`.head_train` (an EAGLE-style head, :mod:`.head`) or :mod:`.train` (an independent draft,
:mod:`.model`) → :func:`load_draft`. :mod:`.recipe` / :mod:`.recipe_run`: the whole of it from one
recipe file (``opttree distill --recipe``), in the precision measured fastest on the machine
(:mod:`.precision`), training resumable by optimizer step (:mod:`.checkpoint`). ``load_draft(...,
dtype="auto")`` runs a draft in the dtype measured fastest (:mod:`.draft_dtype`, :mod:`.dtype_probe`); both
probes time their candidates taking turns (:mod:`.turns`). Cache shards are
safetensors (:mod:`.shards`); :mod:`.depths` and :mod:`.coverage` measure agreement along an
accepted path and the kept vocabulary.
"""

from .model import ReducedVocabHead, init_draft, load_draft, save_draft

__all__ = ["ReducedVocabHead", "init_draft", "load_draft", "save_draft"]
