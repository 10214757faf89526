"""Distil a small same-vocabulary draft model from a target model (``opttree distill``).

Its rooms, each a floor that imports only the rooms below it:

* :mod:`.cli` (``opttree distill``; :mod:`.__main__` for ``python -m``): the command, on top;
* :mod:`.recipes`: a round from one recipe file, resumable through a cache (``--recipe``) or in one
  process on a GPU against a clock, in the precision measured fastest, its stages trained in turn;
* :mod:`.eagle3`: a head trained in the EAGLE-3 layout itself (``--kind eagle3``, or a recipe's
  ``kind = "eagle3"``): its vocabulary, its unrolled passes and loss, its training and the run;
* :mod:`.train`: the trainers (an EAGLE-style feature head, an independent draft of the target's
  layers) and what they share (checkpoints, kept tokens, the loss, agreement by depth);
* :mod:`.data`: prompts and texts, the target's answers, its features and soft labels, the cache's
  shards (at the ground).

Pipeline: prompts (:mod:`.data.prompts`, :mod:`.data.sources`) → the target's answers
(:mod:`.data.answers`) → its features (:mod:`.data.features`) → a head (:mod:`.train.head_train`) or
an independent draft (:mod:`.train.draft`) → a draft folder, which :func:`opttree.load_draft` loads.

Training writes the runtime's formats and imports :mod:`opttree.loading` (the folders' files, the
machine, the timing in turns); nothing of the runtime imports this package.
"""

from .train.model import init_draft

__all__ = ["init_draft"]
