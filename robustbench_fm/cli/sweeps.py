"""Multirun support: the panel fan-out and the collect step that ends every sweep.

``-m`` fans out one job per encoder of the job's panel (``hydra.sweeper.params.encoder`` is
``${sweep_values:${encoders},${encoder.name}}``); with ``extract.num_shards=N`` and
``extract.shard=range(N)`` each (encoder, part) is a job that only extracts its part.

:func:`collect` (run by :class:`CollectCallback` when a multirun ends, and by
``python -m robustbench_fm collect <sweep dir>``) reads every job folder of a sweep:

* jobs whose ``status.json`` is not ``done`` are listed in ``missing.txt`` with their error:
  ``failed``, ``interrupted`` (Ctrl-C, or a ``running`` job whose process is gone: its lock is
  abandoned), ``running``, and ``never started``: the sweep writes the list of its jobs to
  ``jobs.json`` when it starts (:class:`CollectCallback`), so jobs that never got a folder are
  listed too;
* sharded extractions: once every part of a cache entry is in, the stage runs here on the
  complete entries (``collect/<dataset>-<stage>/``); an entry with missing shards is refused,
  naming the shards, in ``missing.txt`` and in the :class:`IncompleteSweep` error;
* every summary (jobs' and collected) goes into ``combined.parquet`` / ``combined.csv`` with the
  job folder in column ``job``, and in long format (:mod:`.report.long_format`: encoder,
  dataset, task, stage, group, metric, value, ci_low, ci_high, n, seed, config_hash, job) into
  ``results_long.parquet`` / ``results_long.csv``. Numbers stay numbers;
* the paper tables of the experiment's ``report.tables`` go to ``tables/``, their comparison
  with the published values to ``compare.md`` / ``compare.csv``, and ``report.md`` /
  ``report.html`` sum the sweep up (:mod:`.report.html`).
"""
from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from ..core.atomic import write_atomic, write_text_atomic
from ..core.errors import UserError
from ..core.locking import abandoned, read_holder
from ..core.redact import redacted_yaml
from ..core.tables import SweepResults
from ..report.compare import write_compare
from ..report.html import console_summary, sweep_report, write_report
from ..report.long_format import LONG_COLUMNS, to_long
from ..report.render import render
from ..report.tables import get
from .resolvers import register, sweep_values  # noqa: F401  (sweep_values: kept importable from here)

log = logging.getLogger("robustbench_fm")



class IncompleteSweep(UserError, RuntimeError):
    """Some cache entries of a sharded sweep lack parts; the message names the missing shards."""


def register_resolvers() -> None:
    """The configs' resolvers (:mod:`.resolvers`; importing the package registers them too)."""
    register()


#: the sweep's job list, written when a multirun starts: {"jobs": [{"num", "dir", "overrides"}]}
JOBS_FILE = "jobs.json"


def plan_jobs(config: DictConfig, with_configs: bool = False) -> list[dict] | None:
    """The jobs Hydra's basic sweeper launches for the multirun config ``config``, in launch
    order: number, folder (``hydra.sweep.subdir``, relative to the sweep folder) and overrides
    (with ``with_configs``, also each job's composed ``config``). Expanded as the sweeper does
    (its ``params`` then the command line, each job's config composed to resolve its folder
    name); None for another sweeper."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import open_dict

    sweeper = config.hydra.sweeper
    if sweeper.get("_target_") != f"{BasicSweeper.__module__}.{BasicSweeper.__name__}":
        return None
    loader = GlobalHydra.instance().config_loader()
    arguments = [f"{k}={v}" for k, v in (sweeper.get("params") or {}).items()]
    arguments += OmegaConf.to_container(config.hydra.overrides.task, resolve=False)
    overrides = OverridesParser.create(config_loader=loader).parse_overrides(arguments)
    batches = BasicSweeper.split_arguments(overrides, sweeper.get("max_batch_size"))
    jobs = []
    for num, job in enumerate(job for batch in batches for job in batch):
        job_cfg = loader.load_sweep_config(config, list(job))
        with open_dict(job_cfg):
            job_cfg.hydra.job.id = job_cfg.hydra.job.num = num
        jobs.append({"num": num, "dir": str(job_cfg.hydra.sweep.subdir), "overrides": list(job),
                     **({"config": job_cfg} if with_configs else {})})
    return jobs


#: launcher settings a dry run of a sweep shows (where the launcher has them)
LAUNCHER_SETTINGS = ("partition", "account", "qos", "gpus_per_node", "cpus_per_task", "mem_gb", "timeout_min",
                     "array_parallelism", "n_jobs")


def dry_run_sweep(config: DictConfig) -> int:
    """``-m ... dry_run=true``: print the jobs the sweep would launch, with which launcher and
    settings, each job's plan checked (:func:`.app.plan`: names, data folders, options); launch
    nothing and write nothing. Returns the exit code: 0, or 2 when a job's plan fails."""
    from . import app  # lazy: imports torch

    jobs = plan_jobs(config, with_configs=True)
    launcher = config.hydra.launcher
    settings = ", ".join(f"{k}={launcher[k]}" for k in LAUNCHER_SETTINGS if launcher.get(k) is not None)
    kind = str(launcher.get("_target_", "?")).rsplit(".", 1)[-1]
    if jobs is None:
        print(f"dry run: the sweeper {config.hydra.sweeper.get('_target_')} lists its jobs only when it runs")
        return 0
    print(f"dry run of a sweep: {len(jobs)} jobs with {kind}" + (f" ({settings})" if settings else "")
          + f" into {config.hydra.sweep.dir}")
    bad = 0
    for job in jobs:
        try:
            app.plan(job["config"], job["overrides"])
            verdict = "ok"
        except app.USER_ERRORS as exc:
            bad += 1
            verdict = "error: " + str(exc.args[0] if isinstance(exc, KeyError) and exc.args else exc)
        print(f"  #{job['num']} {job['dir']}: {verdict}")
    print(f"nothing was launched (dry_run=true); {bad} of {len(jobs)} jobs would fail their checks" if bad
          else "nothing was launched (dry_run=true); every job's names, data folders and options check out")
    return 2 if bad else 0


def _job_dirs(sweep_dir: Path) -> list[Path]:
    """The sweep's job folders: those of ``jobs.json`` in launch order (whether or not they
    exist), then any other folder holding a job's ``status.json`` or ``config.yaml``."""
    planned = []
    if (sweep_dir / JOBS_FILE).is_file():
        planned = [sweep_dir / job["dir"] for job in json.loads((sweep_dir / JOBS_FILE).read_text())["jobs"]]
    found = sorted(p for p in sweep_dir.iterdir()
                   if p.is_dir() and p.name not in ("collect", ".submitit")
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
    from ..features.cache import SHARD_NAME  # lazy: imports torch
    from . import app  # lazy: imports torch

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
        job = app.plan(cfg, ["encoder=" + complete[0][0]])
        manifest = app.load_manifest(job, cfg)
        skipped = sorted({s for _, entry in complete for s in skipped_ids(entry)})
        out = sweep_dir / "collect" / f"{dataset}-{stage}"
        out.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out / "config.yaml", redacted_yaml(cfg))  # so the report step reads it like a job's
        app._record_entries(out, job, [(n, e, []) for n, e in complete], {})
        for summary in app.run_stage_on_entries(job, cfg, manifest, complete, skipped, out):
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
    missing += problems
    combined = pd.concat([s for s, _ in summaries], ignore_index=True) if summaries else pd.DataFrame()
    write_atomic(sweep_dir / "combined.parquet", lambda f: combined.to_parquet(f, index=False))
    write_text_atomic(sweep_dir / "combined.csv", combined.to_csv(index=False))
    long = _long(summaries)
    write_atomic(sweep_dir / "results_long.parquet", lambda f: long.to_parquet(f, index=False))
    write_text_atomic(sweep_dir / "results_long.csv", long.to_csv(index=False))
    write_text_atomic(sweep_dir / "missing.txt", "".join(f"{line}\n" for line in missing))
    tables = _write_tables(sweep_dir, combined)
    _write_report(sweep_dir, long, tables, missing, time.perf_counter() - started)
    print(f"collect: {len(combined)} summary rows from {len(summaries)} results -> {sweep_dir / 'combined.parquet'}"
          + (f"; {len(missing)} problem{'s' if len(missing) != 1 else ''} listed in {sweep_dir / 'missing.txt'}"
             if missing else ""))
    return Collected(combined, len(jobs), unfinished, problems)


def _long(summaries: list[tuple[pd.DataFrame, DictConfig | None]]) -> pd.DataFrame:
    """Every job's summary in long format (stage, seed and config hash from the job's config)."""

    parts = [to_long(summary, str(OmegaConf.select(cfg, "stage.name", default="")) if cfg is not None else "",
                     cfg, str(summary["job"].iloc[0]) if len(summary) else "")
             for summary, cfg in summaries]
    parts = [p for p in parts if not p.empty]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=LONG_COLUMNS)


def _write_tables(sweep_dir: Path, combined: pd.DataFrame) -> list:
    """The paper tables the sweep's experiment lists in ``report.tables`` -> ``<sweep>/tables/``,
    and their comparison with the published values -> ``compare.md`` / ``compare.csv``."""
    from .app import job_manifest  # lazy: imports torch

    results = SweepResults(sweep_dir, combined, load_manifest=job_manifest)
    names = list((results.config.get("report") or {}).get("tables") or []) if results.config is not None else []
    if not names or combined.empty:
        return []
    tables = [table for name in names for table in get(name)(results)]
    written = [path for table in tables for path in render(table, sweep_dir / "tables")]
    print(f"collect: {len(names)} tables -> {sweep_dir / 'tables'} ({len(written)} files)")
    cmp = write_compare(tables, sweep_dir)
    if len(cmp):
        print(f"collect: {len(cmp)} cells compared with the published values, {int(cmp['outside'].sum())} "
              f"outside the published interval -> {sweep_dir / 'compare.md'}")
    return tables


def _write_report(sweep_dir: Path, long: pd.DataFrame, tables: list, missing: list[str], seconds: float) -> None:
    """``report.md`` / ``report.html`` of the sweep (:mod:`.report.html`); ``seconds``: the collect
    step's time (the report's runtime is the sweep's wall clock, from the jobs' ``status.json``)."""

    report = sweep_report(sweep_dir, long, tables, missing, seconds)
    md, html = write_report(report, sweep_dir)
    shown = console_summary(report)
    if shown:
        print("\n" + shown)
    print(f"collect: report -> {html} ({md.name} beside it)")


class CollectCallback(Callback):
    """Hydra callback: when a multirun starts, write its job list (``jobs.json``); when it ends,
    run :func:`collect` on the sweep folder and exit non-zero if any job did not finish (the
    jobs themselves record a failure and return, so every job of the sweep runs)."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if config.get("dry_run"):
            raise SystemExit(dry_run_sweep(config))
        try:
            jobs = plan_jobs(config)
        except Exception as exc:  # noqa: BLE001  (bookkeeping never stops a sweep; the sweeper reports bad configs)
            log.warning("could not list the sweep's jobs (%s: %s); collect lists only the jobs that start",
                        type(exc).__name__, exc)
            return
        if jobs is not None:
            sweep_dir = Path(str(config.hydra.sweep.dir))
            sweep_dir.mkdir(parents=True, exist_ok=True)
            write_text_atomic(sweep_dir / JOBS_FILE, json.dumps({"jobs": jobs}, indent=1) + "\n")

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        result = collect_and_report(str(config.hydra.sweep.dir))
        # a sweep of some parts of a sharded extraction (the rest run elsewhere) is fine: the
        # error names the missing shards, and `collect` exits 2 until they are in
        if result is None or result.unfinished:
            raise SystemExit(1)
