"""A draft folder (written by ``opttree distill``, or a published EAGLE head's) made ready to decode (:func:`load_draft`), and what
``draft_model=`` holds made ready for :func:`opttree.drafters.make_drafter` (:func:`prepare_draft`):
folders loaded, and a saved draft loaded the wrong way refused."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ..drafters.head.base import DraftHead
from ..drafters.mixed import MixedDrafter
from ..hf.validation import check_causal_lm
from .draft_dtype import check_dtype, in_dtype
from .draft_model import ReducedVocabHead, load_model_draft
from .eagle_folder import CONFIG_FILE, is_eagle_folder, load_eagle
from .files import META_FILE, check_folder, read_meta
from .hub import hub_folder, is_hub_name
from .head_file import HEAD_FORMATS, load_head


def load_draft(path: str | Path, target, dtype: torch.dtype | str | None = None):
    """The draft saved in the folder ``path`` (by ``opttree distill``), completed from ``target``:
    a draft model (an eval-mode ``LlamaForCausalLM``, :mod:`.draft_model`) or a feature head (a
    :class:`~opttree.drafters.head.feature_head.FeatureHead`, :mod:`.head_file`), by the format its
    ``opttree_draft.json`` names; or a published EAGLE head (EAGLE-3, its ``speculators`` form,
    EAGLE-1/2: a folder with a ``config.json``, :mod:`.eagle_folder`), an
    :class:`~opttree.drafters.head.eagle.EagleHead`. ``target`` must be the model it was made for
    (another target's embedding is logged as a warning; an EAGLE head's shapes are checked). In ``dtype``:

    - None: a draft model in the target's dtype, a feature head (EAGLE heads too) in float32;
    - a floating torch.dtype: that one (a draft model in another dtype than the target's gets its
      own copy of the embedding; the target's is left as it is);
    - ``"auto"``: float32 or bfloat16, whichever a short probe runs faster on this machine
      (bfloat16 on a GPU that has it), cached per draft folder and machine; see
      :mod:`opttree.loading.draft_dtype`.

    ``path`` may be a Hub name, ``"org/name"`` (:mod:`.hub`: its snapshot, the cached one offline).
    Anything else is a ValueError naming these (a path that is no folder: as one); so is a folder whose
    files are missing or junk.
    """
    dtype = check_dtype(dtype)
    path = hub_folder(str(path)) if is_hub_name(str(path)) else Path(path)
    check_folder(path)
    if not (path / META_FILE).is_file() and is_eagle_folder(path):
        return in_dtype(load_eagle(path, target), dtype, target, path)
    data = read_meta(path)
    draft = load_head(path, target) if data.get("format") in HEAD_FORMATS else load_model_draft(path, target, data)
    return in_dtype(draft, dtype, target, path)


def load_if_path(draft, target):
    """``draft`` given as a draft folder (a str or a Path: written by ``opttree distill``, or an EAGLE
    head's): loaded with :func:`load_draft` (completed from ``target``). Anything else as is."""
    if not isinstance(draft, (str, os.PathLike)) or draft == "prompt_lookup":
        return draft
    if (Path(draft) / META_FILE).is_file() or is_eagle_folder(Path(draft)) or is_hub_name(str(draft)):
        return load_draft(draft, target)
    missing = "" if Path(draft).exists() else f"no such folder ({Path(draft).absolute()}); "
    raise ValueError(
        f"draft_model={str(draft)!r}: {missing}a string must be 'prompt_lookup' or a folder written by `opttree distill` "
        f"(it holds {META_FILE}), or a published EAGLE head's folder (it holds {CONFIG_FILE}); load any other "
        "draft yourself and pass the model, e.g. "
        "AutoModelForCausalLM.from_pretrained(path, attn_implementation='sdpa')"
    )


def prepare_draft(draft, target):
    """What ``draft_model=`` holds, ready for :func:`~opttree.drafters.make_drafter`: a draft folder
    loaded (inside a :class:`~opttree.drafters.MixedDrafter` too, once per call), and a draft model
    checked not to be a saved draft that ``from_pretrained`` left half random."""
    if isinstance(draft, MixedDrafter):
        inner = prepare_draft(draft.model_drafter, target), prepare_draft(draft.ngram_drafter, target)
        if inner == (draft.model_drafter, draft.ngram_drafter):
            return draft
        return MixedDrafter(*inner, draft.weight)
    draft = load_if_path(draft, target)
    if isinstance(draft, torch.nn.Module) and not isinstance(draft, DraftHead):
        check_causal_lm(draft, "draft")  # a base model, or no transformers model: refused before anything runs
        check_assembled_draft(draft)
    return draft


def check_assembled_draft(draft) -> None:
    """A draft saved by ``opttree distill`` stores only its own weights: loaded with from_pretrained,
    its embedding and output head stay random (it then runs, but drafts noise). Refuse it."""
    source = str(draft.config.name_or_path or "")
    if not source or not (Path(source) / META_FILE).is_file():
        return
    if isinstance(draft.get_output_embeddings(), ReducedVocabHead):
        return
    raise ValueError(
        f"{source} is an opttree draft: it takes its embedding and output rows from the target, so "
        "from_pretrained() leaves them random. Load it with opttree.load_draft(path, target), "
        "or pass the folder itself: draft_model=path"
    )


__all__ = ["check_assembled_draft", "load_draft", "load_if_path", "prepare_draft"]
