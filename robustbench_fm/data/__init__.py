"""Dataset adapters: one module per source family; ``build_manifest(name, root, **options)``."""
from . import (  # noqa: F401  (register the adapters)
    chest,
    csv_manifest,
    ct,
    derm,
    fundus,
    mammo,
    mnist,
    natural,
    pathology,
    pathorob,
    pool,
    synthetic,
)
from .registry import Adapter, build_manifest, get, names, register

__all__ = ["Adapter", "build_manifest", "get", "names", "register"]
