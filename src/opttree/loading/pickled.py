"""A head's ``pytorch_model.bin`` read without running code (:func:`read_pickled`): handed to
``torch.load(weights_only=True)`` only where its first bytes are one of torch's formats, and every
refusal says what the file is and what to do, never that it could be unpickled."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from .files import WEIGHTS_FILE as SAFETENSORS

RESTORE = f"restore the head's weights (as {SAFETENSORS} where its publisher has one)"


def read_pickled(file: Path) -> dict[str, torch.Tensor]:
    """A ``pytorch_model.bin`` through ``torch.load(weights_only=True)``, handed to torch only where its first
    bytes are one of torch's formats (:func:`file_kind`). Each refusal says what the file is and what to do;
    none suggests unpickling it."""
    try:
        with open(file, "rb") as f:
            kind = file_kind(f.read(16))
    except OSError as error:
        raise ValueError(f"could not read {file} ({error}); {RESTORE}") from None
    if kind == "empty":
        raise ValueError(f"{file} is empty (0 bytes): a download or copy cut short; {RESTORE}")
    if kind == "safetensors":
        raise ValueError(f"{file} is a safetensors file under a pickle's name; rename it to {SAFETENSORS}")
    if kind == "other":
        raise ValueError(f"{file} is not a torch checkpoint (neither torch's zip archive nor a torch pickle: another "
                         f"kind of file, or corrupt); {RESTORE}")
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as error:  # anything torch's reader raises: a corrupt file, or a pickle of more than tensors
        raise unreadable(file, error) from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{file} must hold a dict of tensors; {RESTORE}")
    return state


def file_kind(start: bytes) -> str:
    """What a file is by its first bytes: "torch" (a zip archive, torch's format, or a protocol-2+ pickle, its
    legacy one), "safetensors" (an 8-byte header length, then its JSON), "empty" or "other"."""
    if start.startswith(b"PK\x03\x04") or start.startswith(b"\x80"):
        return "torch"
    if len(start) > 8 and start[8:9] == b"{":
        return "safetensors"
    return "empty" if not start else "other"


def unreadable(file: Path, error: Exception) -> ValueError:
    """The ValueError for a torch checkpoint ``torch.load(weights_only=True)`` raised ``error`` on, without
    torch's advice (to load it with weights_only=False)."""
    refused = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(error))
    if refused:
        return ValueError(f"{file} is a pickle that builds {refused.group(1)}, not only tensors: unpickling it could "
                          f"run code, and opttree never does; get the head as {SAFETENSORS} (its publisher's, or "
                          "converted where you trust the file)")
    words = str(error).split(". ")[0].splitlines()[0][:160] if str(error) else ""
    said = f": {words}" if words and "weights_only" not in words else ""
    return ValueError(f"{file} is a corrupt torch checkpoint (torch.load: {type(error).__name__}{said}); {RESTORE}")


__all__ = ["file_kind", "read_pickled"]
