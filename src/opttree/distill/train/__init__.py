"""Training: a draft trained on :mod:`opttree.distill.data`'s records, written in the runtime's formats.

* :mod:`.head`: a feature head made, continued, widened or grown; :mod:`.head_data`: feature
  records → pieces and padded batches; :mod:`.head_loss`: the unrolled passes and their loss;
  :mod:`.head_train`: the head's training loop (resumable, validated per depth);
* :mod:`.model`: an independent draft of some of the target's layers; :mod:`.draft`: its training;
* :mod:`.shared`: what every trainer shares (the held-out split, the kept tokens, the soft + hard
  loss, the schedule);
* :mod:`.checkpoint`: a run's resumable state; :mod:`.depths`: agreement along an accepted path;
  :mod:`.coverage`: how much of the target's greedy tokens a kept vocabulary covers.

May import: :mod:`opttree.distill.data` and the runtime (:mod:`opttree.loading`,
:mod:`opttree.drafters`). Imported by :mod:`opttree.distill.recipes` and the command; never imports them.
"""
