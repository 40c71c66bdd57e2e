"""Multirun support: the panel fan-out and the collect step that ends every sweep.

``-m`` fans out one job per encoder of the job's panel (``hydra.sweeper.params.encoder`` is
``${sweep_values:${encoders},${encoder.name}}``); with ``extract.num_shards=N`` and
``extract.shard=range(N)`` each (encoder, part) is a job that only extracts its part.

:func:`collect` (run by :class:`CollectCallback` when a multirun ends, and by
``python -m robustbench_fm collect <sweep dir>``) reads every job folder of a sweep:

* jobs whose ``status.json`` is not ``done`` are listed in ``missing.txt`` with their error;
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
from pathlib import Path
from typing import Any

import pandas as pd
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from .atomic import write_atomic, write_text_atomic
from .errors import UserError
from .redact import redacted_yaml
from .resolvers import register, sweep_values  # noqa: F401  (sweep_values: kept importable from here)

log = logging.getLogger("robustbench_fm")

SHARD_NAME = "shard-{:05d}.parquet"


class IncompleteSweep(UserError, RuntimeError):
    """Some cache entries of a sharded sweep lack parts; the message names the missing shards."""


def register_resolvers() -> None:
    """The configs' resolvers (:mod:`.resolvers`; importing the package registers them too)."""
    register()


def _job_dirs(sweep_dir: Path) -> list[Path]:
    return sorted(p for p in sweep_dir.iterdir()
                  if p.is_dir() and p.name not in ("collect", ".submitit")
                  and ((p / "status.json").exists() or (p / "config.yaml").exists()))


def _collect_parts(records: list[tuple[Path, dict]], sweep_dir: Path) -> tuple[list, list[str]]:
    """Run the stage on the complete entries of sharded jobs; report the incomplete ones.
    Returns ``(summary, config of the group's first part)`` pairs and the problems."""
    from . import app
    from .features import missing_shards, skipped_ids

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


def collect(sweep_dir: str | Path) -> pd.DataFrame:
    """Merge a sweep's results into ``combined.parquet``/``.csv`` (see module docstring)."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise FileNotFoundError(f"collect: sweep folder '{sweep_dir}' does not exist; pass the multirun folder")
    started = time.perf_counter()
    summaries, missing, parts = [], [], []  # summaries: (summary, job config) pairs
    for job_dir in _job_dirs(sweep_dir):
        status_file = job_dir / "status.json"
        status = json.loads(status_file.read_text()) if status_file.exists() else {"status": "not started"}
        if status["status"] != "done":
            missing.append(f"{job_dir.name}: {status['status']}" + (f" ({status['error']})" if status.get("error") else ""))
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
          + (f"; {len(missing)} problems listed in {sweep_dir / 'missing.txt'}" if missing else ""))
    if problems:
        raise IncompleteSweep(f"{sweep_dir}: {len(problems)} cache entries incomplete: " + "; ".join(problems))
    return combined


def _long(summaries: list[tuple[pd.DataFrame, DictConfig | None]]) -> pd.DataFrame:
    """Every job's summary in long format (stage, seed and config hash from the job's config)."""
    from .report.long_format import LONG_COLUMNS, to_long

    parts = [to_long(summary, str(OmegaConf.select(cfg, "stage.name", default="")) if cfg is not None else "",
                     cfg, str(summary["job"].iloc[0]) if len(summary) else "")
             for summary, cfg in summaries]
    parts = [p for p in parts if not p.empty]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=LONG_COLUMNS)


def _write_tables(sweep_dir: Path, combined: pd.DataFrame) -> list:
    """The paper tables the sweep's experiment lists in ``report.tables`` -> ``<sweep>/tables/``,
    and their comparison with the published values -> ``compare.md`` / ``compare.csv``."""
    from .report.compare import write_compare
    from .report.render import render
    from .report.tables import SweepResults, get

    results = SweepResults(sweep_dir, combined)
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
    """``report.md`` / ``report.html`` of the sweep (:mod:`.report.html`)."""
    from .report.html import sweep_report, write_report
    from .results import to_markdown

    report = sweep_report(sweep_dir, long, tables, missing, seconds)
    md, html = write_report(report, sweep_dir)
    if len(report.summary):
        print("\n" + to_markdown(report.summary))
    print(f"collect: report -> {html} ({md.name} beside it)")


class CollectCallback(Callback):
    """Hydra callback: run :func:`collect` on the sweep folder when a multirun ends."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            collect(config.hydra.sweep.dir)
        except UserError as exc:
            print(f"error: {exc}", file=sys.stderr)
