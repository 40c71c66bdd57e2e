"""Compute-device selection shared by extraction and the neighbour search, and the CPU cores a
process may use (decode workers). Importing it does not import torch (the data layer and a dry
run use :func:`usable_cores`)."""
from __future__ import annotations

import contextlib
import os
import platform
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from .errors import InvalidSetting

if TYPE_CHECKING:
    import torch


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``auto`` picks CUDA when present, else CPU; anything else is passed to torch."""
    import torch  # lazy: this module is imported where torch must not be (usable_cores)

    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def check_device(device: str) -> str:
    """``device`` as the user set it, checked before any data is read: ``auto`` and ``cpu`` as
    they are (no torch import); a CUDA device this machine has not got (no CUDA build or driver,
    or an index past the last GPU) or a name torch does not know is one line naming ``device=``
    and the fix (instead of a torch error deep in the extraction)."""
    text = str(device)
    if text in ("auto", "cpu"):
        return text
    import torch

    try:
        parsed = torch.device(text)
    except (RuntimeError, ValueError, TypeError):
        raise InvalidSetting(f"device={text}: not a device torch knows; use device=auto (CUDA when present), "
                             "device=cpu or device=cuda[:N]") from None
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise InvalidSetting(f"device={text}: this machine has no usable CUDA device (torch {torch.__version__}"
                                 f"{', built without CUDA' if torch.version.cuda is None else ''}); use device=cpu "
                                 "or device=auto")
        if parsed.index is not None and parsed.index >= count:
            raise InvalidSetting(f"device={text}: this machine has {count} CUDA device{'s' if count != 1 else ''} "
                                 f"(cuda:0 to cuda:{count - 1}); use one of those or device=auto")
    return text


def usable_cores() -> int:
    """The cores this process may run on: its affinity mask (a Slurm job's allocation, not the
    node) where the platform has one, else the machine's count."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[int]:
    """Torch's CPU intra-op threads set to ``n`` inside the block (0: unchanged), restored after it;
    yields the count in force before. One thread is what many small tensor ops want: when the cores
    are busy the thread pool's synchronisation costs more than the op (measured: a 224 px transform
    1.7 ms vs 22 ms on a loaded 2-core machine; a shortlist's gathers 0.2-1 ms vs 15-25 ms)."""
    import torch  # lazy, as above

    before = torch.get_num_threads()
    change = n > 0 and n != before
    if change:
        torch.set_num_threads(n)
    try:
        yield before
    finally:
        if change:
            torch.set_num_threads(before)


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; the platform's processor elsewhere): what every
    benchmark's JSON records, since its ratios depend on it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
