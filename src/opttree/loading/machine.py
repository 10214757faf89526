"""The machine a timing was taken on, in words: the CPU's model name, the GPU's name, torch's threads.

Timed choices (:mod:`.precision`, :mod:`.draft_dtype`) and the benchmark's header name the machine
with these; CPU flags are reported beside a measurement, never used to decide.
"""

from __future__ import annotations

import platform
from pathlib import Path

import torch


def machine_name(device: torch.device | str) -> str:
    """The device as a person would name it: the GPU's name, or the CPU's model name and threads."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{cpu_model()}, {torch.get_num_threads()} threads"


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; the platform's name elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def bf16_flags() -> list[str]:
    """The CPU's bf16-related flags (reported next to the measurement; they decide nothing)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return sorted(f for f in flags if f in ("amx_bf16", "amx_tile", "avx512_bf16", "avx512f", "avx2"))


__all__ = ["bf16_flags", "cpu_model", "machine_name"]
