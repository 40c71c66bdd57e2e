"""What ends every sweep and every experiment run as a unit: the collect step.

:func:`collect` (run by ``robustbench_fm.cli.sweeps.CollectCallback`` when a multirun ends, and by
``python -m robustbench_fm collect <sweep dir>``) reads every job folder of a sweep:

* jobs whose ``status.json`` is not ``done`` are listed in ``missing.txt`` with their error:
  ``failed``, ``interrupted`` (Ctrl-C, or a ``running`` job whose process is gone: its lock is
  abandoned), ``running``, and ``never started``: the sweep writes the list of its jobs to
  ``jobs.json`` when it starts (``robustbench_fm.cli.sweeps.CollectCallback``), so jobs that never got a folder are
  listed too;
* sharded extractions: once every part of a cache entry is in, the stage runs here on the
  complete entries (``collect/<dataset>-<stage>/``); an entry with missing shards is refused,
  naming the shards, in ``missing.txt`` and in the :class:`IncompleteSweep` error;
* every summary (jobs' and collected) goes into ``combined.parquet`` / ``combined.csv`` with the
  job folder in column ``job``, and in long format (:mod:`robustbench_fm.report.long_format`: encoder,
  dataset, task, stage, group, metric, value, ci_low, ci_high, n, seed, config_hash, job) into
  ``results_long.parquet`` / ``results_long.csv``. Numbers stay numbers;
* with two or more encoders, their paired comparisons, ranking and verdict
  (:mod:`robustbench_fm.report.comparisons`: ``comparisons.csv``, ``ranking.csv``,
  ``ranking_overall.csv``, the report's "Which encoder");
* the paper tables of the experiment's ``report.tables`` go to ``tables/``, their comparison
  with the published values to ``compare.md`` / ``compare.csv``, and ``report.md`` /
  ``report.html`` sum the sweep up (:mod:`robustbench_fm.report.html`).

Also run by :func:`robustbench_fm.pipeline.experiment.run_jobs` after an experiment's jobs ran in
this process. Imports no Hydra.
"""

from __future__ import annotations

import json
import logging
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from ..core.atomic import write_atomic, write_text_atomic
from ..core.errors import UserError, message
from ..core.locking import abandoned, read_holder
from ..core.redact import redacted_yaml
from ..core.shards import SHARD_NAME
from ..core.tables import SweepResults
from ..report.compare import write_compare
from ..report.comparisons import build as build_comparisons
from ..report.comparisons import verdict
from ..report.html import console_summary, sweep_report, write_report
from ..report.long_format import LONG_COLUMNS, to_long
from ..report.render import render
from ..report.tables import get
from .job import job_manifest, load_manifest, record_entries, run_stage_on_entries
from .plan import plan

log = logging.getLogger("robustbench_fm")


class IncompleteSweep(UserError, RuntimeError):
    """Some cache entries of a sharded sweep lack parts; the message names the missing shards."""


#: the sweep's job list, written when a multirun starts: {"jobs": [{"num", "dir", "overrides"}]}, and
#: with ``extract.panel_jobs`` its extraction jobs: "extraction": [{"num", "dir", "panels"}]
JOBS_FILE = "jobs.json"
#: the folder of a sweep's panel-extraction jobs (``extract.panel_jobs``): ``<sweep>/extract/<i>/``
EXTRACT_DIR = "extract"


def _job_dirs(sweep_dir: Path) -> list[Path]:
    """The sweep's job folders: those of ``jobs.json`` in launch order (whether or not they
    exist), then any other folder holding a job's ``status.json`` or ``config.yaml``."""
    planned = []
    if (sweep_dir / JOBS_FILE).is_file():
        planned = [sweep_dir / job["dir"] for job in json.loads((sweep_dir / JOBS_FILE).read_text())["jobs"]]
    found = sorted(p for p in sweep_dir.iterdir()
                   if p.is_dir() and p.name not in ("collect", ".submitit", EXTRACT_DIR)
                   and ((p / "status.json").exists() or (p / "config.yaml").exists()))
    return planned + [p for p in found if p not in planned]


def job_state(job_dir: Path) -> tuple[str, str]:
    """``(status, detail)`` of one job folder: ``done``, ``failed``, ``interrupted``, ``running``
    or ``never started``. A ``running`` job whose lock is abandoned (its process died on this
    host: SIGKILL, out of memory, node lost) is ``interrupted``, and its ``status.json`` says so."""

    status_file = job_dir / "status.json"

    def read() -> tuple[str, str]:
        record = json.loads(status_file.read_text())
        return record.get("status", "unknown"), record.get("error", "") or ""

    if not status_file.exists():
        return "never started", ""
    status, detail = read()
    if status != "running":
        return status, detail
    lock = job_dir / ".lock"
    holder = read_holder(lock)
    reason = abandoned(lock) if holder is not None else None
    if holder is not None and reason is None:
        return "running", f"held by {holder.describe()}"
    status, detail = read()  # a run writes its result before it releases its lock: look again
    if status != "running":
        return status, detail
    detail = f"the run stopped: {reason or 'its lock is gone but it recorded no result'}"
    now = read_holder(lock)
    if holder is not None and now is not None and now.identity == holder.identity:
        # still the dead holder's lock (a new run breaks it before it writes): record what happened
        try:
            write_text_atomic(status_file, json.dumps({"status": "interrupted", "error": detail}) + "\n")
        except OSError:
            pass
    return "interrupted", detail


def _collect_parts(records: list[tuple[Path, dict]], sweep_dir: Path) -> tuple[list, list[str]]:
    """Run the stage on the complete entries of sharded jobs; report the incomplete ones.
    Returns ``(summary, config of the group's first part)`` pairs and the problems."""
    from ..features import missing_shards, skipped_ids  # lazy: imports torch

    summaries, problems = [], []
    groups: dict[tuple[str, str], list[tuple[Path, dict]]] = {}
    for job_dir, rec in records:
        groups.setdefault((rec["dataset"], rec["stage"]), []).append((job_dir, rec))
    for (dataset, stage), recs in sorted(groups.items()):
        entries: dict[str, Path] = {}
        for _, rec in recs:
            for e in rec["entries"]:
                entries.setdefault(e["encoder"], Path(e["entry"]))
        complete = []
        for name, entry in sorted(entries.items()):
            gone = missing_shards(entry)
            if gone:
                shown = ", ".join(SHARD_NAME.format(i) for i in gone[:5]) + (", ..." if len(gone) > 5 else "")
                problems.append(f"{name} on {dataset}: cache entry {entry} lacks {len(gone)} shards ({shown}); "
                                f"run the missing parts (extract.shard=...) and collect again")
            else:
                complete.append((name, entry))
        if not complete:
            continue
        first = min(recs, key=lambda r: (r[1]["part"], r[0].name))[0]
        cfg = OmegaConf.load(first / "config.yaml")
        job = plan(cfg, ["encoder=" + complete[0][0]])
        manifest = load_manifest(job)
        skipped = sorted({s for _, entry in complete for s in skipped_ids(entry)})
        out = sweep_dir / "collect" / f"{dataset}-{stage}"
        out.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out / "config.yaml", redacted_yaml(cfg))  # so the report step reads it like a job's
        record_entries(out, job, [(n, e, []) for n, e in complete], {})
        for summary in run_stage_on_entries(job, manifest, complete, skipped, out):
            summaries.append((summary.assign(job=f"collect/{out.name}"), cfg))
    return summaries, problems


@dataclass
class Collected:
    """What :func:`collect_sweep` found: the combined table, the number of jobs, the jobs that did
    not finish (``(job folder, status, detail)``) and the incomplete sharded entries."""

    combined: pd.DataFrame
    n_jobs: int
    unfinished: list[tuple[str, str, str]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    tables: list = field(default_factory=list)  # the paper tables built (PaperTable)
    table_errors: list[str] = field(default_factory=list)  # one line per requested table that could not be built

    def summary_line(self, sweep_dir: Path) -> str | None:
        """``N of M jobs failed: ...; see <sweep>/missing.txt``, or None when every job is done."""
        if not self.unfinished:
            return None
        shown = [f"{name} ({status}{': ' + _short(detail) if status == 'failed' and detail else ''})"
                 for name, status, detail in self.unfinished[:3]]
        more = f" and {len(self.unfinished) - 3} more" if len(self.unfinished) > 3 else ""
        return (f"{len(self.unfinished)} of {self.n_jobs} jobs failed: {', '.join(shown)}{more}; "
                f"see {Path(sweep_dir) / 'missing.txt'}")


def _short(text: str, width: int = 100) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def collect(sweep_dir: str | Path) -> pd.DataFrame:
    """Merge a sweep's results into ``combined.parquet``/``.csv`` (see module docstring); raises
    :class:`IncompleteSweep` when sharded cache entries lack parts."""
    result = collect_sweep(sweep_dir)
    if result.problems:
        raise IncompleteSweep(f"{sweep_dir}: {len(result.problems)} cache entries incomplete: "
                              + "; ".join(result.problems))
    return result.combined


def collect_and_report(sweep_dir: str | Path) -> Collected | None:
    """:func:`collect`, then its outcome in one line each (the end of every sweep, and
    ``python -m robustbench_fm collect``): ``error: ...`` for incomplete sharded entries, and
    last ``N of M jobs failed: ...`` when jobs failed, were interrupted or never started.
    None (after a one-line error) when nothing could be collected."""
    try:
        result = collect_sweep(sweep_dir)
    except (UserError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None
    sys.stdout.flush()
    if result.problems:
        print(f"error: {sweep_dir}: {len(result.problems)} cache entries incomplete: " + "; ".join(result.problems),
              file=sys.stderr)
    line = result.summary_line(Path(sweep_dir))
    if line:
        print(line, file=sys.stderr)
    return result


def collect_sweep(sweep_dir: str | Path) -> Collected:
    """Merge a sweep's results (see module docstring) and say which jobs did not finish."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise FileNotFoundError(f"collect: sweep folder '{sweep_dir}' does not exist; pass the multirun folder")
    started = time.perf_counter()
    summaries, missing, parts, unfinished = [], [], [], []  # summaries: (summary, job config) pairs
    jobs = _job_dirs(sweep_dir)
    for job_dir in jobs:
        status, detail = job_state(job_dir)
        if status != "done":
            name = job_dir.relative_to(sweep_dir).as_posix()
            unfinished.append((name, status, detail))
            missing.append(f"{name}: {status}" + (f" ({detail})" if detail else ""))
            continue
        if (job_dir / "extracted.json").exists():
            parts.append((job_dir, json.loads((job_dir / "extracted.json").read_text())))
        if (job_dir / "summary.parquet").exists():
            cfg = OmegaConf.load(job_dir / "config.yaml") if (job_dir / "config.yaml").exists() else None
            summaries.append((pd.read_parquet(job_dir / "summary.parquet").assign(job=job_dir.name), cfg))
    collected, problems = _collect_parts(parts, sweep_dir)
    summaries += collected
    missing += problems + _extraction_problems(sweep_dir)
    combined = pd.concat([s for s, _ in summaries], ignore_index=True) if summaries else pd.DataFrame()
    write_atomic(sweep_dir / "combined.parquet", lambda f: combined.to_parquet(f, index=False))
    write_text_atomic(sweep_dir / "combined.csv", combined.to_csv(index=False))
    long = _long(summaries)
    write_atomic(sweep_dir / "results_long.parquet", lambda f: long.to_parquet(f, index=False))
    write_text_atomic(sweep_dir / "results_long.csv", long.to_csv(index=False))
    tables, table_errors = _write_tables(sweep_dir, combined)
    missing += table_errors
    write_text_atomic(sweep_dir / "missing.txt", "".join(f"{line}\n" for line in missing))
    which = verdict(build_comparisons(sweep_dir))  # paired comparisons of the encoders (comparisons.csv)
    _write_report(sweep_dir, long, tables, missing, time.perf_counter() - started)
    if which:
        print(f"Which encoder (paired, {sweep_dir / 'comparisons.csv'}):\n" + "".join(f"- {line}\n" for line in which))
    print(f"collect: {len(combined)} summary rows from {len(summaries)} results -> {sweep_dir / 'combined.parquet'}"
          + (f"; {len(missing)} problem{'s' if len(missing) != 1 else ''} listed in {sweep_dir / 'missing.txt'}"
             if missing else ""))
    return Collected(combined, len(jobs), unfinished, problems, tables, table_errors)


def _long(summaries: list[tuple[pd.DataFrame, DictConfig | None]]) -> pd.DataFrame:
    """Every job's summary in long format (stage, seed and config hash from the job's config)."""

    parts = [to_long(summary, str(OmegaConf.select(cfg, "stage.name", default="")) if cfg is not None else "",
                     cfg, str(summary["job"].iloc[0]) if len(summary) else "")
             for summary, cfg in summaries]
    parts = [p for p in parts if not p.empty]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=LONG_COLUMNS)


#: the collect step's log (the traceback of a table builder that failed with a bug)
COLLECT_LOG = "collect.log"


def _write_tables(sweep_dir: Path, combined: pd.DataFrame) -> tuple[list, list[str]]:
    """The paper tables the sweep's experiment lists in ``report.tables`` -> ``<sweep>/tables/``,
    and their comparison with the published values -> ``compare.md`` / ``compare.csv``. A table
    that cannot be built is one ``error:`` line (a :class:`UserError`: its message; anything else
    is a bug: the traceback goes to ``<sweep>/collect.log``), the others are still written; returns
    the tables and those lines (the sweep then fails: :attr:`Collected.table_errors`)."""
    results = SweepResults(sweep_dir, combined, load_manifest=job_manifest)
    names = list((results.config.get("report") or {}).get("tables") or []) if results.config is not None else []
    if not names or combined.empty:
        return [], []
    tables, failed = [], {}  # cause -> the tables it stopped (one line per cause, naming them all)
    for name in names:
        try:
            tables += get(name)(results)
        except UserError as exc:
            failed.setdefault(message(exc), []).append(name)
        except Exception as exc:  # noqa: BLE001  (a bug: one line here, the traceback in the log)
            log_file = sweep_dir / COLLECT_LOG
            with open(log_file, "a") as f:
                f.write(f"table {name}:\n{traceback.format_exc()}\n")
            failed.setdefault(f"{type(exc).__name__}: {message(exc)}; this is a bug (please report it): "
                              f"the traceback is in {log_file}", []).append(name)
    errors = [("table " if len(which) == 1 else "tables ") + f"{', '.join(which)}: {cause}"
              for cause, which in failed.items()]
    for line in errors:
        print(f"error: collect: {line}", file=sys.stderr)
    written = [path for table in tables for path in render(table, sweep_dir / "tables")]
    print(f"collect: {len(names)} tables -> {sweep_dir / 'tables'} ({len(written)} files)")
    cmp = write_compare(tables, sweep_dir)
    if len(cmp):
        print(f"collect: {len(cmp)} cells compared with the published values, {int(cmp['outside'].sum())} "
              f"outside the published interval -> {sweep_dir / 'compare.md'}")
    return tables, errors


def _write_report(sweep_dir: Path, long: pd.DataFrame, tables: list, missing: list[str], seconds: float) -> None:
    """``report.md`` / ``report.html`` of the sweep (:mod:`.report.html`); ``seconds``: the collect
    step's time (the report's runtime is the sweep's wall clock, from the jobs' ``status.json``)."""

    report = sweep_report(sweep_dir, long, tables, missing, seconds)
    md, html = write_report(report, sweep_dir)
    shown = console_summary(report)
    if shown:
        print("\n" + shown)
    print(f"collect: report -> {html} ({md.name} beside it)")



def _extraction_problems(sweep_dir: Path) -> list[str]:
    """``missing.txt`` lines of the sweep's extraction jobs (``jobs.json``) that did not finish;
    informational: their stage jobs extracted what was missing themselves."""
    if not (sweep_dir / JOBS_FILE).is_file():
        return []
    lines = []
    for job in json.loads((sweep_dir / JOBS_FILE).read_text()).get("extraction", []):
        status, detail = job_state(sweep_dir / job["dir"])
        if status != "done":
            lines.append(f"{job['dir']}: {status}" + (f" ({detail})" if detail else "")
                         + "; panel extraction only: its stage jobs extracted what was missing themselves")
    return lines

