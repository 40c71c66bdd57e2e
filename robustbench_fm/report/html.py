"""One report per run or sweep: ``report.md`` (images beside it as ``figure_*.png`` / ``.pdf``) and a
self-contained ``report.html`` (images embedded as base64 PNG, inline style, no script and no
external URL, so it opens offline and can be mailed as one file), both written through the jinja2
templates ``templates/report.md.j2`` and ``templates/report.html.j2`` (:func:`templates`).

A report opens with what ran (title from the experiment, stage and dataset; the encoders; the
runtime) and a short "How to read this" per stage, then the results with their 95% intervals
(:func:`summary_table`), the rows that could not be scored and why (:func:`not_scored`), the
experiment's notes (``report.notes``), the paper tables (bold best, underlined second, as
:mod:`.render`) and their comparison with the published values (:mod:`.compare`), the figures
(:func:`figures`), the feature-cache hits per encoder, the jobs that failed or never ran and the
resolved config. With paper tables or more than :data:`MAX_INLINE_ROWS` result rows, a compact
per-encoder summary (:func:`encoder_summary`) comes first and the full result table last,
collapsed.
"""
from __future__ import annotations

import base64
import dataclasses
import importlib
import json
import re
import string
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import jinja2
import markupsafe
import numpy as np
import pandas as pd
from omegaconf import DictConfig, OmegaConf

from .. import methods
from ..core.atomic import write_text_atomic
from ..core.errors import InvalidSetting
from ..core.results import cell_text, read_notes, without_interval
from ..core.results import not_scored as summary_reasons
from ..core.results import to_markdown as frame_markdown
from ..core.tables import PaperTable, SweepResults
from ..methods.params import default
from . import compare as cmp_mod
from . import comparisons as which_mod
from . import neighbours as neighbours_mod
from .long_format import stage_conventions
from .render import ranks
from .render import to_markdown as table_markdown

STYLE = ("body{font-family:sans-serif;max-width:70em;margin:2em auto;color:#222}"
         "table{border-collapse:collapse;margin:1em 0;font-size:0.85em}"
         "td,th{border:1px solid #bbb;padding:2px 6px;text-align:right}th{background:#eee}"
         "pre{background:#f6f6f6;padding:1em;overflow:auto;font-size:0.8em}img{max-width:100%}"
         ".outside{color:#b00;font-weight:bold}.overview{line-height:1.5}.guide p{max-width:60em}"
         "summary{cursor:pointer;font-weight:bold;margin:1em 0}")

#: result tables longer than this (or any report with paper tables) show a per-encoder summary
#: first and the full table last, collapsed
MAX_INLINE_ROWS = 40
#: the report's own count columns (printed as integers when they hold whole numbers), besides
#: ``n_*`` and the count and integer columns the stages declare (:func:`methods.integer_columns`)
COUNT_COLUMNS = {"n", "images", "embedded", "cached", "tasks"}
POOLED = "__pooled__"
CONFIG_NOTE = ("The encoders that ran are listed at the top; the config's `encoders` names them (a sweep's job: the "
               "panel the sweep fans out), `encoder` holds the options of the entry chosen with `encoder=` (where a "
               "panel ran, the encoder group's default).")


@dataclass
class Report:
    """What a report shows; empty parts are left out."""

    title: str
    config_yaml: str = ""
    summary: pd.DataFrame = field(default_factory=pd.DataFrame)  # the results, :func:`summary_table`
    tables: list[PaperTable] = field(default_factory=list)
    compare: pd.DataFrame = field(default_factory=pd.DataFrame)
    figures: list[tuple[str, Path]] = field(default_factory=list)  # (caption, PNG)
    runtime_s: float | None = None
    cache: pd.DataFrame = field(default_factory=pd.DataFrame)  # encoder, images, embedded, cached
    missing: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # figures that could not be drawn
    overview: list[str] = field(default_factory=list)  # what ran: encoders, datasets, stages
    runtime_note: str = ""  # what the runtime measures
    guide: list[tuple[str, str]] = field(default_factory=list)  # "How to read this": (stage, text)
    by_encoder: pd.DataFrame = field(default_factory=pd.DataFrame)  # :func:`encoder_summary`
    not_scored: list[str] = field(default_factory=list)  # rows the stages left blank, with the reason
    no_interval: list[str] = field(default_factory=list)  # rows scored without an interval, with the reason
    experiment_notes: list[str] = field(default_factory=list)  # the experiment's ``report.notes``
    which: list[str] = field(default_factory=list)  # "Which encoder": one verdict per finding (.comparisons)
    which_table: pd.DataFrame = field(default_factory=pd.DataFrame)  # the ranking on each finding's headline row
    which_overall: pd.DataFrame = field(default_factory=pd.DataFrame)  # mean ranks over findings (2 or more)
    which_figures: list[tuple[str, Path]] = field(default_factory=list)  # heat maps of pairwise differences
    which_notes: list[str] = field(default_factory=list)  # what was not compared, and why
    sections: list[tuple[str, list[str], pd.DataFrame]] = field(default_factory=list)  # :func:`sections`
    neighbours: neighbours_mod.Section | None = None  # CANDOR's neighbourhoods in thumbnails (.neighbours)
    anchors: neighbours_mod.AnchorSection | None = None  # CRoMa's anchors with OS neighbours (.neighbours)

    @property
    def inline(self) -> bool:
        """The results table comes right after the guide (else last, collapsed)."""
        return not self.tables and len(self.summary) <= MAX_INLINE_ROWS


def _is_count(name) -> bool:
    return str(name) in COUNT_COLUMNS or str(name).startswith("n_") or str(name) in methods.integer_columns()


def stage_title(stage: str) -> str:
    """How reports name ``stage``: its declared ``display_name`` (the name itself for a stage no
    loaded method declares)."""
    method = methods.find(stage)
    return stage if method is None else method.title


def counts_as_int(df: pd.DataFrame) -> pd.DataFrame:
    """Count columns (``n``, ``n_*``, the cache counts) holding whole numbers as integers, so they
    print ``100`` and not ``100.000``."""
    out = df.copy()
    for col in out.columns:
        if _is_count(col) and pd.api.types.is_float_dtype(out[col]):
            values = out[col].dropna()
            if np.isfinite(values).all() and (values == values.round()).all():
                out[col] = out[col].round().astype("Int64")
    return out


def _task_rows(long: pd.DataFrame) -> pd.DataFrame:
    """``long`` with readable groups: a pooled row (CANDOR's ``__pooled__``) is left out where
    exactly one matched group was scored (it would repeat that group's row), else it reads
    ``pooled``; a group part equal to the task (CANDOR's target of a binary finding) is left out.
    ``task_level`` marks the rows that stand for a whole task (the pooled row, the only group,
    or every row of a stage without pooling)."""
    rows = long.reset_index(drop=True).copy()
    rows["group"] = rows["group"].fillna("").astype(str)
    parts = rows["group"].str.split(" / ")
    is_pooled = parts.map(lambda p: POOLED in p)
    rows["task_level"] = True
    drop = pd.Series(False, index=rows.index)
    for stage in rows.loc[is_pooled, "stage"].unique():
        in_stage = rows["stage"] == stage
        where = parts[in_stage & is_pooled].iloc[0].index(POOLED)  # the matched group's place in the group
        others = parts.map(lambda p: "\x1f".join(x for i, x in enumerate(p) if i != where))
        key = rows[["encoder", "dataset", "task", "job"]].astype(str).agg("\x1f".join, axis=1) + "\x1f" + others
        groups = rows[in_stage & ~is_pooled & rows["value"].notna()].assign(key=key)
        count = key.map(groups.drop_duplicates(["key", "group"]).groupby("key").size()).fillna(0)
        drop |= in_stage & is_pooled & (count == 1)  # a pool with no group rows (e.g. __chest__) stays
        rows.loc[in_stage & ~is_pooled & (count > 1), "task_level"] = False
    labels = [" / ".join("pooled" if x == POOLED else x for x in p if x != task)
              for p, task in zip(parts, rows["task"].astype(str))]
    return rows.assign(group=labels)[~drop].reset_index(drop=True)


def _wide(long: pd.DataFrame) -> pd.DataFrame:
    """One row per (stage, encoder, dataset, task, group[, job]) with ``n``, every metric and its
    ``<metric>_ci_low`` / ``_ci_high`` where it has an interval; rows with no value dropped. The
    job is a key only where two jobs share the rest (e.g. an ablation's settings)."""
    rows = _task_rows(long)
    keys = ["stage", "encoder", "dataset", "task", "group"]
    if rows.groupby(keys + ["metric"], sort=False)["job"].nunique().gt(1).any():
        keys.append("job")
    frame = rows.drop_duplicates(keys)[keys + ["n", "task_level"]].set_index(keys)
    for metric in dict.fromkeys(rows["metric"]):
        part = rows[rows["metric"] == metric].drop_duplicates(keys).set_index(keys)
        frame[metric] = part["value"]
        if part["ci_low"].notna().any():
            frame[f"{metric}_ci_low"], frame[f"{metric}_ci_high"] = part["ci_low"], part["ci_high"]
    metrics = list(dict.fromkeys(rows["metric"]))
    return frame[frame[metrics].notna().any(axis=1)].reset_index()


def _interval(value: float, low: float, high: float) -> str:
    if pd.isna(value):
        return ""
    return f"{value:.3f}" if pd.isna(low) or pd.isna(high) else f"{value:.3f} [{low:.3f}, {high:.3f}]"


def summary_table(long: pd.DataFrame) -> pd.DataFrame:
    """The long-format results back to one row per (stage, encoder, dataset, task, group) and one
    column per metric, for reading: a metric with a 95% interval as ``value [low, high]`` in
    column ``<metric> [95% CI]`` (its bootstrap ``<metric>_sd`` then left out), counts as
    integers, the pooled row only where more than one matched group was scored
    (:func:`_task_rows`), rows without any value left out (:func:`not_scored` says why)."""
    if long.empty:
        return pd.DataFrame()
    wide = _wide(long)
    out = wide[[c for c in wide.columns if c in ("stage", "encoder", "dataset", "task", "group", "job", "n")]].copy()
    with_ci = {c[:-len("_ci_low")] for c in wide.columns if c.endswith("_ci_low")}
    for metric in dict.fromkeys(long["metric"]):
        if metric not in wide.columns or (metric.endswith("_sd") and metric[:-3] in with_ci):
            continue
        if metric in with_ci:
            out[f"{metric} [95% CI]"] = [_interval(v, lo, hi) for v, lo, hi in
                                         zip(wide[metric], wide[f"{metric}_ci_low"], wide[f"{metric}_ci_high"])]
        else:
            out[metric] = wide[metric]
    if (out["group"] == "").all():
        out = out.drop(columns="group")
    if out["n"].isna().all():
        out = out.drop(columns="n")
    elif out["stage"].nunique() == 1:  # the stage's own name of its count, e.g. CANDOR's n_queries

        count = stage_conventions(str(out["stage"].iloc[0]))[2]
        if count not in out.columns:
            out = out.rename(columns={"n": count})
    return counts_as_int(out.reset_index(drop=True))


def _shown(summary: pd.DataFrame) -> pd.DataFrame:
    """The results table as the report prints it: ``stage``, ``dataset`` and ``job`` left out
    where they hold one value (the overview names it)."""
    return summary.drop(columns=[c for c in ("stage", "dataset", "job")
                                 if c in summary.columns and summary[c].nunique() <= 1])


def encoder_summary(long: pd.DataFrame) -> pd.DataFrame:
    """Per stage and encoder: the number of tasks scored and the median of the stage's declared
    ``headline`` metrics over them (every metric but counts and ``_sd`` where it declares none;
    task-level rows; pools across tasks such as CANDOR's ``__chest__`` left out)."""
    if long.empty:
        return pd.DataFrame()
    wide = _wide(long)
    wide = wide[wide["task_level"]]
    pool = wide["task"].astype(str).str.startswith("__") | wide["group"].astype(str).str.contains("__")
    wide = wide[~pool]
    out = []
    for (stage, encoder), rows in wide.groupby(["stage", "encoder"], sort=False):
        method = methods.find(stage)
        headline = [m.name for m in method.headline] if method is not None else []
        metrics = [m for m in headline or [m for m in dict.fromkeys(long.loc[long["stage"] == stage, "metric"])
                                           if not m.endswith("_sd") and not _is_count(m)]
                   if m in rows.columns]
        rec = {"stage": stage, "encoder": encoder, "tasks": len(rows)}
        rec.update({f"median {m}": float(rows[m].median()) for m in metrics})
        out.append(rec)
    frame = pd.DataFrame(out)
    if frame.empty or frame["stage"].nunique() == 1:
        frame = frame.drop(columns="stage", errors="ignore")
    return counts_as_int(frame)


def not_scored(results: SweepResults, stages) -> list[str]:
    """Why rows are blank: the ``reason`` of every summary row of ``stages`` that has one
    (:func:`robustbench_fm.core.results.not_scored`)."""
    lines = []
    for stage in stages:
        lines += summary_reasons(results.summaries(stage))
    return lines


def no_interval(results: SweepResults, stages) -> list[str]:
    """Rows scored without an interval, and why (the ``note`` of a summary row:
    :func:`robustbench_fm.core.results.without_interval`)."""
    return [line for stage in stages for line in without_interval(results.summaries(stage))]


def how_to_read(stages, cfg: DictConfig | None = None) -> list[tuple[str, str]]:
    """Per stage present, its display name and what its numbers mean: the ``guide`` of its
    :class:`~robustbench_fm.methods.Method` declaration (:meth:`~robustbench_fm.methods.Method.how_to_read`),
    each ``{param}`` filled with the value ``cfg`` gave the stage's parameter where ``cfg`` ran that
    stage, else the parameter's default. A stage without a text, or that no loaded method
    declares, is left out."""
    out = []
    for stage in stages:
        method = methods.find(stage)
        text = method.how_to_read() if method is not None else ""
        if text:
            out.append((method.title, _fill(text, method, cfg)))
    return out


def _fill(text: str, method: methods.Method, cfg: DictConfig | None) -> str:
    """``text`` with each ``{param}`` (format spec allowed, e.g. ``{n_boot:,}``) set to the stage's
    parameter: ``cfg``'s ``stage.params.<param>`` where ``cfg`` ran this stage, else its default."""
    ran = cfg is not None and OmegaConf.select(cfg, "stage.name", default=None) == method.name
    fields = {f.name for f in dataclasses.fields(method.params)} if method.params is not None else set()
    values = {}
    for _, name, _, _ in string.Formatter().parse(text):
        if name is None or name in values:
            continue
        if name not in fields:
            raise InvalidSetting(f"method {method.name}: its guide names {{{name}}}, which is not one of its "
                                 f"parameters ({', '.join(sorted(fields)) or 'none'}); write {{{{ and }}}} for a "
                                 "literal brace")
        value = default(method.params, name)
        values[name] = OmegaConf.select(cfg, f"stage.params.{name}", default=value) if ran else value
    return text.format_map(values)


def report_title(experiment: str | None, stages, datasets, encoders, jobs: int | None = None) -> str:
    """E.g. ``demo: CANDOR on planted (3 encoders)``; a sweep: ``demo sweep: ... (2 encoders, 2 jobs)``."""
    what = " + ".join(stage_title(s) for s in stages) or "no results"
    where = f" on {', '.join(datasets)}" if len(datasets) else ""
    count = f"{len(encoders)} encoder{'s' if len(encoders) != 1 else ''}"
    if jobs is not None:
        count += f", {jobs} job{'s' if jobs != 1 else ''}"
    prefix = " ".join(x for x in (experiment, "sweep" if jobs is not None else None) if x)
    return f"{prefix + ': ' if prefix else ''}{what}{where} ({count})"


def subject(stages) -> list:
    """The stages a report is about: a stage that scans columns (``findings_optional``: the confounder
    scan a single run adds, ``pipeline.job.scan``) names columns, not findings, and is left out of the
    title and the findings line beside a stage that has findings."""
    return [s for s in stages if not (s in methods.names() and methods.method(s).findings_optional)] or list(stages)


def _overview(long: pd.DataFrame, cfg: DictConfig | None, folder: Path) -> tuple[list[str], list, list, list]:
    """The lines under the title (encoders, datasets, stages, findings, folder) and the
    stages, datasets and encoders they name."""
    stages = list(dict.fromkeys(long["stage"])) if len(long) else \
        [OmegaConf.select(cfg, "stage.name", default="")] if cfg is not None else []
    datasets = list(dict.fromkeys(long["dataset"])) if len(long) else []
    encoders = list(dict.fromkeys(long["encoder"])) if len(long) else []
    if not encoders and cfg is not None:
        encoders = list(cfg.get("encoders") or [OmegaConf.select(cfg, "encoder.name", default="")])
    rows = long[long["stage"].isin(subject(stages))] if len(long) else long
    tasks = [t for t in dict.fromkeys(rows["task"]) if t and not str(t).startswith("__")] if len(rows) else []
    shown = ", ".join(tasks) if len(tasks) <= 8 else f"{len(tasks)} ({', '.join(tasks[:6])}, ...)"
    lines = [f"Encoders ({len(encoders)}): {', '.join(encoders)}",
             f"Dataset{'s' if len(datasets) != 1 else ''}: {', '.join(datasets) or '-'} · "
             f"stage{'s' if len(stages) != 1 else ''}: {', '.join(stages)}"
             + (f" · finding{'s' if len(tasks) != 1 else ''}: {shown}" if tasks else ""),
             f"Folder: {folder}"]
    return lines, stages, datasets, encoders


def _experiment_notes(cfg: DictConfig | None, encoders) -> list[str]:
    """The experiment's ``report.notes``: a sentence, or ``{encoder: name or [names], text: ...}``
    shown only when one of those encoders ran."""
    notes = OmegaConf.select(cfg, "report.notes", default=None) if cfg is not None else None
    out = []
    for note in notes or []:
        if isinstance(note, (dict, DictConfig)):
            about = note.get("encoder")
            about = [about] if isinstance(about, str) else list(about or [])
            if about and not set(about) & set(encoders):
                continue
            note = note.get("text", "")
        out.append(" ".join(str(note).split()))
    return out




def _metrics(long: pd.DataFrame, stage: str) -> pd.DataFrame:
    """One stage's long rows as one row per (encoder, dataset, task, group) with ``n`` and one
    column per metric. Where the stage's group holds CANDOR's pooled matched group
    (``__pooled__``), only pooled rows are kept and the group's other parts (e.g. the target)
    are appended to ``task`` where they differ from it. ``<metric>_ci_low`` / ``_ci_high`` hold
    each metric's interval where the long rows give one."""
    keys = ["encoder", "dataset", "task", "group"]
    rows = long[long["stage"] == stage]
    parts = rows["group"].str.split(" / ")
    pooled = parts.map(lambda p: POOLED in p)
    if pooled.any():
        rows = rows[pooled].assign(group=parts[pooled].map(lambda p: " / ".join(x for x in p if x != POOLED)))
        extra = (rows["group"] != "") & (rows["group"] != rows["task"])  # e.g. a target other than the finding
        rows = rows.assign(task=rows["task"].where(~extra, rows["task"] + " (" + rows["group"] + ")"))
    if rows.empty:
        return pd.DataFrame(columns=keys + ["n"])
    wide = rows.pivot_table(index=keys, columns="metric", values="value", sort=False).reset_index()
    for bound in ("ci_low", "ci_high"):  # each metric's interval beside it, for the figures' error bars
        if bound in rows.columns and rows[bound].notna().any():
            part = rows.pivot_table(index=keys, columns="metric", values=bound, sort=False)
            part.columns = [f"{m}_{bound}" for m in part.columns]
            wide = wide.merge(part.reset_index(), on=keys, how="left")
    n = rows.groupby(keys, sort=False)["n"].first().rename("n").reset_index()
    wide = wide.merge(n, on=keys, how="left")
    wide.columns.name = None
    return wide


def sections(results: SweepResults, stages) -> list[tuple[str, list[str], pd.DataFrame]]:
    """The parts of a report the stages present write themselves: each one's ``Method(report_section=
    "module:function")``, ``function(results)`` -> ``(title, sentences, table)`` or None (e.g. the
    confounder scan's "What the neighbourhoods follow"), in the order of ``stages``."""
    out = []
    for stage in stages:
        method = methods.find(stage)
        if method is None or not method.report_section:
            continue
        module, function = method.report_section.split(":")
        part = getattr(importlib.import_module(module), function)(results)
        if part is not None:
            out.append(part)
    return out


def figures(results: SweepResults, long: pd.DataFrame, fig_dir: Path) -> tuple[list[tuple[str, Path]], list[str]]:
    """The papers' figures this run's results allow, written as ``fig_dir/figure_<name>.png`` and
    ``.pdf`` (files, not a folder: a sweep folder's subfolders are its jobs), returned as
    ``(caption, PNG)``, plus one note per figure a stage's results could not give."""
    out, notes = [], []
    stages = set(long["stage"])

    def add(caption: str, make, *args, **kwargs) -> None:
        try:
            paths = make(*args, stem=fig_dir / f"figure_{caption.split(':')[0].replace(' ', '_')}", **kwargs)
        except ValueError as exc:
            notes.append(f"{caption.split(':')[0]} not drawn: {exc}")
            return
        out.append((caption, paths[0]))

    # each paper's ``report_figures(results, long, stages, add, metrics, notes)``: ``add(caption,
    # make, *args)`` draws one with ``make(*args, stem=...)``; ``metrics(long, stage)`` is a
    # stage's wide table; ``notes`` collects why a figure was not drawn
    for maker in methods.figure_makers():
        module, function = maker.split(":")
        getattr(importlib.import_module(module), function)(results, long, stages, add, _metrics, notes)
    return out, notes


def cache_hits(job_dirs: list[Path]) -> pd.DataFrame:
    """Feature-cache use per (job, encoder) from ``entries.json`` (``cache`` records of
    :func:`robustbench_fm.pipeline.job.record_entries`): images, embedded now, read from the cache."""
    rows = []
    for d in job_dirs:
        f = d / "entries.json"
        if f.exists():
            rec = json.loads(f.read_text())
            rows += [{"job": d.name, "encoder": e["encoder"], **e["cache"]} for e in rec["entries"] if e.get("cache")]
    return pd.DataFrame(rows)


def job_times(job_dirs: list[Path]) -> tuple[float | None, int]:
    """Wall-clock seconds from the earliest start to the last end recorded in the jobs'
    ``status.json`` (:func:`robustbench_fm.pipeline.job.run`), and how many jobs recorded both."""
    spans = []
    for d in job_dirs:
        f = d / "status.json"
        if f.exists():
            try:
                rec = json.loads(f.read_text())
                spans.append((float(rec["start"]), float(rec["end"])))
            except (ValueError, KeyError, TypeError):
                continue
    if not spans:
        return None, 0
    return max(e for _, e in spans) - min(s for s, _ in spans), len(spans)


def _sweep_experiment(sweep_dir: Path) -> str | None:
    """The experiment a sweep ran (``hydra.runtime.choices.experiment`` of Hydra's
    ``multirun.yaml``), None without that file."""
    f = sweep_dir / "multirun.yaml"
    if not f.exists():
        return None
    try:
        value = OmegaConf.select(OmegaConf.load(f), "hydra.runtime.choices.experiment", default=None)
    except Exception:  # an unreadable multirun.yaml only costs the title its experiment name
        return None
    return None if value is None else str(value)


def sweep_report(sweep_dir: Path, long: pd.DataFrame, tables: list[PaperTable], missing: list[str],
                 seconds: float) -> Report:
    """The report of a collected sweep (:func:`robustbench_fm.cli.sweeps.collect`); ``seconds`` is
    the collect step's time, the runtime shown is the sweep's wall clock (:func:`job_times`)."""
    results = SweepResults(sweep_dir)
    config = OmegaConf.to_yaml(results.config) if results.config is not None else ""
    figs, notes = figures(results, long, sweep_dir) if len(long) else ([], [])
    jobs = [p for p in sorted(sweep_dir.iterdir()) if p.is_dir()]
    overview, stages, datasets, encoders = _overview(long, results.config, sweep_dir)
    n_jobs = len([j for j in jobs if (j / "status.json").exists() or (j / "config.yaml").exists()])
    wall, timed = job_times(jobs)
    if wall is None:
        runtime, runtime_note = seconds, "the collect step only: the jobs recorded no start and end"
    else:
        runtime, runtime_note = wall, (f"wall clock from the earliest job start to the last job end, from the "
                                       f"status.json of {timed} job{'s' if timed != 1 else ''}; the collect "
                                       f"step took {seconds:.1f} s more")
    return Report(title=report_title(_sweep_experiment(sweep_dir), stages, datasets, encoders, jobs=n_jobs),
                  config_yaml=config, summary=summary_table(long), tables=tables,
                  compare=cmp_mod.compare_tables(tables), figures=figs, runtime_s=runtime, cache=cache_hits(jobs),
                  missing=missing, notes=notes, overview=overview, runtime_note=runtime_note,
                  guide=how_to_read(stages, results.config), by_encoder=encoder_summary(long),
                  not_scored=not_scored(results, stages), no_interval=no_interval(results, stages),
                  experiment_notes=_experiment_notes(results.config, encoders), sections=sections(results, stages),
                  **which_encoder(sweep_dir), neighbours=neighbours_mod.section(sweep_dir),
                  anchors=neighbours_mod.anchor_section(sweep_dir))


def which_encoder(folder: Path) -> dict:
    """The report's "Which encoder" parts from the comparisons saved in ``folder``
    (:mod:`.comparisons`: ``comparisons.csv``, ``ranking.csv``): the verdicts, the ranking on each
    finding's headline row, the mean ranks over two or more findings and the heat maps."""
    found = which_mod.read(folder)
    if found.empty:
        return {}
    overall = found.overall
    several = not overall.empty and overall["n_findings"].max() > 1
    return dict(which=which_mod.verdict(found), which_table=which_mod.first_metric_rows(found),
                which_overall=overall if several else pd.DataFrame(),
                which_figures=which_mod.heatmaps(found, folder), which_notes=found.notes)


def run_report(out_dir: Path, config_yaml: str, long: pd.DataFrame, seconds: float,
               experiment: str | None = None, manifest: pd.DataFrame | None = None, image_root: Path | None = None,
               no_images: str = "") -> Report:
    """The report of one run folder (written by :func:`robustbench_fm.pipeline.job.run`); ``experiment``
    names the experiment in the title; ``manifest`` and ``image_root``: the run's images, shown in the
    neighbourhood section (:mod:`.neighbours`; ``no_images`` says why there are none)."""
    results = SweepResults(out_dir)
    cfg = OmegaConf.create(config_yaml) if config_yaml.strip() else None
    figs, notes = figures(results, long, out_dir) if len(long) else ([], [])
    overview, stages, datasets, encoders = _overview(long, cfg, out_dir)
    return Report(title=report_title(experiment, subject(stages), datasets, encoders), config_yaml=config_yaml,
                  summary=summary_table(long), figures=figs, runtime_s=seconds, cache=cache_hits([out_dir]),
                  notes=read_notes(out_dir) + notes, overview=overview,
                  runtime_note="this run, from its start to this report",
                  guide=how_to_read(stages, cfg), by_encoder=encoder_summary(long),
                  not_scored=not_scored(results, stages), no_interval=no_interval(results, stages),
                  experiment_notes=_experiment_notes(cfg, encoders), sections=sections(results, stages),
                  **which_encoder(out_dir), neighbours=neighbours_mod.section(out_dir, manifest, image_root, no_images),
                  anchors=neighbours_mod.anchor_section(out_dir, manifest, image_root, no_images))


def console_summary(report: Report) -> str:
    """What a sweep's collect step prints: the results table, or where it is long the
    per-encoder summary (the full table is in the report)."""
    if report.inline or report.by_encoder.empty:
        return frame_markdown(report.summary) if len(report.summary) else ""
    return (frame_markdown(report.by_encoder)
            + f"({len(report.summary)} result rows in the report and results_long.csv)\n")


# --- writers --------------------------------------------------------------------------------------

def _runtime(report: Report) -> str:
    return f"Runtime: {report.runtime_s:.1f} s" + (f" ({report.runtime_note})" if report.runtime_note else "")


def _show_by_encoder(report: Report) -> bool:
    return not report.inline and len(report.by_encoder) > 0


def _grid(df: pd.DataFrame, decimals: int = 3, na_rep: str = "", marks: pd.DataFrame | None = None) -> dict:
    """A frame as the HTML template's ``table`` macro takes it: the header and per row ``(text, rank)``
    cells (text as :func:`robustbench_fm.core.results.cell_text`, rank as :func:`.render.ranks`),
    counts as integers (:func:`counts_as_int`)."""
    df = counts_as_int(df)
    marked = np.zeros(df.shape, dtype=int) if marks is None else marks.to_numpy()
    return {"header": [str(c) for c in df.columns],
            "rows": [[(cell_text(v, f".{decimals}f", na_rep), int(r)) for v, r in zip(row, rank_row)]
                     for row, rank_row in zip(df.itertuples(index=False), marked)]}


def _code(text: str) -> markupsafe.Markup:
    """``text`` escaped for HTML with each ```span``` as ``<code>span</code>`` (a section's sentences)."""
    return markupsafe.Markup(re.sub(r"`([^`]*)`", r"<code>\1</code>", str(markupsafe.escape(text))))


@lru_cache(maxsize=1)
def templates() -> jinja2.Environment:
    """The report templates (``report/templates/``, package data): ``report.md.j2`` and
    ``report.html.j2`` (autoescaped), with the table filters they use."""
    env = jinja2.Environment(loader=jinja2.PackageLoader(__package__, "templates"),
                             autoescape=jinja2.select_autoescape(enabled_extensions=("html.j2",)),
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                             undefined=jinja2.StrictUndefined)
    env.filters.update(
        markdown=frame_markdown, paper_markdown=table_markdown, compare_markdown=cmp_mod.to_markdown,
        counts_as_int=counts_as_int, grid=_grid,
        paper_grid=lambda t: _grid(t.frame.reset_index(drop=True), t.decimals, t.na_rep,
                                   ranks(t).reset_index(drop=True)),
        base64=lambda png: base64.b64encode(Path(png).read_bytes()).decode("ascii"), code=_code)
    return env


def _context(report: Report) -> dict:
    """What both templates read: the report, its runtime line, the results table as shown."""
    return {"r": report, "runtime": _runtime(report) if report.runtime_s is not None else "",
            "shown": _shown(report.summary) if len(report.summary) else report.summary,
            "show_by_encoder": _show_by_encoder(report), "config_note": CONFIG_NOTE}


def to_markdown(report: Report, root: Path) -> str:
    """``report.md`` (``templates/report.md.j2``): images linked relative to ``root``."""
    figures = [(caption, png.relative_to(root).as_posix()) for caption, png in report.figures]
    which_figures = [(caption, png.relative_to(root).as_posix()) for caption, png in report.which_figures]
    text = templates().get_template("report.md.j2").render(**_context(report), figures=figures,
                                                           which_figures=which_figures)
    return text[:-1]  # the template ends every part with a newline; the file ends where its last part does


def to_html(report: Report) -> str:
    """``report.html`` (``templates/report.html.j2``): one file, every image inlined as
    ``data:image/png;base64``."""
    n_outside = int(report.compare["outside"].sum()) if "outside" in report.compare else 0
    return templates().get_template("report.html.j2").render(**_context(report), style=STYLE, n_outside=n_outside)


def write_report(report: Report, out_dir: str | Path) -> tuple[Path, Path]:
    """Write ``report.md`` and ``report.html`` into ``out_dir``; returns both paths."""
    out_dir = Path(out_dir)
    md, page = out_dir / "report.md", out_dir / "report.html"
    write_text_atomic(md, to_markdown(report, out_dir))
    write_text_atomic(page, to_html(report))
    return md, page
