"""Dataset adapters: one module per source family; ``build_manifest(name, root, **options)``."""
from . import chest, csv_manifest, ct, derm, fundus, mammo, natural, pathology, pathorob, synthetic  # noqa: F401  (register)
from .registry import Adapter, build_manifest, get, names, register

__all__ = ["Adapter", "build_manifest", "get", "names", "register"]
