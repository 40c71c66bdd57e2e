"""Name -> EncoderSpec registry, and the library loaders that turn a spec into an Encoder."""
from __future__ import annotations

import importlib
from typing import Callable

from ..core.registry import Registry
from .spec import ALLOW_REMOTE_CODE, EncoderSpec

SPECS: Registry[EncoderSpec] = Registry("encoder")
_LOADERS: dict[str, Callable] = {}
#: loaders by weights source: the scheme of an entry's ``hub_id`` (``package:<import name>/<file>``,
#: a checkpoint shipped inside an installed Python package) when its weights do not come from the
#: library's own hub; such an entry is loaded by its source's loader whatever its library
_SOURCES: dict[str, Callable] = {}


def register(spec: EncoderSpec) -> EncoderSpec:
    return SPECS.register(spec.name, spec)


def register_loader(library: str):
    """Decorator: ``fn(spec, weights, device, allow_remote_code) -> Encoder`` loads ``library``'s entries."""
    def deco(fn):
        _LOADERS[library] = fn
        return fn
    return deco


def register_source(scheme: str):
    """Decorator: ``fn(spec, weights, device, allow_remote_code) -> Encoder`` loads the entries whose
    ``hub_id`` starts with ``<scheme>:``."""
    def deco(fn):
        _SOURCES[scheme] = fn
        return fn
    return deco


#: specs of the generic entries resolved in this process (``encoder=timm encoder.model=...``,
#: :mod:`.generic`), by their derived name: found by :func:`get`, not listed by :func:`names`
RESOLVED: dict[str, EncoderSpec] = {}

names = SPECS.names


def get(name: str) -> EncoderSpec:
    """The registry entry ``name``, or a generic entry resolved in this process (:mod:`.generic`)."""
    return RESOLVED[name] if name in RESOLVED else SPECS.get(name)


#: Modules whose import registers the loaders (``@register_loader``, ``@register_source``); imported on the first
#: :func:`loader` call because they import torch and the model libraries.
LOADER_MODULES = ("robustbench_fm.encoders.loaders", "robustbench_fm.encoders.synthetic",
                  "robustbench_fm.encoders.slide", "robustbench_fm.encoders.loaders.package_weights")


def loader(library: str) -> Callable:
    """``fn(spec, weights, device, allow_remote_code) -> Encoder`` for ``library``'s entries; an
    entry whose ``hub_id`` names a registered weights source (``package:...``) goes to that
    source's loader instead."""
    for module in LOADER_MODULES:  # after the first call: a lookup in sys.modules
        importlib.import_module(module)
    by_library = _LOADERS[library]

    def load(spec: EncoderSpec, weights, device, allow_remote_code: bool = ALLOW_REMOTE_CODE):
        scheme, sep, _ = spec.hub_id.partition(":")
        fn = _SOURCES.get(scheme, by_library) if sep else by_library
        return fn(spec, weights, device, allow_remote_code)
    return load
