"""Metric stages. Each module exposes ``run(features, manifest, **params) -> Results`` whose
keyword defaults are the paper's values."""
from __future__ import annotations

from types import ModuleType

from ..registry import Registry
from . import candor, croma, shortcut

STAGES: Registry[ModuleType] = Registry("stage")
STAGES.register("candor", candor)
STAGES.register("shortcut", shortcut)
STAGES.register("croma", croma)
names, get = STAGES.names, STAGES.get
