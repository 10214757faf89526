"""Distil a small same-vocabulary draft model from a target model (``opttree distill``).

Pipeline: :mod:`.prompts` (self-made training prompts) → :mod:`.data` (the target's greedy
answers and top-k logits, cached and resumable) → :mod:`.model` (a draft built from the
target's own embedding, a few of its layers and a reduced-vocabulary head) → :mod:`.train`
(soft-label distillation with validation agreement) → :func:`load_draft`.
"""

from .model import ReducedVocabHead, init_draft, load_draft, save_draft

__all__ = ["ReducedVocabHead", "init_draft", "load_draft", "save_draft"]
