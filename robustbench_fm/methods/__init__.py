"""The methods: one package per paper (``candor``, ``croma``, ``spar``) plus trained ``heads``,
each registering its stages here when it is imported (its ``__init__`` calls :func:`register`
and imports nothing heavy; the stage module is imported on first use, lm-eval-harness style).

A stage's parameters are one frozen dataclass (:class:`~robustbench_fm.methods.params.StageParams`,
in ``methods/<paper>/params.py``) holding every default; the stage module sets ``PARAMS`` to it and
its ``run(features, manifest, finding, params=None, **kw) -> Results`` receives the typed object the
plan built (``PARAMS.parse(params, **kw)`` returns it as it is; a Python caller's keywords are parsed;
:func:`~robustbench_fm.methods.params.with_params`); :func:`check` validates a config's parameters before any heavy work
(names, types and values, one line each) and the command line's ``stage`` configs are generated
from the same class (:mod:`robustbench_fm.pipeline.configstore`). A stage module may add
``check_manifest`` (data checks before any image is embedded). A stage
that drives the encoder itself (occluded re-extraction, token sequences) defines
``run_job(job: JobContext) -> list[pd.DataFrame]`` instead and asks ``job.embedder`` for images
embedded; it never sees the Hydra config.

Everything the console, the long format and the reports know of a stage is in its :class:`Method`
declaration, one per stage: its display name, headline metrics with their direction
(:class:`Metric`), how its summary's columns are read (group, setting and count columns), whether it
takes all findings in one call, its "How to read this" text and its figure maker. A method
outside the package gets the same report as a shipped one.

Methods are found without editing any central file: every subpackage of ``robustbench_fm.methods``,
every module named by the ``robustbench_fm.methods`` entry point group of an installed package,
and every module a run names in ``plugins=[my_pkg.my_method]`` (:func:`load_plugins`) is imported
once and registers its stages.
"""
from __future__ import annotations

import importlib
import pkgutil
import re
from dataclasses import dataclass
from functools import cache
from importlib.metadata import entry_points
from types import ModuleType

from ..core.errors import InvalidSetting, message
from ..core.registry import Registry
from ..core.stats import PAIRED_KINDS
from .params import StageParams

#: a ``guide`` that names where its text is, ``package.module:ATTRIBUTE`` (imported on first use)
_REFERENCE = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
BETTER = ("higher", "lower")


@dataclass(frozen=True)
class Metric:
    """A headline metric of a stage and which way is better (``"higher"`` or ``"lower"``)."""

    name: str
    better: str

    def __str__(self) -> str:
        return f"{self.name} ({self.better} is better)"


@dataclass(frozen=True)
class Paired:
    """A headline metric a stage offers for paired comparisons between encoders (issue 46), computed
    again from its per-item table: ``kind`` ``mean`` (of column ``value``), ``ratio`` (Σ ``value`` / Σ
    ``other``), ``median`` (of ``value``) or ``auroc`` (``value`` the score, ``other`` the 0/1 label);
    ``where`` a boolean column selecting the metric's items (all when empty); ``pool_weight`` a column
    summed per stratum to weight the strata of a pooled row (the strata's statistics are then averaged
    with those weights, as CANDOR pools the groups' margin AUROCs by their queries; empty: the pooled
    row's items are one set). ``better``: which way is better (``"higher"`` or ``"lower"``), declared for
    every compared metric (empty: the method's headline :class:`Metric` of the same name gives it; a
    metric with neither is not compared, and the notes say so: never a default). ``bank``: a column of
    the table holding each item's share of its cluster's influence on the metric through the other
    items' values (CANDOR: a patient's images as bank members of other queries,
    :mod:`robustbench_fm.methods.candor.influence`); every item of the row then enters the resampling
    (those outside ``where`` with their share only) and each resample adds the clusters' shares times
    their multiplicity − 1 (:func:`robustbench_fm.core.stats.paired_bootstrap` ``linear``), so the
    comparison redraws both roles of a cluster. ``not_compared``: why
    the metric is not compared (one line, shown in the notes), for a metric whose per-item values depend
    on the other items in ways the cluster bootstrap does not redraw (a score against fixed banks, a
    kNN graph, a trained head: docs/comparisons.md "What is compared"); empty: compared."""

    metric: str
    kind: str
    value: str
    other: str = ""
    where: str = ""
    pool_weight: str = ""
    better: str = ""
    not_compared: str = ""
    bank: str = ""

    def __post_init__(self) -> None:
        if self.better not in ("", *BETTER):
            raise InvalidSetting(f"paired metric {self.metric}: better='{self.better}'; use 'higher' or 'lower'")
        if self.kind not in PAIRED_KINDS:
            raise InvalidSetting(f"paired metric {self.metric}: kind '{self.kind}' is not one of "
                                 f"{', '.join(PAIRED_KINDS)}")
        if self.kind in ("ratio", "auroc") and not self.other:
            raise InvalidSetting(f"paired metric {self.metric}: kind '{self.kind}' needs other= (the "
                                 f"{'denominator' if self.kind == 'ratio' else 'label'} column)")


@dataclass(frozen=True)
class Pairing:
    """What a stage's saved per-item table offers for paired comparisons between encoders (issue 46):
    ``metrics`` (:class:`Paired`), the ``table`` that holds the items (``per_sample`` or ``items``, the
    file ``<table>.parquet`` of each result folder), the ``item`` column naming an item (the same item
    for every encoder: a query, a tile, a question), the ``cluster`` column the bootstrap resamples
    (patients; slides; volumes), the ``rows`` columns naming the summary row an item belongs to (e.g.
    finding, target, matched group), and ``pool``: a row column over which a pooled row is added too
    (named ``pooled``, e.g. CANDOR's ``__pooled__`` over matched groups); ``mean_over``: a row column
    whose pooled rows are averaged with equal weights into a row named ``mean`` (CANDOR's one-vs-rest
    ``__mean__`` over classes); ``unit``: what a cluster is, in the verdict's words ("too few patients")."""

    metrics: tuple[Paired, ...]
    cluster: str = "cluster"
    item: str = "sample_id"
    rows: tuple[str, ...] = ()
    pool: str = ""
    pooled: str = "__pooled__"
    table: str = "per_sample"
    mean_over: str = ""
    mean: str = "__mean__"
    unit: str = "patients"


@dataclass(frozen=True)
class Method:
    """What a stage is, for the registry, the console, the long format, the reports and
    ``list stages``: the one declaration of a stage (``name``, ``description`` and ``module`` are
    required; every other field has a default that a plugin may leave).

    ``module``: the stage module (imported on first :func:`get`). ``display_name``: how reports
    name the stage in titles and in "How to read this" (default: ``name``). ``headline``: the
    metrics of the per-encoder summary, each a :class:`Metric` or a ``(name, "higher"|"lower")``
    pair (empty: every metric). ``guide``: the "How to read this" text, or a
    ``"package.module:ATTRIBUTE"`` naming a string loaded on first use; paragraphs are separated by
    a blank line, line breaks inside one are spaces, and ``{param}`` is the value the run gave the
    stage's parameter ``param`` (its default otherwise; ``{{`` for a brace). Without one, a report
    lists the headline metrics and their direction.

    How the stage's ``summary`` is read (:mod:`robustbench_fm.report.long_format`):
    ``group_columns`` are joined into the row's group (e.g. CANDOR's matched group and target),
    ``param_columns`` are settings, not metrics (e.g. ``k``), ``count_column`` is the row's ``n``;
    ``integer_columns`` are further columns printed as integers where they hold whole numbers.
    ``multi_finding``: the stage's ``run`` takes every finding at once (``finding`` a list).
    ``overwrites_features``: the stage may overwrite a feature matrix handed over to it
    (:func:`~robustbench_fm.core.handover.hand_over`; CANDOR scales it to unit rows in place), so a
    job that will not read its features again holds one copy of them, not two (issue 31 item 7).

    ``console_columns``: the columns the console table shows (all are saved). ``tables``: the
    module whose ``TABLES`` lists the paper-table builders of the paper (functions of that
    module). ``figures``: ``"module:function"`` drawing the paper's figures for a report
    (:func:`robustbench_fm.report.html.figures`). ``tables_after_run``: a single (non-sweep) run
    builds the experiment's ``report.tables`` too. ``params``: the stage's parameters (its
    module's ``PARAMS``; importable without the stage). ``findings``: the command line's default
    ``stage.findings`` (an interpolation or a list). ``pairing``: the metrics the stage offers for
    paired comparisons between encoders and where its per-item table holds them (:class:`Pairing`;
    None: its rows are not compared). ``report_section``: ``"module:function"`` giving the stage's own
    part of a report, ``function(results)`` -> ``(title, sentences, table)`` or None, from the run's or
    sweep's :class:`~robustbench_fm.core.tables.SweepResults` (:func:`robustbench_fm.report.html.sections`;
    e.g. the confounder scan's "What the neighbourhoods follow"). ``findings_optional``: the stage runs
    without any finding (the confounder scan reads the manifest's other columns), so a ``dataset=csv``
    without a 0/1 column is not refused for it.
    """

    name: str
    description: str
    module: str
    display_name: str = ""
    headline: tuple[Metric, ...] = ()
    guide: str = ""
    group_columns: tuple[str, ...] = ()
    param_columns: tuple[str, ...] = ()
    count_column: str = "n"
    integer_columns: tuple[str, ...] = ()
    multi_finding: bool = False
    overwrites_features: bool = False
    console_columns: tuple[str, ...] = ()
    tables: str | None = None
    figures: str | None = None
    tables_after_run: bool = False
    params: type[StageParams] | None = None
    findings: str | tuple[str, ...] = "${dataset.findings}"
    pairing: Pairing | None = None
    report_section: str | None = None
    findings_optional: bool = False

    def __post_init__(self) -> None:
        headline = []
        for m in (self.headline,) if isinstance(self.headline, (str, Metric)) else self.headline:
            if not isinstance(m, Metric):
                if isinstance(m, str) or len(m) != 2:
                    raise InvalidSetting(f"method {self.name}: headline entry {m!r} must be a Metric or a pair "
                                    f"(name, 'higher'|'lower'), e.g. ('auroc', 'higher')")
                m = Metric(*m)
            if m.better not in BETTER:
                raise InvalidSetting(f"method {self.name}: headline metric '{m.name}' has better='{m.better}'; "
                                f"use 'higher' or 'lower'")
            headline.append(m)
        headline = tuple(headline)
        object.__setattr__(self, "headline", headline)
        for key in ("group_columns", "param_columns", "integer_columns", "console_columns"):
            value = getattr(self, key)
            if isinstance(value, str):
                raise InvalidSetting(f"method {self.name}: {key}={value!r} must be a tuple of column names, "
                                f"e.g. ({value!r},)")
            object.__setattr__(self, key, tuple(value))

    @property
    def title(self) -> str:
        """The name reports give the stage: ``display_name``, else ``name``."""
        return self.display_name or self.name

    def how_to_read(self) -> str:
        """The "How to read this" text, paragraphs joined by one newline and each on one line, its
        ``{param}`` fields not yet filled; without a ``guide``, one sentence naming the headline
        metrics and their direction ("" without those either)."""
        if not self.guide:
            return f"Headline: {', '.join(map(str, self.headline))}." if self.headline else ""
        return _guide_text(self.name, self.guide)


@cache
def _guide_text(name: str, guide: str) -> str:
    if _REFERENCE.fullmatch(guide):
        module, attr = guide.split(":")
        try:
            guide = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise InvalidSetting(f"method {name}: guide '{module}:{attr}' cannot be loaded ({exc})") from None
    paragraphs = re.split(r"\n\s*\n", str(guide).strip())
    return "\n".join(" ".join(p.split()) for p in paragraphs)


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
            raise InvalidSetting(f"plugins: cannot import '{name}' ({exc}); install it or put it on PYTHONPATH") \
                from None


def names() -> list[str]:
    """Every registered stage."""
    _discover()
    return METHODS.names()


def method(name: str) -> Method:
    """The registered stage ``name``; an unknown name fails with the close ones."""
    _discover()
    return METHODS.get(name)


def find(name: str) -> Method | None:
    """The registered stage ``name``, None if no stage is registered under it (a report of results
    whose plugin is not loaded names the stage as it is)."""
    return method(name) if name in names() else None


def get(name: str) -> ModuleType:
    """The stage module registered as ``name`` (imported now); unknown names get close matches."""
    return importlib.import_module(method(name).module)


def check(name: str, params: dict) -> StageParams | None:
    """The parameters of stage ``name`` validated (unknown names, types, values: one line naming
    ``stage.params.<key>``) before any heavy work; a stage without a ``params`` class runs its
    module's ``check_params(**params)`` when it has one. A ``ValueError`` of these checks (a
    plugin's ``check`` raises the built-in type) is the user's setting: :class:`InvalidSetting`."""
    cls = method(name).params
    try:
        if cls is None:
            own = getattr(get(name), "check_params", None)
            if callable(own):
                own(**params)
            return None
        return cls.parse(params)
    except InvalidSetting:
        raise
    except ValueError as exc:
        raise InvalidSetting(message(exc)) from exc


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


def integer_columns() -> set[str]:
    """The columns any registered stage prints as integers: its ``count_column`` and
    ``integer_columns`` (a report's tables mix stages, so the union)."""
    _discover()
    return {c for m in METHODS.values() for c in (m.count_column, *m.integer_columns)}


def _shipped_first(module: str) -> tuple[bool, str]:
    return not module.startswith(f"{__name__}."), module


def missing_column(stage: str, column: str, param: str, columns) -> InvalidSetting:
    """The one-line error of a stage whose manifest lacks ``column`` (the value of parameter
    ``param``): the command-line override that names another column (``stage.findings=[...]`` for
    the finding, ``stage.params.<param>=...`` otherwise; ``param=`` in Python) and the columns
    the manifest has."""
    override = "stage.findings=[<column>]" if param == "finding" else f"stage.params.{param}=<column>"
    names = [str(c) for c in columns]
    return InvalidSetting(f"{stage}: the manifest has no column '{column}' ({param}); add it, or name one of its "
                      f"columns with {override} ({param}= in Python; columns: {', '.join(names[:12])}"
                      f"{', ...' if len(names) > 12 else ''})")

