"""Compute-device selection shared by extraction and the neighbour search."""
from __future__ import annotations

import torch


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``auto`` picks CUDA when present, else CPU; anything else is passed to torch."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)
