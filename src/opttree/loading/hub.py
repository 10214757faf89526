"""A Hub name as ``draft_model=`` or ``load_draft``'s path: ``"org/name"`` resolved to its snapshot
folder through ``huggingface_hub.snapshot_download`` (the cached snapshot when ``HF_HUB_OFFLINE=1``).

A string is a Hub name only where it is no local path: ``org/name``, one slash, and no local
``org`` folder (``drafts/nowhere`` stays a path and is refused as one). Only a head's files are
fetched (JSON, safetensors, a ``.bin`` read with ``weights_only``); nothing in them runs.
"""

from __future__ import annotations

import re
from pathlib import Path

HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
PATTERNS = ["*.json", "*.safetensors", "*.bin"]


def is_hub_name(text: str) -> bool:
    """Whether ``text`` names a Hub repository rather than a local path (see the module docstring)."""
    return bool(HUB_NAME.match(text)) and not Path(text).exists() and not Path(text.split("/")[0]).is_dir()


def is_hub_id(spec: str) -> bool:
    """Whether ``spec`` has the form of any Hub id (``gpt2`` too), which from_pretrained fetches where no folder of
    that name exists (whether the Hub has it is for from_pretrained to say)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(spec)
    except HFValidationError:
        return False
    return True


def hub_folder(name: str) -> Path:
    """The local snapshot folder of Hub repository ``name`` (downloaded, or the cache's when offline);
    ValueError naming the repository and the fix when it cannot be had."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(name, allow_patterns=PATTERNS))
    except LocalEntryNotFoundError:
        raise ValueError(f"draft_model={name!r}: the Hub repository is not in the local cache and the Hub cannot be "
                         f"reached (HF_HUB_OFFLINE=1, or no network); download it first (`hf download {name}`) "
                         "or pass its folder") from None
    except (HfHubHTTPError, OSError) as error:
        raise ValueError(f"draft_model={name!r}: could not fetch the Hub repository ({type(error).__name__}: "
                         f"{str(error).splitlines()[0] if str(error) else ''}); check the name, or pass a folder") from None


__all__ = ["hub_folder", "is_hub_id", "is_hub_name"]
