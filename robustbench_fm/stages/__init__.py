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
#: name -> (module, one-line description shown by ``python -m robustbench_fm list stages``)
_STAGES = {
    "candor": ("candor", "CANDOR discordance D, D_all and margin AUROC per matched group (chance = 0.5)"),
    "croma": ("croma", "CRoMa, RI and MaRI: is local geometry organised by biology or by the centre?"),
    "shortcut": ("shortcut", "PathoROB's confounder-biased linear probe: APD and nIPD"),
    "retention": ("retention", "CANDOR erasure retention: re-embed positives with the expert box filled"),
    "linear_head": ("heads", "a linear head per finding: AUROC, operating point at 0.8 sensitivity"),
    "mlp_head": ("heads", "a 256-unit MLP head per finding: AUROC, operating point at 0.8 sensitivity"),
    "logme": ("logme", "LogME transferability score per finding"),
    "error_detection": ("error_detection", "failure detection: MSP, energy, kNN, Mahalanobis, impurity r, DM proxy"),
    "candor_heads": ("candor_heads", "head errors joined with CANDOR discordance per sample (Table 4)"),
    "spar": ("spar", "SPAR-Bench spatial probes (Levels 1-3) on token sequences, frozen or finetuned"),
}
DESCRIPTIONS = {name: description for name, (_, description) in _STAGES.items()}
for _name, (_module, _) in _STAGES.items():
    STAGES.register(_name, f"{__name__}.{_module}")
names = STAGES.names


def get(name: str) -> ModuleType:
    """The stage module registered as ``name`` (imported now); unknown names get close matches."""
    return importlib.import_module(STAGES.get(name))
