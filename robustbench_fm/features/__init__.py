"""Extraction engine and the parquet feature cache (DESIGN.md, "Feature cache").

``extract(encoder, manifest, image_root, cache_root)`` embeds a manifest once and reuses the
cache afterwards; ``load_features(path_or_dir, manifest)`` reads any features parquet (a cache
entry folder, or your own file with ``sample_id`` and ``embedding`` columns).
"""
from .cache import (CACHE_FORMAT, FeatureCache, FeatureCacheError, cache_key, cache_key_fields,
                    load_features)
from .extract import FeatureSet, ImageReadError, default_num_workers, extract

__all__ = ["CACHE_FORMAT", "FeatureCache", "FeatureCacheError", "FeatureSet", "ImageReadError",
           "cache_key", "cache_key_fields", "default_num_workers", "extract", "load_features"]
