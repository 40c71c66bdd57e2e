"""The results contract of a finished sweep (or run) and the paper-table record: what a method's
table builders read (:class:`SweepResults`) and return (:class:`PaperTable`). The report layer
renders PaperTables and collects sweeps; the methods build tables without importing it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Callable

import pandas as pd
from omegaconf import DictConfig, OmegaConf


@dataclass
class PaperTable:
    """One table in a paper's layout. ``frame`` holds numbers as numbers (formatting is the
    renderer's job); ``best`` maps a column to ``"max"`` or ``"min"``: the renderer bolds the best
    value and underlines the second, as the paper does. ``group_by`` optionally names a column
    whose blocks (e.g. benchmark) are ranked separately. ``na_rep`` is how the renderers print a
    missing cell (CSV keeps it empty). ``unranked``: index labels of reference rows (chance,
    a planted calibration backbone) that are shown but never marked best or second."""

    name: str
    frame: pd.DataFrame
    caption: str = ""
    best: dict[str, str] = field(default_factory=dict)
    group_by: str | None = None
    decimals: int = 3
    na_rep: str = ""
    unranked: tuple = ()


class SweepResults:
    """Everything a builder may read from a finished sweep (or a single run folder).

    * :attr:`combined`: every job's ``summary.parquet`` rows (wide, the stage's own columns) with
      the job folder in ``job``;
    * :meth:`summaries` / :meth:`per_sample`: one stage's rows, ``per_sample`` with ``encoder``,
      ``dataset``, ``stage`` and ``finding`` columns added from the results path
      ``results/<encoder>/<dataset>/<stage>/<finding>/``;
    * :meth:`entries`: ``(encoder, dataset, stage, cache entry)`` of every job (``entries.json``),
      for steps that re-score the same features (e.g. CRoMa's panel median-k);
    * :attr:`config`: the first finished job's resolved config;
    * :meth:`manifest`: a job's manifest rebuilt from its config, through the loader the collector
      passes in (``load_manifest``; the command line's is :func:`robustbench_fm.pipeline.job.job_manifest`),
      for steps that re-score the same features.
    """

    def __init__(self, root: str | Path, combined: pd.DataFrame | None = None,
                 load_manifest: Callable[[DictConfig], pd.DataFrame] | None = None):
        self.root = Path(root)
        self._combined = combined
        self._load_manifest = load_manifest

    def manifest(self, cfg: DictConfig) -> pd.DataFrame:
        """The manifest of the job whose resolved config is ``cfg``."""
        if self._load_manifest is None:
            raise ValueError(f"{self.root}: this step re-scores cached features and needs the jobs' manifests; "
                             "run it through the sweep's collect step (python -m robustbench_fm collect <sweep>)")
        return self._load_manifest(cfg)

    @cached_property
    def job_dirs(self) -> list[Path]:
        if (self.root / "config.yaml").exists() and not any(self.root.glob("*/config.yaml")):
            return [self.root]
        dirs = [p for p in sorted(self.root.iterdir()) if p.is_dir() and (p / "config.yaml").exists()]
        collected = self.root / "collect"
        if collected.is_dir():
            dirs += [p for p in sorted(collected.iterdir()) if p.is_dir()]
        return dirs

    @cached_property
    def combined(self) -> pd.DataFrame:
        if self._combined is not None:
            return self._combined
        parts = [pd.read_parquet(d / "summary.parquet").assign(job=d.name) for d in self.job_dirs
                 if (d / "summary.parquet").exists()]
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()

    @cached_property
    def config(self) -> DictConfig | None:
        for d in self.job_dirs:
            if (d / "config.yaml").exists():
                return OmegaConf.load(d / "config.yaml")
        return None

    def job_config(self, job: str) -> DictConfig | None:
        """The resolved config of job folder ``job`` (e.g. to read the value an ablation swept)."""
        for d in self.job_dirs:
            if d.name == job and (d / "config.yaml").exists():
                return OmegaConf.load(d / "config.yaml")
        return None

    def _result_files(self, stage: str, name: str) -> list[tuple[Path, dict]]:
        out = []
        for d in self.job_dirs:
            for f in sorted((d / "results").glob(f"*/*/{stage}/*/{name}")):
                encoder, dataset, _, finding = f.parent.relative_to(d / "results").parts
                out.append((f, {"encoder": encoder, "dataset": dataset, "stage": stage, "finding": finding,
                                "job": d.name}))
        return out

    def summaries(self, stage: str) -> pd.DataFrame:
        """Every summary row of ``stage`` with encoder/dataset/stage/finding/job columns."""
        return self._read(stage, "summary.parquet")

    def per_sample(self, stage: str) -> pd.DataFrame:
        """Every per-sample row of ``stage`` with encoder/dataset/stage/finding/job columns."""
        return self._read(stage, "per_sample.parquet")

    def _read(self, stage: str, name: str) -> pd.DataFrame:
        parts = []
        for f, keys in self._result_files(stage, name):
            df = pd.read_parquet(f)
            for col, value in keys.items():
                if col not in df.columns:
                    df[col] = value
            parts.append(df)
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()

    def entries(self) -> list[tuple[str, str, str, Path]]:
        out = []
        for d in self.job_dirs:
            f = d / "entries.json"
            if f.exists():
                rec = json.loads(f.read_text())
                out += [(e["encoder"], rec["dataset"], rec["stage"], Path(e["entry"])) for e in rec["entries"]]
        return out
