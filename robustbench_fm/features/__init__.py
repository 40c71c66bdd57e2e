"""The feature store, its extraction engine and the parquet feature cache (docs/architecture.md,
"Contracts"). ``FeatureStore(cache_dir)`` looks a manifest's images up, has the engine
(:mod:`.engine`) embed only what it lacks and writes the manifest's view.

``extract(encoder, manifest, image_root, cache_root)`` (``extract_panel`` for several encoders)
has the store serve a manifest: each image is embedded once and read afterwards, whatever manifest
asks for it (entries of the earlier per-manifest layout are read, never written);
``load_features(path_or_dir, manifest)`` reads any features parquet (a cache entry folder, or
your own file with ``sample_id`` and ``embedding`` columns);
``skipped_ids(entry)`` names the rows skipped as unreadable (``on_bad_image="skip"``);
``verify_entry(entry, manifest)`` / ``verify_cache(root)`` re-check checksums and row counts.
"""
import importlib

from .cache import CACHE_FORMAT, SKIPPED_NAME, FeatureCache, FeatureCacheError, FeatureSet
from .key import cache_key, cache_key_fields
from .load import load_features, missing_shards, read_skipped, skipped_ids
from .store import FeatureStore
from .verify import VerifyReport, verify_cache, verify_entry

#: names of the extraction engine, imported on first use (the engine imports torchvision and the
#: encoders, seconds of start-up that reading a features parquet, e.g. ``robustbench_fm.evaluate``, does not need)
_LAZY = {"BAD_IMAGE_POLICIES": ".engine", "ExtractionInterrupted": ".engine", "ImageReadError": ".engine",
         "default_num_workers": ".engine", "extract": ".serve", "extract_panel": ".serve"}


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = ["BAD_IMAGE_POLICIES", "CACHE_FORMAT", "SKIPPED_NAME", "ExtractionInterrupted", "FeatureCache",
           "FeatureCacheError", "FeatureSet", "FeatureStore", "ImageReadError", "VerifyReport", "cache_key",
           "cache_key_fields", "default_num_workers", "extract", "extract_panel", "load_features", "missing_shards",
           "read_skipped", "skipped_ids", "verify_cache", "verify_entry"]
