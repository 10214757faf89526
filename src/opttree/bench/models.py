"""Loading the target and the draft from command-line strings.

target: ``smollm2`` (the default: SmolLM2-135M-Instruct via :func:`opttree.smollm2.load_smollm2`),
a folder holding SmolLM2's GGUF file, or anything ``from_pretrained`` takes; any of them followed by
``:SIZE`` (``smollm2:1b``, ``smollm2:7b``, or ``:hidden_size=...,...``): that model inflated to the
cost of a bigger one, computing the same function (:func:`opttree.bench.inflate.inflate`), built in the
dtype and on the device asked.
draft: a folder written by ``opttree distill`` (loaded with :func:`opttree.load_draft`,
which completes it from the target), any other ``from_pretrained`` folder, or ``truncated:N``: a
copy of the target's first N layers (untrained, hence weak; for when no draft exists). Its dtype
may be ``"auto"``: float32 or bfloat16, whichever runs it faster here
(:mod:`opttree.loading.draft_dtype`; measured again on each run but for a distilled folder).
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from .inflate import SIZES, inflate
from ..loading import load_draft
from ..loading.draft_dtype import in_dtype
from ..loading.files import META_FILE


def split_size(spec: str) -> tuple[str, str | None]:
    """``"smollm2:7b"`` -> ("smollm2", "7b"); a spec without a size -> (spec, None)."""
    base, sep, size = spec.rpartition(":")
    if sep and base and (size in SIZES or "=" in size):
        return base, size
    return spec, None


def load_target(spec: str = "smollm2", dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """-> (model, tokenizer)"""
    base, size = split_size(spec)
    if size is not None:  # the source in float32 on the CPU (small), inflated straight into dtype on device
        source, tokenizer = load_target(base, torch.float32, "cpu")
        return inflate(source, size, dtype=dtype, device=device), tokenizer
    return _load(spec, dtype, device)


def _load(spec: str, dtype: torch.dtype, device: str):
    from ..smollm2 import GGUF_FILE, load_smollm2

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
        if (path / META_FILE).is_file():
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
