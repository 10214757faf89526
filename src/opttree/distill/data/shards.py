"""Cache shards: lists of records (dicts of tensors, ints, strings) stored without pickle.

A shard is one safetensors file: tensor ``key`` of record ``i`` is stored as ``"{i}/{key}"``; every
other field (ints, strings, lists of ints) goes as JSON into the file's metadata. Loading never
unpickles. Shards written by older versions (``shard_*.pt``, ``torch.save`` of a list of dicts) are still
read, with ``torch.load(weights_only=True)`` (plain containers and tensors only).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ...loading.files import sha256  # shards are known by it (re-exported for distill)

SUFFIX = ".safetensors"


def save_records(records: list[dict], path: str | Path) -> Path:
    """Write ``records`` to ``path`` atomically (a ``.tmp`` file renamed once complete)."""
    from safetensors.torch import save_file

    path = Path(path)
    tensors, plain = {}, []
    for i, record in enumerate(records):
        rest = {}
        for key, value in record.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{i}/{key}"] = value.detach().contiguous().cpu()
            else:
                rest[key] = value
        plain.append(rest)
    tmp = path.with_name(path.name + ".tmp")
    # one metadata key: safetensors writes its metadata map in no fixed order, and the manifest
    # checks a rebuilt shard by its sha256, so the same records must always give the same bytes
    save_file(tensors, str(tmp), metadata={"records": json.dumps(plain)})
    tmp.rename(path)
    return path


def load_records(path: str | Path) -> list[dict]:
    """The records of one shard (safetensors, or a legacy ``.pt`` list loaded weights-only)."""
    path = Path(path)
    if path.suffix == ".pt":
        return torch.load(path, weights_only=True)
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        plain = json.loads(f.metadata()["records"])
        records = [dict(p) for p in plain]
        for name in f.keys():
            i, key = name.split("/", 1)
            records[int(i)][key] = f.get_tensor(name)
    return records


def shard_paths(folder: str | Path) -> list[Path]:
    """Every complete shard of ``folder`` in name order (new and legacy formats)."""
    folder = Path(folder)
    return sorted([*folder.glob("shard_*" + SUFFIX), *folder.glob("shard_*.pt")])


def shard_name(index: int) -> str:
    return f"shard_{index:05d}{SUFFIX}"


