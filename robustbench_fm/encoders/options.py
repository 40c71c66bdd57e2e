"""What the user set for one encoder (torch-free; the pipeline's plan holds it and the feature
Embedder applies it)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EncoderOptions:
    """What the user set for one encoder (``encoder.weights=...`` and friends); unset = the
    registry's defaults. ``name``: the entry they apply to (a generic entry,
    ``encoder=timm|hf|open_clip``, by its resolved name, with its local weights); ``embedding``
    replaces the spec's pooling (e.g. the CLS vs patch-mean ablation); ``batch_size`` overrides
    the run's; ``tile_weights`` is a slide encoder's tile encoder's checkpoint."""

    name: str | None = None
    weights: str | None = None
    tile_weights: str | None = None
    embedding: str | None = None
    batch_size: int | None = None
