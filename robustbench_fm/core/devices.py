"""Compute-device selection shared by extraction and the neighbour search, and the CPU cores a
process may use (decode workers). Importing it does not import torch (the data layer and a dry
run use :func:`usable_cores`)."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``auto`` picks CUDA when present, else CPU; anything else is passed to torch."""
    import torch  # lazy: this module is imported where torch must not be (usable_cores)

    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def usable_cores() -> int:
    """The cores this process may run on: its affinity mask (a Slurm job's allocation, not the
    node) where the platform has one, else the machine's count."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
