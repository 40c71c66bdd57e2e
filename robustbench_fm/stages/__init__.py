"""Metric stages. Each module exposes ``run(features, manifest, **params) -> Results`` whose
keyword defaults are the paper's values.

A stage that needs the encoder itself (occluded re-extraction, token-sequence heads, finetuning)
also defines ``run_job(job, cfg, manifest, out_dir) -> list[pd.DataFrame]``; the app then calls it
instead of extracting pooled features and calling ``run``.

Modules are imported on first use, so a stage with heavy optional dependencies costs nothing
until it is asked for.
"""
from __future__ import annotations

import importlib
from types import ModuleType

from ..registry import Registry

STAGES: Registry[str] = Registry("stage")
for _name, _module in {
    "candor": "candor",
    "croma": "croma",
    "shortcut": "shortcut",
    "retention": "retention",
    "linear_head": "heads",
    "mlp_head": "heads",
    "logme": "logme",
    "error_detection": "error_detection",
    "candor_heads": "candor_heads",
    "spar": "spar",
}.items():
    STAGES.register(_name, f"{__name__}.{_module}")
names = STAGES.names


def missing_column(stage: str, column: str, param: str, columns) -> ValueError:
    """The one-line error of a stage whose manifest lacks ``column`` (the value of parameter
    ``param``): the command-line override that names another column (``stage.findings=[...]`` for
    the finding, ``stage.params.<param>=...`` otherwise; ``param=`` in Python) and the columns
    the manifest has."""
    override = "stage.findings=[<column>]" if param == "finding" else f"stage.params.{param}=<column>"
    names = [str(c) for c in columns]
    return ValueError(f"{stage}: the manifest has no column '{column}' ({param}); add it, or name one of its "
                      f"columns with {override} ({param}= in Python; columns: {', '.join(names[:12])}"
                      f"{', ...' if len(names) > 12 else ''})")


def get(name: str) -> ModuleType:
    """The stage module registered as ``name`` (imported now); unknown names get close matches."""
    return importlib.import_module(STAGES.get(name))
