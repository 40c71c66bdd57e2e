"""The methods: one package per paper (``candor``, ``croma``, ``spar``) plus trained ``heads``,
each registering its stages here when it is imported (its ``__init__`` calls :func:`register`
and imports nothing heavy; the stage module is imported on first use, lm-eval-harness style).

A stage's parameters are one frozen dataclass (:class:`~robustbench_fm.methods.params.StageParams`,
in ``methods/<paper>/params.py``) holding every default; the stage module sets ``PARAMS`` to it and
its ``run(features, manifest, finding, **params) -> Results`` parses them once
(``PARAMS.parse(params)``); :func:`check` validates a config's parameters before any heavy work
(names, types and values, one line each) and the command line's ``stage`` configs are generated
from the same class (:mod:`robustbench_fm.cli.configstore`). A stage module may add
``check_manifest`` (data checks before any image is embedded). A stage
that drives the encoder itself (occluded re-extraction, token sequences) defines
``run_job(job: JobContext) -> list[pd.DataFrame]`` instead and asks ``job.embedder`` for images
embedded; it never sees the Hydra config.

Methods are found without editing any central file: every subpackage of ``robustbench_fm.methods``,
every module named by the ``robustbench_fm.methods`` entry point group of an installed package,
and every module a run names in ``plugins=[my_pkg.my_method]`` (:func:`load_plugins`) is imported
once and registers its stages.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from importlib.metadata import entry_points
from types import ModuleType

from ..core.registry import Registry
from .params import StageParams


@dataclass(frozen=True)
class Method:
    """What a stage is, for the registry, the console, the reports and ``list stages``.

    ``module``: the stage module (imported on first :func:`get`). ``console_columns``: the columns
    the console table shows (all are saved). ``tables``: the module whose ``TABLES`` lists the
    paper-table builders of the paper (functions of that module). ``figures``: ``"module:function"``
    drawing the paper's figures for a report (:func:`robustbench_fm.report.html.figures`).
    ``tables_after_run``: a single (non-sweep) run builds the experiment's ``report.tables`` too.
    ``params``: the stage's parameters (its module's ``PARAMS``; importable without the stage).
    ``findings``: the command line's default ``stage.findings`` (an interpolation or a list).
    """

    name: str
    description: str
    module: str
    console_columns: tuple[str, ...] = ()
    tables: str | None = None
    figures: str | None = None
    tables_after_run: bool = False
    params: type[StageParams] | None = None
    findings: str | tuple[str, ...] = "${dataset.findings}"


METHODS: Registry[Method] = Registry("stage")
_discovered = False
#: the entry-point group through which an installed package adds methods
ENTRY_POINT_GROUP = "robustbench_fm.methods"


def register(method: Method) -> Method:
    """Add a stage (a method package's ``__init__`` calls this for each of its stages)."""
    return METHODS.register(method.name, method)


def _discover() -> None:
    """Import every method package once (each registers its stages) and the entry points."""
    global _discovered
    if _discovered:
        return
    _discovered = True
    for info in pkgutil.iter_modules(__path__):
        if info.ispkg:
            importlib.import_module(f"{__name__}.{info.name}")
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        importlib.import_module(ep.value.split(":")[0])


def load_plugins(modules) -> None:
    """Import the modules a run names in ``plugins`` (each registers its stages); a module that
    cannot be imported is one line naming it."""
    for name in modules or ():
        try:
            importlib.import_module(str(name))
        except ImportError as exc:
            raise ValueError(f"plugins: cannot import '{name}' ({exc}); install it or put it on PYTHONPATH") from None


def names() -> list[str]:
    """Every registered stage."""
    _discover()
    return METHODS.names()


def method(name: str) -> Method:
    """The registered stage ``name``; an unknown name fails with the close ones."""
    _discover()
    return METHODS.get(name)


def get(name: str) -> ModuleType:
    """The stage module registered as ``name`` (imported now); unknown names get close matches."""
    return importlib.import_module(method(name).module)


def check(name: str, params: dict) -> StageParams | None:
    """The parameters of stage ``name`` validated (unknown names, types, values: one line naming
    ``stage.params.<key>``) before any heavy work; a stage without a ``params`` class runs its
    module's ``check_params(**params)`` when it has one."""
    cls = method(name).params
    if cls is None:
        own = getattr(get(name), "check_params", None)
        if callable(own):
            own(**params)
        return None
    return cls.parse(params)


def descriptions() -> dict[str, str]:
    """name -> one-line description (``python -m robustbench_fm list stages``)."""
    return {n: method(n).description for n in names()}


def table_modules() -> list[str]:
    """The modules that declare paper tables (``TABLES``; CANDOR's ablation and control tables
    have their own, ``candor.controls``): the package's in alphabetical order, then the plugins'."""
    _discover()
    return sorted({m.tables for m in METHODS.values() if m.tables}, key=_shipped_first)


def figure_makers() -> list[str]:
    """The ``module:function`` figure makers of the registered methods, one per paper, ordered as
    :func:`table_modules` (a report's figures come in this order whatever was imported first)."""
    _discover()
    return sorted({m.figures for m in METHODS.values() if m.figures}, key=_shipped_first)


def _shipped_first(module: str) -> tuple[bool, str]:
    return not module.startswith(f"{__name__}."), module


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

