"""Heads: one-layer drafts that read the target's features, and the layouts they come in.

* :mod:`.base`: :class:`DraftHead`, what every head declares (its entries, fed features, output
  columns) for the head drafters (:mod:`opttree.drafters.head_drafter`, fixed shapes in
  :mod:`opttree.drafters.head_graph`);
* :mod:`.eagle`: the published EAGLE layouts (EAGLE-3, the ``speculators`` form of it, EAGLE-1/2):
  :class:`EagleConfig` and :class:`EagleHead`, each layout's forward; :mod:`.eagle_layers` their
  decoder layers (built on :mod:`opttree.drafters.head_layer`: RMSNorm, RoPE, KV, one Llama layer).

opttree's own head is :mod:`opttree.drafters.feature_head`. Folders are read and written in
:mod:`opttree.loading` (:mod:`opttree.loading.eagle_folder`).

May import: the rest of :mod:`opttree.drafters` below it (head_layer), :mod:`opttree.kernels`,
:mod:`opttree.hf`. Imported by the drafters and by the loading.
"""
