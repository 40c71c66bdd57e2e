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
  job folder in column ``job``. Numbers stay numbers.
"""
from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import pandas as pd
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from .atomic import write_atomic, write_text_atomic
from .errors import UserError

log = logging.getLogger("robustbench_fm")

SHARD_NAME = "shard-{:05d}.parquet"


class IncompleteSweep(UserError, RuntimeError):
    """Some cache entries of a sharded sweep lack parts; the message names the missing shards."""


def sweep_values(encoders, name) -> str:
    """The sweeper's value list for ``encoder``: the panel as ``a,b,c``, else the one encoder."""
    return ",".join(str(e) for e in encoders) if encoders else str(name)


def register_resolvers() -> None:
    OmegaConf.register_new_resolver("sweep_values", sweep_values, replace=True)


def _job_dirs(sweep_dir: Path) -> list[Path]:
    return sorted(p for p in sweep_dir.iterdir()
                  if p.is_dir() and p.name not in ("collect", ".submitit")
                  and ((p / "status.json").exists() or (p / "config.yaml").exists()))


def _collect_parts(records: list[tuple[Path, dict]], sweep_dir: Path) -> tuple[list[pd.DataFrame], list[str]]:
    """Run the stage on the complete entries of sharded jobs; report the incomplete ones."""
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
        for summary in app.run_stage_on_entries(job, cfg, manifest, complete, skipped, out):
            summaries.append(summary.assign(job=f"collect/{out.name}"))
    return summaries, problems


def collect(sweep_dir: str | Path) -> pd.DataFrame:
    """Merge a sweep's results into ``combined.parquet``/``.csv`` (see module docstring)."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise FileNotFoundError(f"collect: sweep folder '{sweep_dir}' does not exist; pass the multirun folder")
    summaries, missing, parts = [], [], []
    for job_dir in _job_dirs(sweep_dir):
        status_file = job_dir / "status.json"
        status = json.loads(status_file.read_text()) if status_file.exists() else {"status": "not started"}
        if status["status"] != "done":
            missing.append(f"{job_dir.name}: {status['status']}" + (f" ({status['error']})" if status.get("error") else ""))
            continue
        if (job_dir / "extracted.json").exists():
            parts.append((job_dir, json.loads((job_dir / "extracted.json").read_text())))
        if (job_dir / "summary.parquet").exists():
            summaries.append(pd.read_parquet(job_dir / "summary.parquet").assign(job=job_dir.name))
    collected, problems = _collect_parts(parts, sweep_dir)
    summaries += collected
    missing += problems
    combined = pd.concat(summaries, ignore_index=True) if summaries else pd.DataFrame()
    write_atomic(sweep_dir / "combined.parquet", lambda f: combined.to_parquet(f, index=False))
    write_text_atomic(sweep_dir / "combined.csv", combined.to_csv(index=False))
    write_text_atomic(sweep_dir / "missing.txt", "".join(f"{line}\n" for line in missing))
    _write_tables(sweep_dir, combined)
    print(f"collect: {len(combined)} summary rows from {len(summaries)} results -> {sweep_dir / 'combined.parquet'}"
          + (f"; {len(missing)} problems listed in {sweep_dir / 'missing.txt'}" if missing else ""))
    if problems:
        raise IncompleteSweep(f"{sweep_dir}: {len(problems)} cache entries incomplete: " + "; ".join(problems))
    return combined


def _write_tables(sweep_dir: Path, combined: pd.DataFrame) -> None:
    """The paper tables the sweep's experiment lists in ``report.tables`` -> ``<sweep>/tables/``."""
    from .report.tables import SweepResults, build_tables

    results = SweepResults(sweep_dir, combined)
    names = list((results.config.get("report") or {}).get("tables") or []) if results.config is not None else []
    if names and not combined.empty:
        written = build_tables(names, results, sweep_dir / "tables")
        print(f"collect: {len(names)} tables -> {sweep_dir / 'tables'} ({len(written)} files)")


class CollectCallback(Callback):
    """Hydra callback: run :func:`collect` on the sweep folder when a multirun ends."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            collect(config.hydra.sweep.dir)
        except UserError as exc:
            print(f"error: {exc}", file=sys.stderr)
