"""Loading the target and the draft from command-line strings.

target: ``smollm2`` (the default: SmolLM2-135M-Instruct via :func:`opttree.smollm2.load_smollm2`),
a folder holding SmolLM2's GGUF file, or anything ``from_pretrained`` takes; any of them followed by
``:SIZE`` (``smollm2:1b``, ``smollm2:7b``, or ``:hidden_size=...,...``): that model inflated to the
cost of a bigger one, computing the same function (:func:`opttree.bench.inflate.inflate`), built in the
dtype and on the device asked.
draft: a folder written by ``opttree distill`` or a published EAGLE head's (EAGLE-3, speculators,
EAGLE-1/2; loaded with :func:`opttree.load_draft`, which completes it from the target), any other
``from_pretrained`` folder, or ``truncated:N``: a
copy of the target's first N layers (untrained, hence weak; for when no draft exists). Its dtype
may be ``"auto"``: float32 or bfloat16, whichever runs it faster here
(:mod:`opttree.loading.draft_dtype`; measured again on each run but for a distilled folder).
The command line checks each spec, and ``--device``, before it loads anything (:func:`check_target_spec`,
:func:`check_draft_spec`, :func:`resolve_device`): a missing folder is named as one.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from .inflate import SIZES, inflate, parse_size
from ..loading import load_draft
from ..loading.draft_dtype import in_dtype
from ..loading.eagle_folder import is_eagle_head
from ..loading.files import META_FILE, read_meta
from ..loading.head_file import HEAD_FORMATS
from ..loading.hub import is_hub_id
from ..smollm2 import GGUF_FILE

TARGET_FORMS = ("give 'smollm2', a folder holding a from_pretrained model (config.json) or SmolLM2's GGUF file, or a "
                "Hugging Face Hub id (org/name); ':1b' or ':7b' after it for a stand-in of that cost")
DRAFT_FORMS = ("give an `opttree distill` folder, a from_pretrained folder (config.json) or Hugging Face Hub id "
               "(org/name), truncated:N (the target's first N layers), or none")


def split_size(spec: str) -> tuple[str, str | None]:
    """``"smollm2:7b"`` -> ("smollm2", "7b"); a spec without a size -> (spec, None)."""
    base, sep, size = spec.rpartition(":")
    if sep and base and (size in SIZES or "=" in size):
        return base, size
    return spec, None


def check_source(option: str, spec: str, files: tuple[str, ...], forms: str) -> None:
    """ValueError (naming ``option``, the path and ``forms``) unless ``spec`` is a folder holding one of
    ``files``, or no folder but a Hub id."""
    path = Path(spec)
    if path.is_dir():
        if not any((path / name).is_file() for name in files):
            raise ValueError(f"{option} {spec}: that folder holds no {' nor '.join(files)}; {forms}")
    elif path.exists():
        raise ValueError(f"{option} {spec}: a file, not a folder; {forms}")
    elif not is_hub_id(spec):
        raise ValueError(f"{option} {spec}: no such folder ({path.absolute()}); {forms}")


def is_head_spec(spec: str | None) -> bool:
    """Whether ``spec`` names a feature head's folder (``opttree distill --kind head``'s, or an EAGLE head's),
    which HF's assisted generation cannot run; read from its JSON (and weights' names), no model loaded."""
    if not spec or spec == "none" or spec.startswith("truncated:"):
        return False
    path = Path(spec)
    if (path / META_FILE).is_file():
        try:
            return read_meta(path).get("format") in HEAD_FORMATS
        except ValueError:
            return False
    return is_eagle_head(path)


def check_target_spec(spec: str) -> None:
    """ValueError naming the fix for a ``--target`` that cannot load (see the module docstring): an unknown
    size after a known model, a missing folder, a folder without a model. Nothing is loaded."""
    base, size = split_size(spec)
    head, sep, tail = spec.rpartition(":")
    if size is None and sep and head and (head == "smollm2" or Path(head).is_dir()):
        size, base = tail, head  # "smollm2:13b": a size, not a path
    if size is not None:
        try:
            parse_size(size)
        except ValueError as error:
            raise ValueError(f"--target {spec}: {error}") from None
    if base != "smollm2":
        check_source("--target", base, (GGUF_FILE, "config.json"), TARGET_FORMS)


def check_draft_spec(spec: str | None, option: str = "--draft") -> None:
    """ValueError naming the fix for a ``--draft`` (or ``--assistant``) that cannot load: truncated:N
    without a whole N >= 1, a missing folder, a folder without a draft. Nothing is loaded (whether N
    exceeds the target's layers is known once the target is)."""
    if not spec or spec == "none":
        return
    if spec.startswith("truncated:"):
        count = spec.split(":", 1)[1]
        if not count.isdigit() or int(count) < 1:
            raise ValueError(f"{option} {spec}: truncated:N takes a whole number N >= 1 (the target's first N "
                             "layers), e.g. truncated:2")
        return
    check_source(option, spec, (META_FILE, "config.json"), DRAFT_FORMS)


def resolve_device(text: str) -> str:
    """``--device``: "auto" is cuda where torch sees a GPU, else cpu; any other name is checked (ValueError
    naming the fix) where it is no device, or a GPU this torch does not see."""
    if text == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise ValueError(f"--device {text}: not a device name; give cpu, cuda, cuda:1, ... or auto") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(f"--device {text}: this torch sees no CUDA GPU; give --device cpu (or auto)")
        if device.index is not None and device.index >= count:
            raise ValueError(f"--device {text}: this machine has {count} CUDA GPU(s), cuda:0 to cuda:{count - 1}")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"--device {text}: this torch has no MPS device; give --device cpu (or auto)")
    return text


def load_target(spec: str = "smollm2", dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """-> (model, tokenizer)"""
    base, size = split_size(spec)
    if size is not None:  # the source in float32 on the CPU (small), inflated straight into dtype on device
        source, tokenizer = load_target(base, torch.float32, "cpu")
        return inflate(source, size, dtype=dtype, device=device), tokenizer
    return _load(spec, dtype, device)


def _load(spec: str, dtype: torch.dtype, device: str):
    from ..smollm2 import load_smollm2

    if spec == "smollm2":
        model, tokenizer = load_smollm2(dtype=dtype)
    elif (Path(spec) / GGUF_FILE).is_file():
        model, tokenizer = load_smollm2(spec, dtype=dtype)
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(spec)
        model = AutoModelForCausalLM.from_pretrained(spec, dtype=dtype, attn_implementation="sdpa").eval()
    return model.to(device), tokenizer


def truncated_copy(target, num_layers: int):
    """A copy of the target with only its first ``num_layers`` decoder layers (+ final norm, head)."""
    try:
        from ..drafters.truncated import truncated_draft
    except ImportError:
        truncated_draft = None
    if truncated_draft is not None:
        return truncated_draft(target, num_layers)
    draft = copy.deepcopy(target)  # fallback for Llama-like models (model.model.layers)
    config = draft.config
    if not 1 <= num_layers <= config.num_hidden_layers:
        raise ValueError(f"truncated:N needs 1 <= N <= {config.num_hidden_layers}, got {num_layers}")
    draft.model.layers = draft.model.layers[:num_layers]
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:num_layers]
    return draft.eval()


def load_draft_model(spec: str | None, target, dtype: torch.dtype | str = torch.float32, device: str = "cpu"):
    """The draft named by ``spec`` (see the module docstring) in ``dtype`` (a torch dtype or
    ``"auto"``), or None."""
    if not spec or spec == "none":
        return None
    auto = isinstance(dtype, str)  # "auto": loaded in float32, then maybe cast (loading.draft_dtype)
    if spec.startswith("truncated:"):
        draft = truncated_copy(target, int(spec.split(":", 1)[1]))
        draft = draft.to(device=device, dtype=torch.float32 if auto else dtype)
    else:
        path = Path(spec)
        if (path / META_FILE).is_file() or is_eagle_head(path):
            return load_draft(path, target, dtype=dtype).to(device).eval()
        from transformers import AutoModelForCausalLM

        draft = AutoModelForCausalLM.from_pretrained(spec, dtype=torch.float32 if auto else dtype,
                                                     attn_implementation="sdpa").to(device).eval()
    if auto:
        draft = in_dtype(draft, dtype, target)
    return draft


def dtype_words(requested: str | None, draft) -> str | None:
    """The draft's dtype for the report's header: ``"bfloat16 (auto)"`` where "auto" chose it."""
    if not isinstance(draft, torch.nn.Module):
        return None
    dtype = next((p.dtype for p in draft.parameters() if p.is_floating_point()), None)
    name = str(dtype).removeprefix("torch.")
    return f"{name} (auto)" if requested == "auto" else name
