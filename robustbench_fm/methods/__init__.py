"""The methods: one package per paper (``candor``, ``croma``, ``spar``) plus trained ``heads``,
each registering its stages here when it is imported (its ``__init__`` calls :func:`register`
and imports nothing heavy; the stage module is imported on first use, lm-eval-harness style).

A stage module exposes ``run(features, manifest, finding, **params) -> Results`` and usually
``check_params(**params)`` (one-line errors before any heavy work) and ``check_manifest``. A stage
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
import inspect
import pkgutil
from dataclasses import dataclass
from importlib.metadata import entry_points
from types import ModuleType

from ..core.registry import Registry


@dataclass(frozen=True)
class Method:
    """What a stage is, for the registry, the console, the reports and ``list stages``.

    ``module``: the stage module (imported on first :func:`get`). ``console_columns``: the columns
    the console table shows (all are saved). ``tables``: the module whose ``TABLES`` lists the
    paper-table builders of the paper (functions of that module). ``figures``: ``"module:function"``
    drawing the paper's figures for a report (:func:`robustbench_fm.report.html.figures`).
    ``tables_after_run``: a single (non-sweep) run builds the experiment's ``report.tables`` too.
    """

    name: str
    description: str
    module: str
    console_columns: tuple[str, ...] = ()
    tables: str | None = None
    figures: str | None = None
    tables_after_run: bool = False


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


def descriptions() -> dict[str, str]:
    """name -> one-line description (``python -m robustbench_fm list stages``)."""
    return {n: method(n).description for n in names()}


def table_modules() -> list[str]:
    """The modules that declare paper tables (``TABLES``), one per paper: the package's in
    alphabetical order, then the plugins'."""
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
