"""Recipes: a whole round from one recipe file, the data's sources through the trained stages to the
shipped draft (``opttree distill --recipe``).

* :mod:`.recipe`: the recipe file (sources, features, stages, seeds, the head's kind: opttree's
  feature head or the EAGLE-3 layout); :mod:`.stages`: one stage's head, the one stage runner of
  both ways below;
* :mod:`.recipe_run`: the round in resumable steps through a cache folder; :mod:`.resident`: the
  round in one process on a GPU, against a clock (``python -m opttree.distill.recipes.resident``);
* :mod:`.precision`: bf16 or fp32, whichever is measured faster on the machine per stage.

May import: :mod:`opttree.distill.eagle3`, :mod:`opttree.distill.train`, :mod:`opttree.distill.data` and the runtime
(:mod:`opttree.loading`, :mod:`opttree.smollm2`). Imported by the command (:mod:`opttree.distill.cli`) alone.
"""
