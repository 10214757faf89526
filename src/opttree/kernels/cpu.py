"""What this CPU and this torch build can run, as torch and oneDNN report it; and how big its
last-level cache is, as Linux reports it (:func:`last_level_cache_bytes`).

The kernels offered by :func:`opttree.kernels.linears.candidates` are those this answers yes to. It is
asked of torch, never read from ``/proc/cpuinfo``, so it follows the caps torch and oneDNN take from
the environment: ``ONEDNN_MAX_CPU_ISA=AVX2`` makes oneDNN (and so this) answer as a CPU without
AVX-512 would, and ``ATEN_CPU_CAPABILITY=avx2`` caps torch's own vectorised kernels. That is how the
test suite runs its kernel- and dtype-choice tests as an AVX2-only CPU would, on any machine
(``tests/test_cpu_caps.py``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import torch

CACHE_FOLDER = Path("/sys/devices/system/cpu/cpu0/cache")  # Linux's index*/level and index*/size


@dataclass(frozen=True)
class CpuSupport:
    """The CPU kernels this process can run."""

    onednn: bool  # oneDNN's packed linear exists in this torch build (a CPU build with mkldnn)
    onednn_bf16: bool  # ... and oneDNN runs bfloat16 here (its own check: AVX-512 BW/VL/DQ or AVX-NE-CONVERT
    #                     on x86, bf16 on Arm; ONEDNN_MAX_CPU_ISA lowers it)
    aten_isa: str  # torch's vector ISA for its own kernels ("AVX2", "AVX512", ...; ATEN_CPU_CAPABILITY lowers it)

    def describe(self) -> str:
        """One line for a report: ``"aten AVX2, oneDNN (float32 only)"``."""
        onednn = "no oneDNN" if not self.onednn else "oneDNN" + ("" if self.onednn_bf16 else " (float32 only)")
        return f"aten {self.aten_isa}, {onednn}"


def _onednn_linear_built() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


@functools.cache
def cpu_support() -> CpuSupport:
    """This process's :class:`CpuSupport` (asked once: the caps are read when torch loads)."""
    onednn = _onednn_linear_built()
    return CpuSupport(
        onednn=onednn,
        onednn_bf16=onednn and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
        aten_isa=torch.backends.cpu.get_cpu_capability(),
    )


def cache_size_bytes(text: str) -> int | None:
    """Linux's cache size text (``"32768K"``, ``"1024K"``, ``"2M"``) in bytes; None if unreadable."""
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    digits = text[:-1] if text[-1:] in "KMG" else text
    return int(digits) * scale if digits.isdigit() else None


def read_last_level_cache(folder: Path) -> int | None:
    """The size in bytes of the highest-level cache listed under ``folder`` (``index*/level``,
    ``index*/size``); None where none can be read."""
    levels = []
    for index in sorted(folder.glob("index*")):
        try:
            level, size = int((index / "level").read_text()), cache_size_bytes((index / "size").read_text())
        except (OSError, ValueError):
            continue
        if size:
            levels.append((level, size))
    return max(levels)[1] if levels else None


@functools.cache
def last_level_cache_bytes() -> int | None:
    """This CPU's last-level cache in bytes, as Linux lists it for CPU 0 (a VM's is its host's); None
    where it lists none (another OS, a container without ``/sys``)."""
    return read_last_level_cache(CACHE_FOLDER)


__all__ = ["CpuSupport", "cache_size_bytes", "cpu_support", "last_level_cache_bytes", "read_last_level_cache"]
