"""Name -> EncoderSpec registry, and the library loaders that turn a spec into an Encoder."""
from __future__ import annotations

from typing import Callable

from ..registry import Registry
from .spec import EncoderSpec

SPECS: Registry[EncoderSpec] = Registry("encoder")
_LOADERS: dict[str, Callable] = {}


def register(spec: EncoderSpec) -> EncoderSpec:
    return SPECS.register(spec.name, spec)


def register_loader(library: str):
    """Decorator: ``fn(spec, weights, device, allow_remote_code) -> Encoder`` loads ``library``'s entries."""
    def deco(fn):
        _LOADERS[library] = fn
        return fn
    return deco


names, get = SPECS.names, SPECS.get


def loader(library: str) -> Callable:
    return _LOADERS[library]
