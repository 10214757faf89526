"""What a saved draft folder holds, shared by both kinds of draft (model.py, head.py), and the
checks that turn a junk file in it into a ValueError naming the file, what is wrong and the fix."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch

META_FILE = "opttree_draft.json"
WEIGHTS_FILE = "model.safetensors"
REWRITE = "write the folder again with `opttree distill` (or restore the files it wrote)"


def sha256(path: str | Path, block: int = 1 << 20) -> str:
    """The hex sha256 of a file's bytes, read in blocks (what a shard, a GGUF or a head's weights are known by)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()


def embedding_checksum(target) -> float:
    """A cheap fingerprint of the target's input embedding (warns on the wrong target)."""
    weight = target.get_input_embeddings().weight
    return float(weight[:64].double().sum().item())


def embedding_matches(target, checksum: float) -> bool:
    """Whether ``target``'s embedding is the one whose :func:`embedding_checksum` was ``checksum``,
    in whatever precision the target now runs. Rounding each weight w to the target's dtype errs by
    at most |w| eps/2, unbiased and independent across weights, so the sum moves by about
    eps/(2 sqrt 3) * ||w||; the tolerance is 4 eps ||w|| (~14 of those), which a bf16 or fp16 copy
    of the same target meets and another target's rows do not."""
    weight = target.get_input_embeddings().weight[:64].double()
    eps = torch.finfo(target.get_input_embeddings().weight.dtype).eps
    tolerance = max(1e-3 * max(1.0, abs(checksum)), 4 * eps * float(weight.norm().item()))
    return abs(float(weight.sum().item()) - checksum) <= tolerance


@dataclass(frozen=True)
class Kind:
    """What the value of one metadata key must be: a check, and the words for it."""

    check: Callable[[object], bool]
    words: str  # completes "'key' must be ..."


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x) -> bool:
    return _is_int(x) or (isinstance(x, float) and math.isfinite(x))


TEXT = Kind(lambda x: isinstance(x, str), "a string")
COUNT = Kind(lambda x: _is_int(x) and x >= 1, "an integer >= 1")
NUMBER = Kind(_is_number, "a finite number")
POSITIVE = Kind(lambda x: _is_number(x) and x > 0, "a finite number > 0")
OBJECT = Kind(lambda x: isinstance(x, dict), "a JSON object")
INDEX_OR_NULL = Kind(lambda x: x is None or _is_int(x), "an integer or null")
INDEXES = Kind(lambda x: isinstance(x, list) and len(x) > 0 and all(_is_int(i) and i >= 0 for i in x),
               "a non-empty list of integers >= 0")
INTEGERS = Kind(lambda x: isinstance(x, list) and len(x) > 0 and all(_is_int(i) for i in x),
                "a non-empty list of integers")


def read_meta(folder: Path) -> dict:
    """The JSON object in ``folder``'s META_FILE; ValueError naming the file when it is missing,
    unreadable, not JSON or not an object."""
    path = folder / META_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ValueError(f"{path} is missing: {folder} is not a folder written by `opttree distill`; pass the "
                         f"folder `opttree distill` wrote, or load any other draft yourself and pass the model") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"could not read {path} ({error}); {REWRITE}") from None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        raise ValueError(f"{path} is not valid JSON; {REWRITE}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object, it holds {_described(data)}; {REWRITE}")
    return data


def parse_meta(cls, data, kinds: dict[str, Kind], where: str):
    """``cls(**data)`` (a dataclass whose fields are ``kinds``' keys) once ``data`` is an object,
    every field without a default is there, no other key is and each value is of its kind;
    ValueError starting with ``where`` (the file, and the object in it) otherwise."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    assert set(fields) == set(kinds), f"{cls.__name__}: the checked keys differ from its fields"
    if not isinstance(data, dict):
        raise ValueError(f"{where} must be a JSON object, it is {_described(data)}; {REWRITE}")
    missing = [name for name, f in fields.items() if name not in data and _required(f)]
    unknown = sorted(set(data) - set(fields))
    if missing or unknown:
        raise ValueError(f"{where}: " + "; ".join(
            ([f"missing {', '.join(map(repr, missing))}"] if missing else [])
            + ([f"unknown {', '.join(map(repr, unknown))}"] if unknown else [])) + f"; {REWRITE}")
    for name, value in data.items():
        if not kinds[name].check(value):
            raise ValueError(f"{where}: {name!r} must be {kinds[name].words}, got {value!r}; {REWRITE}")
    try:
        return cls(**data)
    except (TypeError, ValueError) as error:  # the dataclass's own checks
        raise ValueError(f"{where}: {error}; {REWRITE}") from None


def check_format(found: str, expected: tuple[str, ...], folder: Path) -> None:
    """ValueError naming the META_FILE when its format tag is none of ``expected``."""
    if found not in expected:
        raise ValueError(f"{folder / META_FILE}: unknown 'format' {found!r} (expected "
                         f"{' or '.join(map(repr, expected))}); {REWRITE}")


def read_weights(folder: Path) -> dict:
    """The tensors of ``folder``'s WEIGHTS_FILE (safetensors: nothing is unpickled); ValueError
    naming the file when it is missing or not a safetensors file."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = folder / WEIGHTS_FILE
    try:
        return load_file(str(path))
    except (OSError, SafetensorError) as error:
        raise ValueError(f"could not read {path} ({error}); {REWRITE}") from None


def weights_mismatch(folder: Path, detail: str) -> ValueError:
    """The ValueError for weights that do not fit what ``folder``'s other files describe."""
    return ValueError(f"{folder / WEIGHTS_FILE} does not match the draft its folder describes ({detail}); {REWRITE}")


def first_problem(error: RuntimeError) -> str:
    """The first problem ``load_state_dict`` lists in ``error`` (its lines after the heading)."""
    lines = [line.strip() for line in str(error).strip().splitlines()]
    return lines[1] if len(lines) > 1 else (lines[0] if lines else "")


def check_folder(path: Path) -> None:
    """ValueError where ``path`` (a draft's folder, to be read) does not exist or is a file, naming the fix."""
    if not path.exists():
        raise ValueError(f"{path}: no such folder ({path.absolute()}); pass the folder `opttree distill` wrote, a "
                         "published EAGLE head's folder (it holds config.json) or a Hub name org/name")
    if not path.is_dir():
        raise ValueError(f"{path} is a file, not a folder; pass the draft's folder (the one holding {META_FILE}, or "
                         "an EAGLE head's config.json)")


def check_new_folder(folder: Path, option: str = "") -> None:
    """ValueError naming ``folder`` (after ``option``, e.g. "--out ") and the fix where it is a file, or a folder
    that holds anything: a folder is written whole into a new or empty one, never over another's files
    (a stale file left beside the new ones, e.g. an opttree_draft.json, would be read instead of them)."""
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{option}{folder} is a file, not a folder; choose a new or empty folder to write")
    held = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
    if held:
        shown = ", ".join(held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3 else "")
        raise ValueError(f"{option}{folder} is not empty (it holds {shown}); choose a new or empty folder, or "
                         "remove that one first")


@contextlib.contextmanager
def written_whole(folder: Path) -> Iterator[Path]:
    """A new folder beside ``folder`` to write into (``folder`` checked by :func:`check_new_folder`): renamed to
    ``folder`` once the block ends, removed where it raises. ``folder`` holds every file or does not exist."""
    check_new_folder(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    partial = folder.parent / f".{folder.name}.{os.getpid()}.{secrets.token_hex(4)}.partial"
    partial.mkdir()
    try:
        yield partial
        if folder.is_dir():
            folder.rmdir()  # empty (checked): a rename replaces no folder on every system
        partial.rename(folder)
    finally:
        if partial.exists():
            shutil.rmtree(partial, ignore_errors=True)


def _required(field: dataclasses.Field) -> bool:
    return field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING


def _described(value) -> str:
    return "null" if value is None else f"a {type(value).__name__}"
