"""The extraction engine: decode -> transform -> forward -> shards of a feature-cache entry.

The feature store (:mod:`robustbench_fm.features.store`) calls it as its backend to fill the
chunks it found missing; nothing here looks images up or decides what to embed, and it fills
only the entries it is handed (``entry=`` / ``entries=``: it writes no layout of its own). To
embed a manifest call :func:`robustbench_fm.features.extract` (:mod:`..serve`), which goes through
the store.

- :mod:`.rows`: a row's image (readers, occlusion, bad-image policy), the shard writer with its
  partial files, padded forwards (:func:`embed_full_batch`), the :class:`FeatureSet` it returns;
- :mod:`.panel`: one decode pass for a panel of encoders (:func:`extract_panel`) and
  :func:`extract`, the same pass with one encoder.

``panel`` imports ``rows``; ``rows`` imports neither (tests/test_layers.py holds it).
"""
from ...data.images import BAD_IMAGE_POLICIES
from .panel import backend, default_panel_workers, extract, extract_panel
from .rows import (
    ExtractionInterrupted,
    FeatureSet,
    ImageReadError,
    default_num_workers,
    default_reader,
    embed_full_batch,
)

__all__ = ["BAD_IMAGE_POLICIES", "ExtractionInterrupted", "FeatureSet", "ImageReadError", "backend",
           "default_num_workers", "default_panel_workers", "default_reader", "embed_full_batch", "extract",
           "extract_panel"]
