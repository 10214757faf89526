"""A training run's resumable state, in one safetensors file written atomically.

:class:`TrainState` holds everything a training loop needs to go on exactly where it stopped:
the model's weights (float32), the optimizer's per-parameter state, the torch and Python RNG
states, the step and the loop's position in its epoch. Tensors go into the safetensors file;
every scalar, list and the Python RNG state go as JSON into its metadata (``"state"``). Nothing
is pickled, so loading never unpickles. The file is written to ``<name>.tmp`` and renamed, so a
run killed while writing leaves the previous checkpoint intact.

``key`` names what the state belongs to (a fingerprint of the data and settings); a checkpoint
whose key differs is not resumed from (:func:`load_train_state` returns None).
"""

from __future__ import annotations

import json
import logging
import os
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

CHECKPOINT_FILE = "train_state.safetensors"


@dataclass
class TrainState:
    """Where a training loop stands. ``model`` / ``optimizer``: flat ``{name: tensor}`` maps
    (:func:`optimizer_tensors`); ``torch_rng`` [n] uint8 (``torch.get_rng_state()``);
    ``python_rng``: ``random.Random.getstate()`` as JSON-able lists; ``epoch_rng``: the Python RNG
    state at the start of the current epoch (its batch order is drawn again from it) and
    ``epoch_offset`` the batches of that epoch already done. ``extra``: the loop's own scalars
    (best agreement so far, running loss, ...), JSON-able."""

    key: str
    step: int
    total: int
    model: dict[str, torch.Tensor]
    optimizer: dict[str, torch.Tensor]
    torch_rng: torch.Tensor
    python_rng: list
    epoch_rng: list
    epoch_offset: int
    elapsed_seconds: float
    extra: dict = field(default_factory=dict)
    cuda_rng: torch.Tensor | None = None  # [n] uint8, where the run uses CUDA


def rng_to_json(state: tuple) -> list:
    """``random.Random.getstate()`` -> nested lists (JSON keeps no tuples)."""
    version, internal, gauss = state
    return [version, list(internal), gauss]


def rng_from_json(state: list) -> tuple:
    """The inverse of :func:`rng_to_json`: a state ``random.Random.setstate`` accepts."""
    version, internal, gauss = state
    return (version, tuple(internal), gauss)


def optimizer_tensors(optim: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """The per-parameter state of ``optim`` as ``{"<param index>/<key>": tensor}`` (AdamW: step,
    exp_avg, exp_avg_sq); scalars become 0-d tensors."""
    out = {}
    for index, state in optim.state_dict()["state"].items():
        for key, value in state.items():
            out[f"{index}/{key}"] = value if isinstance(value, torch.Tensor) else torch.tensor(value)
    return out


def load_optimizer_tensors(optim: torch.optim.Optimizer, tensors: dict[str, torch.Tensor]) -> None:
    """Put :func:`optimizer_tensors`' output back into ``optim`` (same parameters, same order)."""
    state: dict[int, dict] = {}
    for name, value in tensors.items():
        index, key = name.split("/", 1)
        state.setdefault(int(index), {})[key] = value
    full = optim.state_dict()
    full["state"] = state
    optim.load_state_dict(full)


def save_train_state(state: TrainState, folder: str | Path) -> Path:
    """Write ``state`` to ``folder/CHECKPOINT_FILE`` atomically; returns the path."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {f"model/{k}": v.detach().cpu().contiguous() for k, v in state.model.items()}
    tensors |= {f"optim/{k}": v.detach().cpu().contiguous() for k, v in state.optimizer.items()}
    tensors["rng/torch"] = state.torch_rng.cpu().contiguous()
    if state.cuda_rng is not None:
        tensors["rng/cuda"] = state.cuda_rng.cpu().contiguous()
    meta = {k: v for k, v in asdict(state).items() if k not in ("model", "optimizer", "torch_rng", "cuda_rng")}
    path = folder / CHECKPOINT_FILE
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata={"state": json.dumps(meta)})
    os.replace(tmp, path)
    return path


def load_train_state(folder: str | Path, key: str) -> TrainState | None:
    """The state saved in ``folder`` if there is one and its key is ``key``; None otherwise (a
    stale or foreign checkpoint is named in the log and left alone)."""
    from safetensors import SafetensorError, safe_open

    path = Path(folder) / CHECKPOINT_FILE
    if not path.exists():
        return None
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = json.loads(f.metadata()["state"])
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except (OSError, SafetensorError, KeyError, ValueError) as error:
        logger.warning("%s is unreadable (%s): training starts again", path, error)
        return None
    if meta.get("key") != key:
        logger.warning("%s belongs to other data or settings: training starts again", path)
        return None
    return TrainState(
        model={k[6:]: v for k, v in tensors.items() if k.startswith("model/")},
        optimizer={k[6:]: v for k, v in tensors.items() if k.startswith("optim/")},
        torch_rng=tensors["rng/torch"], cuda_rng=tensors.get("rng/cuda"), **meta)


def capture_rng(rng: random.Random, device: torch.device) -> dict:
    """The RNG fields of a :class:`TrainState` now: torch's CPU (and ``device``'s CUDA) RNG and
    ``rng``'s state."""
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return {"torch_rng": torch.get_rng_state(), "cuda_rng": cuda, "python_rng": rng_to_json(rng.getstate())}


def resume(state: TrainState, model: torch.nn.Module, optim: torch.optim.Optimizer, rng: random.Random,
           device: torch.device) -> tuple[int, int, int, list | None, float, dict]:
    """Put ``state`` back into ``model``, ``optim`` and the RNGs; returns where the loop stood:
    (step, total, epoch offset, epoch RNG state, elapsed seconds, the loop's extra)."""
    model.load_state_dict(state.model)
    load_optimizer_tensors(optim, state.optimizer)
    restore_rng(state, rng, device)
    return state.step, state.total, state.epoch_offset, state.epoch_rng, state.elapsed_seconds, state.extra


def snapshot(key: str, step: int, total: int, model: torch.nn.Module, optim: torch.optim.Optimizer,
             epoch_rng: list | None, offset: int, elapsed: float, extra: dict, rng: random.Random,
             device: torch.device) -> TrainState:
    """The :class:`TrainState` of a loop at ``step`` (what :func:`resume` puts back)."""
    return TrainState(key=key, step=step, total=total, model=model.state_dict(), optimizer=optimizer_tensors(optim),
                      epoch_rng=epoch_rng, epoch_offset=offset, elapsed_seconds=elapsed, extra=extra,
                      **capture_rng(rng, device))


def restore_rng(state: TrainState, rng: random.Random, device: torch.device) -> None:
    """Set the torch RNGs and ``rng`` to what ``state`` captured."""
    torch.set_rng_state(state.torch_rng)
    if state.cuda_rng is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state.cuda_rng, device)
    rng.setstate(rng_from_json(state.python_rng))
