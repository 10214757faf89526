"""Train a head directly in the EAGLE-3 layout (``opttree distill --kind eagle3``): the head is the
runtime's :class:`~opttree.loading.eagle.eagle3.Eagle3Head`, its folder what
:func:`opttree.export_draft` writes, so :func:`opttree.load_draft` reads it and its export is a copy.

- :mod:`.vocab`: the draft vocabulary (the most frequent target tokens of the data), ``d2t`` and ``t2d``;
  imports torch only.
- :mod:`.head`: a new head's config and start from the target; imports :mod:`opttree.drafters.head.eagle`,
  :mod:`opttree.hf.width`, :mod:`opttree.loading.eagle`, :mod:`opttree.loading.head_file` and :mod:`.vocab`.
- :mod:`.unroll`: the pairing (taps at t, token t + 1), the training-time test fed as the drafter feeds
  it, and EAGLE-3's loss; imports :mod:`opttree.distill.train.head_data`, :mod:`opttree.distill.train.head_loss`,
  :mod:`opttree.distill.train.shared`.
- :mod:`.train`: the training loop (a new head or an EAGLE-3 folder's, resumable from a checkpoint),
  its precision probe and the folder; imports :mod:`opttree.loading.eagle`, :mod:`opttree.loading.eagle_export`,
  :mod:`opttree.loading.eagle_folder`, :mod:`opttree.loading.head_file`, :mod:`opttree.loading.load`,
  :mod:`opttree.drafters.head.eagle`, :mod:`opttree.hf.width`,
  :mod:`opttree.distill.train.checkpoint`,
  :mod:`opttree.distill.train.head_data`, :mod:`opttree.distill.train.head_loss`,
  :mod:`opttree.distill.train.head_train`, :mod:`opttree.distill.train.shared`, :mod:`.head`, :mod:`.unroll`,
  :mod:`.vocab`, :mod:`.from_feature_head`. A recipe's stages train with it (``kind = "eagle3"``, :mod:`opttree.distill.recipes`).
- :mod:`.from_feature_head`: a head started from a trained feature head where the weights map (fc fitted
  on the taps, the attention input's scales, the layer's MLP, norms and output rows copied); imports
  :mod:`opttree.drafters.head.feature_head`, :mod:`opttree.loading.eagle` and :mod:`.head`.
- :mod:`.run`: the CLI's ``--kind eagle3`` (features of the taps in their own cache folder, then
  training); imports :mod:`opttree.distill.data.features` and :mod:`.train`.

Rules and sources: DESIGN.md, "EAGLE heads", and each module's docstring.
"""
