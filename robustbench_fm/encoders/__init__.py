"""Encoder registry: ``names()``, ``get(name)``, ``load(name, weights=None, device="auto")`` for
image encoders and ``load_slide(name, ...)`` for slide-level aggregators of tile embeddings.

Nothing is downloaded at import time; hub ids are resolved only inside :func:`load`, which
honours a local weights file or folder and ``HF_HUB_OFFLINE``.
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

from ..core.errors import InvalidSetting, MissingInput
from . import catalog  # noqa: F401  (register the entries: specs only, no torch)
from .registry import get, loader, names
from .spec import ALLOW_REMOTE_CODE, EncoderSpec, RemoteCodeRefused, check_remote_code

if TYPE_CHECKING:
    from .base import Encoder, build_transform, resolve_device
    from .slide import SlideEncoder

# Names that need torch are imported on first use, so that `list`, `doctor` and the registry
# (``names``/``get``) answer without importing torch (about 2 s).
_LAZY = {"Encoder": "base", "build_transform": "base", "resolve_device": "base", "SlideEncoder": "slide"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = ["ALLOW_REMOTE_CODE", "Encoder", "EncoderSpec", "RemoteCodeRefused", "SlideEncoder", "build_transform", "get",
           "load", "load_slide", "names", "resolve_device"]


def _check(spec: EncoderSpec, weights, allow_remote_code: bool) -> None:
    check_remote_code(spec, allow_remote_code)  # first: before any weights are looked up or downloaded
    if weights is not None and not Path(weights).exists():
        raise MissingInput(f"encoder '{spec.name}': weights '{weights}' not found; "
                           "point encoder.weights at a local checkpoint file or folder")


def load(name: str | EncoderSpec, weights: str | Path | None = None, device="auto",
         allow_remote_code: bool = ALLOW_REMOTE_CODE) -> Encoder:
    """Build the encoder ``name`` (or a spec) on ``device``.

    ``weights`` is a local checkpoint file or folder used instead of the hub download;
    Entries whose spec sets ``trust_remote_code`` (code from the hub) are refused unless
    ``allow_remote_code=True`` (default :data:`ALLOW_REMOTE_CODE`, off; ``security.allow_remote_code``).
    """
    spec = name if isinstance(name, EncoderSpec) else get(name)
    if spec.is_slide:
        raise InvalidSetting(f"encoder '{spec.name}' aggregates '{spec.tile_encoder}' tile embeddings into a slide "
                             f"embedding; embed the tiles with encoder={spec.tile_encoder} and use "
                             f"robustbench_fm.encoders.load_slide('{spec.name}')")
    _check(spec, weights, allow_remote_code)
    from .base import resolve_device  # lazy: imports torch

    return loader(spec.library)(spec, weights, resolve_device(device), allow_remote_code)


def load_slide(name: str | EncoderSpec, weights: str | Path | None = None, device="auto",
               allow_remote_code: bool = ALLOW_REMOTE_CODE) -> SlideEncoder:
    """Build the slide-level aggregator ``name``: ``.embed_slide(tiles [N, D_tile], coords [N, 2])``."""
    spec = name if isinstance(name, EncoderSpec) else get(name)
    if not spec.is_slide:
        raise InvalidSetting(f"encoder '{spec.name}' embeds images; use robustbench_fm.encoders.load('{spec.name}')")
    _check(spec, weights, allow_remote_code)
    from .base import resolve_device  # lazy: imports torch

    return loader(spec.library)(spec, weights, resolve_device(device), allow_remote_code)
