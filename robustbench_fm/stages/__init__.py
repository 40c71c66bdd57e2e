"""Metric stages. Each module exposes ``run(features, manifest, **params) -> Results`` and
``DEFAULTS`` (its parameters with their paper values)."""
from __future__ import annotations

import difflib
from types import ModuleType

from . import candor

STAGES: dict[str, ModuleType] = {"candor": candor}


def names() -> list[str]:
    return sorted(STAGES)


def get(name: str) -> ModuleType:
    if name not in STAGES:
        close = difflib.get_close_matches(name, STAGES, n=3)
        hint = f"did you mean {', '.join(close)}?" if close else f"known stages: {', '.join(names())}"
        raise KeyError(f"unknown stage '{name}'; {hint}")
    return STAGES[name]
