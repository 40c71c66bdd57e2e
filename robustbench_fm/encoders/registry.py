"""Name -> EncoderSpec registry, and the library loaders that turn a spec into an Encoder."""
from __future__ import annotations

import difflib
from typing import Callable

from .spec import EncoderSpec

_SPECS: dict[str, EncoderSpec] = {}
_LOADERS: dict[str, Callable] = {}


def register(spec: EncoderSpec) -> EncoderSpec:
    if spec.name in _SPECS:
        raise ValueError(f"encoder '{spec.name}' registered twice")
    _SPECS[spec.name] = spec
    return spec


def register_loader(library: str):
    """Decorator: ``fn(spec, weights, device, allow_remote_code) -> Encoder`` loads ``library``'s entries."""
    def deco(fn):
        _LOADERS[library] = fn
        return fn
    return deco


def names() -> list[str]:
    return sorted(_SPECS)


def get(name: str) -> EncoderSpec:
    if name not in _SPECS:
        close = difflib.get_close_matches(name, _SPECS, n=3)
        hint = f"did you mean {', '.join(close)}?" if close else "run 'python -m robustbench_fm list encoders'"
        raise KeyError(f"unknown encoder '{name}'; {hint}")
    return _SPECS[name]


def loader(library: str) -> Callable:
    return _LOADERS[library]
