"""Shared by the report tests: the tables issue 10 rebuilds, and a synthetic finished sweep
written in the app's real on-disk layout (job folders with status.json, config.yaml,
summary.parquet and results/<encoder>/<dataset>/<stage>/<finding>/)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from robustbench_fm.results import Results

#: the tables issue 10 rebuilds (paper, version, number)
ISSUE_TABLES = ([("candor", "v4", n) for n in (2, 3, 4)] + [("candor", "v1", 4)]
                + [("croma", "", n) for n in (3, 4, 5, 7, 8, 9, 10, 11, 12, 13, 14)]
                + [("spar", "", n) for n in (1, 2, 3, 4, 5)])


def job_config(stage: str, dataset: str, root: str = "/data/x", seed: int = 42, **params) -> dict:
    return {"seed": seed, "paths": {"root": root, "cache_dir": f"{root}/cache"},
            "dataset": {"name": dataset, "root": f"{root}/{dataset}"}, "encoder": {"name": "e"},
            "stage": {"name": stage, "params": {"seed": seed, **params}}, "report": {"tables": []}}


def candor_summary(encoder: str, finding: str, n_queries: int, d: float, d_all: float) -> pd.DataFrame:
    """Rows of the candor stage's summary: one matched group and the pooled row."""
    row = {"encoder": encoder, "dataset": "planted", "finding": finding, "target": finding, "n_queries": n_queries,
           "n_pos": n_queries, "n_neg": 3 * n_queries, "bank_size": 4000, "k": 5, "d": d, "d_sd": 0.02,
           "d_ci_low": d - 0.04, "d_ci_high": d + 0.04, "d_all": d_all, "d_all_sd": 0.01,
           "d_all_ci_low": d_all - 0.02, "d_all_ci_high": d_all + 0.02, "margin_auroc": 1 - d, "reason": ""}
    return pd.DataFrame([{**row, "acq_group": "AP"}, {**row, "acq_group": "__pooled__"}])


def write_job(sweep: Path, name: str, cfg: dict, summary: pd.DataFrame, status: str = "done") -> Path:
    """One finished job folder, results saved per (encoder, finding) like app._stage_results."""
    job = sweep / name
    job.mkdir(parents=True)
    (job / "status.json").write_text(json.dumps({"status": status, "error": "" if status == "done" else "boom"}))
    (job / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(cfg)))
    if status == "done":
        summary.to_parquet(job / "summary.parquet", index=False)
        for (encoder, finding), rows in summary.groupby(["encoder", "finding"]):
            Results(summary=rows.reset_index(drop=True)).save(
                job / "results" / encoder / cfg["dataset"]["name"] / cfg["stage"]["name"] / finding)
    return job


def candor_sweep(sweep: Path) -> Path:
    """Two encoders x three findings of CANDOR, plus a failed job."""
    rng = np.random.default_rng(0)
    for k, encoder in enumerate(["planted_blur", "planted_sharp"]):
        parts = [candor_summary(encoder, f, n, float(rng.uniform(0.2, 0.6)), 0.9 - n / 1000)
                 for f, n in (("marker", 40), ("effusion", 120), ("edema", 400))]
        write_job(sweep, f"{k}_{encoder}-planted-candor", job_config("candor", "planted"),
                  pd.concat(parts, ignore_index=True))
    write_job(sweep, "2_random_vit_s-planted-candor", job_config("candor", "planted"), pd.DataFrame(),
              status="failed")
    return sweep
