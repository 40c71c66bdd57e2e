"""One report per run or sweep: ``report.md`` (images beside it as ``figure_*.png`` / ``.pdf``) and a
self-contained ``report.html`` (images embedded as base64 PNG, inline style, no script and no
external URL, so it opens offline and can be mailed as one file).

A report holds the resolved config, the summary table, the paper tables (bold best, underlined
second, as :mod:`.render`), their comparison with the published values (:mod:`.compare`), the
figures (:func:`figures`), the runtime, the feature-cache hits per encoder and the jobs that
failed or never ran.
"""
from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from ..atomic import write_text_atomic
from ..results import to_markdown as frame_markdown
from . import compare as cmp_mod
from .render import _cell, ranks
from .render import to_markdown as table_markdown
from .tables import PaperTable, SweepResults

STYLE = ("body{font-family:sans-serif;max-width:70em;margin:2em auto;color:#222}"
         "table{border-collapse:collapse;margin:1em 0;font-size:0.85em}"
         "td,th{border:1px solid #bbb;padding:2px 6px;text-align:right}th{background:#eee}"
         "pre{background:#f6f6f6;padding:1em;overflow:auto;font-size:0.8em}img{max-width:100%}"
         ".outside{color:#b00;font-weight:bold}")


@dataclass
class Report:
    """What a report shows; empty parts are left out."""

    title: str
    config_yaml: str = ""
    summary: pd.DataFrame = field(default_factory=pd.DataFrame)
    tables: list[PaperTable] = field(default_factory=list)
    compare: pd.DataFrame = field(default_factory=pd.DataFrame)
    figures: list[tuple[str, Path]] = field(default_factory=list)  # (caption, PNG)
    runtime_s: float | None = None
    cache: pd.DataFrame = field(default_factory=pd.DataFrame)  # encoder, images, embedded, cached
    missing: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def summary_table(long: pd.DataFrame) -> pd.DataFrame:
    """The long-format results back to one row per (stage, encoder, dataset, task, group) and one
    column per metric, for reading."""
    if long.empty:
        return pd.DataFrame()
    keys = ["stage", "encoder", "dataset", "task", "group"]
    wide = long.pivot_table(index=keys, columns="metric", values="value", sort=False, dropna=False)
    wide = wide.dropna(how="all").reset_index()
    wide.columns.name = None
    return wide[[c for c in wide.columns if c != "group" or (wide["group"] != "").any()]]


POOLED = "__pooled__"


def _metrics(long: pd.DataFrame, stage: str) -> pd.DataFrame:
    """One stage's long rows as one row per (encoder, dataset, task, group) with ``n`` and one
    column per metric. Where the stage's group holds CANDOR's pooled matched group
    (``__pooled__``), only pooled rows are kept and the group's other parts (e.g. the target)
    are appended to ``task`` where they differ from it."""
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
    n = rows.groupby(keys, sort=False)["n"].first().rename("n").reset_index()
    wide = wide.merge(n, on=keys, how="left")
    wide.columns.name = None
    return wide


def figures(results: SweepResults, long: pd.DataFrame, fig_dir: Path) -> tuple[list[tuple[str, Path]], list[str]]:
    """The papers' figures this run's results allow, written as ``fig_dir/figure_<name>.png`` and
    ``.pdf`` (files, not a folder: a sweep folder's subfolders are its jobs), returned as
    ``(caption, PNG)``, plus one note per figure a stage's results could not give."""
    from . import candor_plots, croma_plots, spar_plots

    out, notes = [], []
    stages = set(long["stage"])

    def add(caption: str, make, *args, **kwargs) -> None:
        try:
            paths = make(*args, stem=fig_dir / f"figure_{caption.split(':')[0].replace(' ', '_')}", **kwargs)
        except ValueError as exc:
            notes.append(f"{caption.split(':')[0]} not drawn: {exc}")
            return
        out.append((caption, paths[0]))

    if "candor" in stages:
        candor = _metrics(long, "candor")
        several = candor["dataset"].nunique() > 1
        candor["task"] = (candor["dataset"] + "/" + candor["task"]) if several else candor["task"]
        add("candor_positives: D and D_all against the number of positives (CANDOR Figure 2)",
            candor_plots.plot_positives, candor)
        add("candor_collapse: collapse rate per task, one marker per encoder (CANDOR v1 Figure 2b)",
            candor_plots.plot_collapse, candor)
        if "retention" in stages:
            ret = _metrics(long, "retention").groupby("encoder")["retention"].mean()
            both = candor.groupby("encoder")["d"].mean().to_frame().join(ret, how="inner").reset_index()
            add("candor_retention: retention against D (CANDOR Figure 3)", candor_plots.plot_retention, both)
    if "croma" in stages:
        summary = _metrics(long, "croma")
        per_sample = results.per_sample("croma")
        if "shortcut" in stages:
            apd = long[(long["stage"] == "shortcut") & (long["metric"] == "apd")]
            apd = apd.assign(col=apd["group"].map(lambda g: f"apd_{g}" if g in ("id", "ood") else "apd"))
            summary = summary.merge(apd.pivot_table(index="encoder", columns="col", values="value").reset_index(),
                                    on="encoder", how="left")
        for dataset, rows in summary.groupby("dataset", sort=False):
            add(f"croma_pareto_{dataset}: median CRoMa against LTM10 on {dataset} (CRoMa Figures 3/5)",
                croma_plots.plot_pareto, rows)
            if any(c in rows for c in croma_plots.APD_COLUMNS):
                add(f"croma_apd_{dataset}: CRoMa against APD on {dataset} (CRoMa Figure 6)",
                    croma_plots.plot_croma_vs_apd, rows)
        for dataset, rows in (per_sample.groupby("dataset", sort=False) if len(per_sample) else []):
            add(f"croma_ridgeline_{dataset}: per-sample CRoMa on {dataset} (CRoMa Figure 4)",
                croma_plots.plot_ridgeline, rows)
            add(f"croma_typed_{dataset}: typed-distance plane on {dataset} (CRoMa Figure 9)",
                croma_plots.plot_typed_distances, rows)
    if "spar" in stages:
        try:
            probes = spar_plots.probe_table(results.summaries("spar"))
        except ValueError as exc:
            notes.append(f"SPAR figures not drawn: {exc}")
            probes = pd.DataFrame()
        for cohort, rows in (probes.groupby("cohort", sort=False) if len(probes) else []):
            kind = "in domain" if rows["in_domain"].iloc[0] else "zero-shot"
            add(f"spar_probes_{cohort}: per-probe accuracy on {cohort} ({kind}) with chance levels "
                "(SPAR Tables 1/5)", spar_plots.plot_probe_bars, rows, title=f"{cohort} ({kind})")
        home = sorted(set(probes.loc[probes["in_domain"], "cohort"])) if len(probes) else []
        for away in (sorted(set(probes.loc[~probes["in_domain"], "cohort"])) if home else []):
            add(f"spar_domain_{away}: in-domain ({home[0]}) against zero-shot ({away}) accuracy (SPAR Section 4)",
                spar_plots.plot_domain, probes, in_domain=home[0], zero_shot=away)
    return out, notes


def cache_hits(job_dirs: list[Path]) -> pd.DataFrame:
    """Feature-cache use per (job, encoder) from ``entries.json`` (``cache`` records of
    :func:`robustbench_fm.app._record_entries`): images, embedded now, read from the cache."""
    import json

    rows = []
    for d in job_dirs:
        f = d / "entries.json"
        if f.exists():
            rec = json.loads(f.read_text())
            rows += [{"job": d.name, "encoder": e["encoder"], **e["cache"]} for e in rec["entries"] if e.get("cache")]
    return pd.DataFrame(rows)


def sweep_report(sweep_dir: Path, long: pd.DataFrame, tables: list[PaperTable], missing: list[str],
                 seconds: float) -> Report:
    """The report of a collected sweep (:func:`robustbench_fm.sweeps.collect`)."""
    results = SweepResults(sweep_dir)
    config = OmegaConf.to_yaml(results.config) if results.config is not None else ""
    figs, notes = figures(results, long, sweep_dir) if len(long) else ([], [])
    jobs = [p for p in sorted(sweep_dir.iterdir()) if p.is_dir()]
    return Report(title=f"Sweep {sweep_dir.name}", config_yaml=config, summary=summary_table(long), tables=tables,
                  compare=cmp_mod.compare_tables(tables), figures=figs, runtime_s=seconds, cache=cache_hits(jobs),
                  missing=missing, notes=notes)


def run_report(out_dir: Path, config_yaml: str, long: pd.DataFrame, seconds: float) -> Report:
    """The report of one run folder (written by :func:`robustbench_fm.app.run`)."""
    figs, notes = figures(SweepResults(out_dir), long, out_dir) if len(long) else ([], [])
    return Report(title=f"Run {out_dir.name}", config_yaml=config_yaml, summary=summary_table(long), figures=figs,
                  runtime_s=seconds, cache=cache_hits([out_dir]), notes=notes)


# --- writers --------------------------------------------------------------------------------------

def to_markdown(report: Report, root: Path) -> str:
    """``report.md``: images linked relative to ``root``."""
    parts = [f"# {report.title}", ""]
    if report.runtime_s is not None:
        parts += [f"Runtime: {report.runtime_s:.1f} s", ""]
    if report.missing:
        parts += ["## Failed or missing runs", ""] + [f"- {m}" for m in report.missing] + [""]
    if len(report.summary):
        parts += ["## Results", "", frame_markdown(report.summary)]
    for table in report.tables:
        parts += [f"## {table.name}", "", table_markdown(table)]
    if report.tables:
        parts += ["## Compared with the published values", "", cmp_mod.to_markdown(report.compare)]
    for caption, png in report.figures:
        parts += [f"![{caption}]({png.relative_to(root).as_posix()})", "", f"*{caption}*", ""]
    parts += [f"- {n}" for n in report.notes] + ([""] if report.notes else [])
    if len(report.cache):
        parts += ["## Feature cache", "", frame_markdown(report.cache)]
    if report.config_yaml:
        parts += ["## Resolved config", "", "```yaml", report.config_yaml.rstrip(), "```", ""]
    return "\n".join(parts)


def _html_frame(df: pd.DataFrame, marks: pd.DataFrame | None = None, decimals: int = 3) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    body = []
    for i, (_, row) in enumerate(df.iterrows()):
        cells = []
        for j, value in enumerate(row):
            text = html.escape(_cell(value, decimals))
            rank = 0 if marks is None else marks.iat[i, j]
            cells.append(f"<td><b>{text}</b></td>" if rank == 1 else f"<td><u>{text}</u></td>" if rank == 2
                         else f"<td>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def to_html(report: Report) -> str:
    """``report.html``: one file, every image inlined as ``data:image/png;base64``."""
    esc = html.escape
    parts = [f"<h1>{esc(report.title)}</h1>"]
    if report.runtime_s is not None:
        parts.append(f"<p>Runtime: {report.runtime_s:.1f} s</p>")
    if report.missing:
        parts += ["<h2>Failed or missing runs</h2><ul>"] + [f"<li>{esc(m)}</li>" for m in report.missing] + ["</ul>"]
    if len(report.summary):
        parts += ["<h2>Results</h2>", _html_frame(report.summary)]
    for table in report.tables:
        parts += [f"<h2>{esc(table.name)}</h2>", f"<p>{esc(table.caption)}</p>",
                  _html_frame(table.frame.reset_index(drop=True),
                              ranks(table).reset_index(drop=True), table.decimals)]
    if report.tables:
        parts.append("<h2>Compared with the published values</h2>")
        if report.compare.empty:
            parts.append("<p>No cell of these tables has a published counterpart.</p>")
        else:
            n_out = int(report.compare["outside"].sum())
            parts += [f"<p>{len(report.compare)} cells compared, <span class='outside'>{n_out}</span> outside "
                      "the published interval (published ± half a printed unit, ± 1.96 sd where printed).</p>",
                      _html_frame(report.compare, decimals=4)]
    for caption, png in report.figures:
        data = base64.b64encode(png.read_bytes()).decode("ascii")
        parts.append(f"<figure><img alt='{esc(caption)}' src='data:image/png;base64,{data}'>"
                     f"<figcaption>{esc(caption)}</figcaption></figure>")
    if report.notes:
        parts += ["<ul>"] + [f"<li>{esc(n)}</li>" for n in report.notes] + ["</ul>"]
    if len(report.cache):
        parts += ["<h2>Feature cache</h2>", _html_frame(report.cache)]
    if report.config_yaml:
        parts += ["<h2>Resolved config</h2>", f"<pre>{esc(report.config_yaml)}</pre>"]
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'>"
            f"<title>{esc(report.title)}</title><style>{STYLE}</style></head><body>"
            + "\n".join(parts) + "</body></html>\n")


def write_report(report: Report, out_dir: str | Path) -> tuple[Path, Path]:
    """Write ``report.md`` and ``report.html`` into ``out_dir``; returns both paths."""
    out_dir = Path(out_dir)
    md, page = out_dir / "report.md", out_dir / "report.html"
    write_text_atomic(md, to_markdown(report, out_dir))
    write_text_atomic(page, to_html(report))
    return md, page

