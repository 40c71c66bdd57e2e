"""The stable Python API (docs/architecture.md, "Contracts"): run one stage on features you
already have, the same function the command line runs after extraction.

``robustbench_fm.evaluate(stage, features, manifest, **params)``; the manifest builders are
``robustbench_fm.data.build_manifest``; the encoders ``robustbench_fm.encoders.names/get/load``
and ``load_slide``."""
from __future__ import annotations

from .methods.run import evaluate

__all__ = ["evaluate"]
