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
import inspect
from types import ModuleType

from ..core.registry import Registry

STAGES: Registry[str] = Registry("stage")
#: name -> (module, one-line description shown by ``python -m robustbench_fm list stages``)
_STAGES = {
    "candor": ("candor.stage", "CANDOR discordance D, D_all and margin AUROC per matched group (chance = 0.5)"),
    "croma": ("croma.stage", "CRoMa, RI and MaRI: is local geometry organised by biology or by the centre?"),
    "shortcut": ("croma.shortcut", "PathoROB's confounder-biased linear probe: APD and nIPD"),
    "retention": ("candor.retention", "CANDOR erasure retention: re-embed positives with the expert box filled"),
    "linear_head": ("heads.stage", "a linear head per finding: AUROC, operating point at 0.8 sensitivity"),
    "mlp_head": ("heads.stage", "a 256-unit MLP head per finding: AUROC, operating point at 0.8 sensitivity"),
    "logme": ("heads.logme_stage", "LogME transferability score per finding"),
    "error_detection": ("heads.error_detection",
                        "failure detection: MSP, energy, kNN, Mahalanobis, impurity r, DM proxy"),
    "candor_heads": ("heads.candor_heads", "head errors joined with CANDOR discordance per sample (Table 4)"),
    "spar": ("spar.stage", "SPAR-Bench spatial probes (Levels 1-3) on token sequences, frozen or finetuned"),
}
DESCRIPTIONS = {name: description for name, (_, description) in _STAGES.items()}
for _name, (_module, _) in _STAGES.items():
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


#: what a parameter's default says it takes: a description and a test of a value
_KINDS = {
    bool: ("true or false", lambda v: isinstance(v, bool)),
    int: ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    float: ("a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)),
    str: ("a string", lambda v: isinstance(v, str)),
    list: ("a list, e.g. [1,2]", lambda v: isinstance(v, (list, tuple))),
}


def _expected(param: inspect.Parameter) -> tuple[type | None, bool]:
    """(the type ``param`` takes, whether None is allowed) from its default, or from its annotation
    when the default is None (``k: int | None = None``); (None, True) when neither says."""
    default = param.default
    if default is inspect.Parameter.empty:
        return None, True
    if isinstance(default, (list, tuple)):
        return list, False
    if type(default) in _KINDS:
        return type(default), False
    annotation = str(param.annotation).replace(" ", "") if default is None else ""
    for kind in (bool, int, float, str):
        if annotation in (f"{kind.__name__}|None", f"None|{kind.__name__}", f"Optional[{kind.__name__}]"):
            return kind, True
    return None, True


def check_param_types(name: str, params: dict) -> None:
    """One line naming ``stage.params.<key>`` and the type it takes, for a value of another type
    (e.g. ``stage.params.k=abc``); the stage's ``run`` / ``check_params`` defaults say the type."""
    module = get(name)
    signatures = [inspect.signature(f) for f in (getattr(module, "run", None), getattr(module, "check_params", None))
                  if callable(f)]
    for key, value in params.items():
        param = next((s.parameters[key] for s in signatures if key in s.parameters), None)
        kind, nullable = _expected(param) if param is not None else (None, True)
        if kind is None or (value is None and nullable):
            continue
        what, ok = _KINDS[kind]
        if value is None or not ok(value):
            raise ValueError(f"{name}: stage.params.{key}={_yaml(value)} must be {what}"
                             f"{' or null' if nullable else ''} (default: {_yaml(param.default)})")


def _yaml(value) -> str:
    """A value as a command-line override writes it (true, null, [1,2], abc)."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_yaml(v) for v in value) + "]"
    return str(value)
