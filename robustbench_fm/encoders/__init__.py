"""Encoder registry: ``names()``, ``get(name)`` and ``load(name, weights=None, device="auto")``.

Nothing is downloaded at import time; hub ids are resolved only inside :func:`load`, which
honours a local weights file or folder and ``HF_HUB_OFFLINE``.
"""
from __future__ import annotations

from pathlib import Path

from . import catalog, loaders, synthetic  # noqa: F401  (register the loaders and the entries)
from .base import Encoder, build_transform, resolve_device
from .registry import get, loader, names
from .spec import EncoderSpec

__all__ = ["Encoder", "EncoderSpec", "build_transform", "get", "load", "names", "resolve_device"]


def load(name: str | EncoderSpec, weights: str | Path | None = None, device="auto",
         allow_remote_code: bool = True) -> Encoder:
    """Build the encoder ``name`` (or a spec) on ``device``.

    ``weights`` is a local checkpoint file or folder used instead of the hub download;
    ``allow_remote_code=False`` refuses entries whose spec sets ``trust_remote_code``.
    """
    spec = name if isinstance(name, EncoderSpec) else get(name)
    if spec.trust_remote_code and not allow_remote_code:
        raise PermissionError(f"encoder '{spec.name}' needs trust_remote_code and "
                              "security.allow_remote_code is false; enable it or pick another encoder")
    if weights is not None and not Path(weights).exists():
        raise FileNotFoundError(f"encoder '{spec.name}': weights '{weights}' not found; "
                                "point encoder.weights at a local checkpoint file or folder")
    return loader(spec.library)(spec, weights, resolve_device(device), allow_remote_code)
