"""Heads: one-layer drafts that read the target's features, every layout in this one folder.

* :mod:`.base`: :class:`DraftHead`, what every head declares (its entries, fed features, output
  columns) for the head drafters;
* :mod:`.layer`: the parts of a head's decoder layer (RMSNorm, RoPE, a KV cache of explicit
  tensors, one Llama layer with an attention-input hook);
* :mod:`.drafter`: the per-call drafter of any head (``FeatureHeadDrafter``); :mod:`.graph`: the
  head's one step on a cache of fixed size, eager or compiled (a switch);
* the layouts' forwards: :mod:`.feature_head` (opttree's own head, ``FeatureHead``, ``HeadConfig``),
  :mod:`.eagle` (the published EAGLE-3, speculators and EAGLE-1/2 heads, ``EagleHead``) and
  :mod:`.eagle_layers` (their layers).

Folders are read and written in :mod:`opttree.loading` (``head_file``, ``eagle_folder``,
``eagle_export``); training in :mod:`opttree.distill`.

May import: the rest of :mod:`opttree.drafters` (``base``, ``model``), :mod:`opttree.tree`,
:mod:`opttree.hf`, :mod:`opttree.kernels`. Imported by the drafters (``make``), the loading and the face.
"""
