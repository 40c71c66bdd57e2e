"""Name -> EncoderSpec registry, and the library loaders that turn a spec into an Encoder."""
from __future__ import annotations

import importlib
from typing import Callable

from ..core.registry import Registry
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


#: specs of the generic entries resolved in this process (``encoder=timm encoder.model=...``,
#: :mod:`.generic`), by their derived name: found by :func:`get`, not listed by :func:`names`
RESOLVED: dict[str, EncoderSpec] = {}

names = SPECS.names


def get(name: str) -> EncoderSpec:
    """The registry entry ``name``, or a generic entry resolved in this process (:mod:`.generic`)."""
    return RESOLVED[name] if name in RESOLVED else SPECS.get(name)


#: Modules whose import registers the loaders (``@register_loader``); imported on the first
#: :func:`loader` call because they import torch and the model libraries.
LOADER_MODULES = ("robustbench_fm.encoders.loaders", "robustbench_fm.encoders.synthetic",
                  "robustbench_fm.encoders.slide")


def loader(library: str) -> Callable:
    if library not in _LOADERS:
        for module in LOADER_MODULES:
            importlib.import_module(module)
    return _LOADERS[library]
