"""Dataset adapters: one module per source family; ``build_manifest(name, root, **options)``."""
from . import synthetic  # noqa: F401  (registers the synthetic datasets)
from .registry import Adapter, build_manifest, get, names, register

__all__ = ["Adapter", "build_manifest", "get", "names", "register"]
