"""Heads: one-layer drafts that read the target's features, and the forwards every layout shares.

* :mod:`.base`: :class:`DraftHead`, what every head declares (its entries, fed features, output
  columns) for the head drafters;
* :mod:`.layer`: the parts of a head's decoder layer (RMSNorm, RoPE, a KV cache of explicit
  tensors, one Llama layer with an attention-input hook);
* :mod:`.drafter`: the per-call drafter of any head (``FeatureHeadDrafter``); :mod:`.graph`: the
  head's one step on a cache of fixed size, eager or compiled (a switch);
* the forwards: :mod:`.feature_head` (opttree's own head, ``FeatureHead``, ``HeadConfig``),
  :mod:`.eagle` (what the published EAGLE heads share: ``EagleConfig``, ``EagleHead``) and
  :mod:`.eagle_layers` (their layers). Each published layout (EAGLE-3, speculators, EAGLE-1/2) is one
  class beside its folder format in :mod:`opttree.loading` (``loading/eagle/``, a registry keyed by
  config.json's ``architectures``).

Folders are read and written in :mod:`opttree.loading` (``head_file``, ``eagle``, ``eagle_folder``,
``eagle_export``); training in :mod:`opttree.distill`.

May import: the rest of :mod:`opttree.drafters` (``base``, ``model``), :mod:`opttree.tree`,
:mod:`opttree.hf`, :mod:`opttree.kernels`. Imported by the drafters (``make``), the loading and the face.
"""
