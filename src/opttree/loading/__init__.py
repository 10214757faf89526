"""Loading: a draft folder (``opttree distill``'s, or a published EAGLE head's) made ready to decode, apart from training.

* :mod:`.load`: :func:`load_draft` (either kind of folder, in the dtype asked for) and
  :func:`prepare_draft` (what ``draft_model=`` holds, folders loaded, before a drafter is made);
* :mod:`.files`: what a draft folder holds and the checks that turn a junk file into a ValueError;
  :mod:`.draft_model` (a draft model: ``ReducedVocabHead``, save and load) and :mod:`.head_file`
  (a feature head: save and load) are opttree's formats; :mod:`.eagle` holds the published EAGLE
  layouts, one class each (``Eagle3Head``, ``SpeculatorsHead``, ``Eagle1Head``: config reader, key map,
  export) and their registry by ``architectures``; :mod:`.eagle_folder` reads a published head's
  folder through it (a ``pytorch_model.bin`` through :mod:`.pickled`) and :mod:`.eagle_export` writes
  one (``export_draft``; ``opttree export``, :mod:`.export_cli`), EAGLE-3's layer ids read and written
  as the engines do (:mod:`.layer_ids`); :mod:`.hub` resolves a Hub name (``org/name``) to its snapshot
  folder;
* :mod:`.draft_dtype`: ``dtype="auto"``, the draft in the dtype measured fastest here, cached per
  folder and machine; :mod:`.dtype_probe` times it as decoding runs it, the candidates taking
  turns (:mod:`.turns`); :mod:`.machine` names the machine a timing was taken on.

May import: :mod:`opttree.drafters`, :mod:`opttree.budget` (the calibration cache's folder),
:mod:`opttree.tree`, :mod:`opttree.hf`, :mod:`opttree.kernels`. Imported by the face (:mod:`opttree.integration`), by
``opttree distill`` (training writes these formats) and by ``opttree bench``; never by the loop.
"""

from .eagle_export import export_draft
from .load import load_draft, prepare_draft

__all__ = ["export_draft", "load_draft", "prepare_draft"]
