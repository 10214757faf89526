"""The dtype a draft runs in: ``load_draft(path, target, dtype=...)`` and ``opttree bench --draft-dtype``.

``dtype`` is None (the draft model in the target's dtype, a feature head in float32), a floating
torch dtype, or ``"auto"``: float32 or bfloat16, whichever runs the draft faster HERE. That is a
property of the machine, not of its CPU flags: bf16 linears run several times faster than float32
on a Xeon with AMX and on GPUs, and several times SLOWER on an AVX2-only EPYC (benchmarks/RESULTS.md,
"Which dtype for the draft"). So ``"auto"``

- on a CUDA target: bfloat16 where the GPU runs it natively
  (``torch.cuda.is_bf16_supported(including_emulation=False)``), else float32; nothing is timed;
- elsewhere: times a short probe of the draft in both dtypes, as decoding runs it
  (:mod:`opttree.loading.dtype_probe`, a few tenths of a second), and takes bfloat16 only where it
  ran at least MIN_SPEEDUP times faster (:func:`choose_dtype`: within noise, float32).

A measured choice is kept as JSON next to the latency calibrations
(:func:`opttree.budget.calibration_file.cache_dir`, file ``draft-dtype-<hash>.json``) with its timings,
keyed by what it depends on: the draft folder (its metadata and config files' hashes, its weights
file's size and mtime), the device type, the CPU's model name, torch's thread count and version,
and the few-row linears' kernel mode (``OPTTREE_LINEAR``). ``OPTTREE_CALIBRATION=off`` neither reads
nor writes it, ``=refresh`` measures again and overwrites it. A file that cannot be used (not JSON,
another key, a choice or times that measuring does not write) is named in a warning and measured
again; it never stops a load. The choice is logged at INFO (logger ``opttree.loading.draft_dtype``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..budget.calibration_file import cache_dir, cache_mode, parse_seconds, read_keyed_file
from ..kernels import linears
from . import dtype_probe
from .dtype_probe import cast_copy, model_dtype
from .files import META_FILE, WEIGHTS_FILE
from .machine import cpu_model, machine_name

logger = logging.getLogger(__name__)

AUTO = "auto"
CHOICES = {"float32": torch.float32, "bfloat16": torch.bfloat16}  # what "auto" picks from
MIN_SPEEDUP = 1.15  # bfloat16 must beat float32 by this factor (less is timing noise)
FILE_FORMAT = "opttree-draft-dtype/1"
CHOICE_VERSION = 3  # bump when the probe changes: older files are then ignored (3: the linears' kernels chosen per shape)
_probing = threading.Lock()  # one probe at a time: two at once would time each other
ACCEPTED = ("None (the target's dtype; float32 for a feature head), 'auto' (float32 or bfloat16, measured), "
            "or a floating-point torch.dtype such as torch.float32 or torch.bfloat16")


def check_dtype(dtype):
    """``dtype`` if ``load_draft`` takes it (None, "auto", a floating torch.dtype); else a
    ValueError naming what it takes."""
    if dtype is None or (isinstance(dtype, str) and dtype == AUTO):
        return dtype
    if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        return dtype
    raise ValueError(f"dtype={dtype!r} is not a draft dtype: pass {ACCEPTED}")


@dataclass(frozen=True)
class DtypeProbe:
    """What ``dtype="auto"`` chose for a draft, and from what."""

    chosen: str  # a key of CHOICES
    float32_seconds: float | None = None  # median seconds of one probe round in float32; None: not timed
    bfloat16_seconds: float | None = None  # the same in bfloat16; None: not timed, or bf16 does not run here
    how: str = "measured"  # "measured", "cached" (read from the cache file) or "cuda" (the GPU rule, untimed)
    machine: str = ""  # the device in words (GPU name, or CPU model and threads)

    @property
    def dtype(self) -> torch.dtype:
        return CHOICES[self.chosen]

    @property
    def speedup(self) -> float | None:
        """float32's time over bfloat16's (above 1: bfloat16 was faster); None where either is missing."""
        if self.float32_seconds is None or not self.bfloat16_seconds:
            return None
        return self.float32_seconds / self.bfloat16_seconds

    def describe(self) -> str:
        """One line: the choice, how it was made, the timings."""
        if self.how == "cuda":
            return f"{self.chosen} (a CUDA target: bfloat16 where the GPU has it; {self.machine})"
        bf16 = "does not run" if self.bfloat16_seconds is None else f"{self.bfloat16_seconds * 1e3:.2f} ms"
        ratio = "" if self.speedup is None else f", bfloat16 {self.speedup:.2f}x as fast"
        return (f"{self.chosen} ({self.how} on {self.machine}: float32 {(self.float32_seconds or 0) * 1e3:.2f} ms, "
                f"bfloat16 {bf16} per probe round{ratio}; bfloat16 needs {MIN_SPEEDUP:.2f}x)")


def choose_dtype(float32_seconds: float, bf16_seconds: float | None, min_speedup: float = MIN_SPEEDUP) -> torch.dtype:
    """bfloat16 when it ran at least ``min_speedup`` times faster than float32 (``bf16_seconds``
    None or not a positive finite time: it did not run), else float32."""
    usable = bf16_seconds is not None and math.isfinite(bf16_seconds) and bf16_seconds > 0
    if usable and math.isfinite(float32_seconds) and float32_seconds >= min_speedup * bf16_seconds:
        return torch.bfloat16
    return torch.float32


def cuda_dtype(device: torch.device) -> torch.dtype:
    """bfloat16 on a GPU that runs it natively, else float32 (float16 is left out: a draft trained
    in float32 or bfloat16 may overflow it)."""
    with torch.cuda.device(device):
        try:
            native = torch.cuda.is_bf16_supported(including_emulation=False)
        except TypeError:  # a torch without the argument
            native = torch.cuda.is_bf16_supported()
    return torch.bfloat16 if native else torch.float32


def folder_identity(folder: Path) -> dict:
    """What identifies a saved draft's content cheaply: sha256 of its metadata and config files,
    size and mtime of its weights file (absent files are left out)."""
    out: dict = {}
    for name in (META_FILE, "config.json"):
        path = folder / name
        if path.is_file():
            out[name] = hashlib.sha256(path.read_bytes()).hexdigest()[:32]
    weights = folder / WEIGHTS_FILE
    if weights.is_file():
        stat = weights.stat()
        out[WEIGHTS_FILE] = [stat.st_size, stat.st_mtime_ns]
    return out


def choice_key(identity: dict, device: torch.device) -> dict:
    """Everything a measured choice depends on; its hash names the cache file."""
    return {
        "version": CHOICE_VERSION,
        "draft": identity,
        "device": device.type,
        "cpu": cpu_model(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "linear": linears.mode(),
        "probe": {"prefix": dtype_probe.PROBE_PREFIX, "widths": list(dtype_probe.PROBE_WIDTHS),
                  "min_speedup": MIN_SPEEDUP},
    }


def choice_file(key: dict, folder: Path) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    return folder / f"draft-dtype-{digest}.json"


def parse_choice(text: str, key: dict) -> DtypeProbe:
    """The choice a cache file's ``text`` holds for ``key`` (as JSON gives it back); ValueError
    when it is not JSON, holds another key, or a choice or times that measuring does not write."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise ValueError(f"it is not valid JSON ({type(error).__name__})") from None
    if not isinstance(data, dict) or data.get("format") != FILE_FORMAT:
        raise ValueError(f"it is not a {FILE_FORMAT!r} object")
    if data.get("key") != key:
        raise ValueError("it holds the choice of another draft, device or machine setting")
    if data.get("chosen") not in CHOICES:
        raise ValueError(f"'chosen' must be one of {sorted(CHOICES)}, got {data.get('chosen')!r}")
    bf16 = data.get("bfloat16_seconds")
    return DtypeProbe(chosen=data["chosen"], float32_seconds=parse_seconds(data.get("float32_seconds"), "float32_seconds"),
                      bfloat16_seconds=None if bf16 is None else parse_seconds(bf16, "bfloat16_seconds"),
                      how="cached", machine=str(data.get("machine", "")))


def read_choice(key: dict, folder: Path) -> DtypeProbe | None:
    """The cached choice of ``key`` in ``folder``; None when there is none or it cannot be used
    (then named in a warning: the caller measures again and rewrites it)."""
    return read_keyed_file(choice_file(key, folder), key, parse_choice, "draft dtype cache", logger)


def write_choice(key: dict, probe: DtypeProbe, folder: Path, source: Path | None = None) -> Path | None:
    """Write ``probe`` as ``key``'s cache file (through a temporary file, renamed); None, with a
    warning, where that fails."""
    path = choice_file(key, folder)
    tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
    body = {"format": FILE_FORMAT, "key": key, **{k: v for k, v in asdict(probe).items() if k != "how"},
            "speedup": probe.speedup, "draft": None if source is None else str(source)}
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(body, indent=1) + "\n")
        tmp.replace(path)
        return path
    except OSError as error:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        logger.warning("could not write the draft dtype cache %s: %s", path, error)
        return None


def target_device(target) -> torch.device:
    """Where the target's input embedding lives (a draft runs beside it)."""
    return target.get_input_embeddings().weight.device


def auto_dtype(model: torch.nn.Module, target, source: Path | None = None) -> DtypeProbe:
    """The dtype ``"auto"`` picks for ``model`` (a loaded draft or feature head) beside ``target``:
    the GPU rule on CUDA; elsewhere the cached choice of the draft folder ``source`` on this
    machine, else measured (:func:`opttree.loading.dtype_probe.probe_dtypes`) and cached. Without
    ``source`` nothing is cached."""
    device = target_device(target)
    if device.type == "cuda":
        probe = DtypeProbe(chosen="bfloat16" if cuda_dtype(device) == torch.bfloat16 else "float32", how="cuda",
                           machine=machine_name(device))
        logger.info("draft dtype for %s: %s", source or type(model).__name__, probe.describe())
        return probe
    mode = cache_mode()
    key = choice_key(folder_identity(source), device) if source is not None and mode != "off" else None
    with _probing:  # loads in several threads: one probe at a time, the later ones read its file
        probe = read_choice(key, cache_dir()) if key is not None and mode == "on" else None
        if probe is None:
            times = dtype_probe.probe_dtypes(model)
            chosen = choose_dtype(times.float32_seconds, times.bfloat16_seconds)
            probe = DtypeProbe(chosen=next(k for k, v in CHOICES.items() if v == chosen),
                               float32_seconds=times.float32_seconds, bfloat16_seconds=times.bfloat16_seconds,
                               machine=machine_name(device))
            if key is not None:
                write_choice(key, probe, cache_dir(), source)
    logger.info("draft dtype for %s: %s", source or type(model).__name__, probe.describe())
    return probe


def in_dtype(model: torch.nn.Module, dtype, target, source: Path | None = None) -> torch.nn.Module:
    """``model`` in ``dtype`` (see :func:`check_dtype`; "auto": :func:`auto_dtype`): itself where
    that is its dtype already (or ``dtype`` is None), else a copy in eval mode
    (:func:`~opttree.loading.dtype_probe.cast_copy`: what it shares with the target stays as it is)."""
    dtype = check_dtype(dtype)
    if isinstance(dtype, str):
        dtype = auto_dtype(model, target, source).dtype
    if dtype is None or model_dtype(model) == dtype:
        return model
    return cast_copy(model, dtype).eval()


__all__ = ["ACCEPTED", "AUTO", "CHOICES", "MIN_SPEEDUP", "DtypeProbe", "auto_dtype", "check_dtype", "choice_file",
           "choice_key", "choose_dtype", "cuda_dtype", "folder_identity", "in_dtype", "parse_choice", "read_choice",
           "write_choice"]
