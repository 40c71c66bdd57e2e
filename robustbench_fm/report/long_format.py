"""Stage summaries in one long format: one row per (encoder, dataset, task, stage, group, metric).

Columns (:data:`LONG_COLUMNS`): ``encoder, dataset, task, stage, group, metric, value, ci_low,
ci_high, n, seed, config_hash, job``; numbers stay numbers (NaN where a stage reports none).

How a stage's wide ``summary`` is read (the summary-column conventions its
:class:`~robustbench_fm.methods.Method` declaration states):

* ``task`` is the ``finding`` column ("" when absent);
* ``group``: the values of the stage's ``group_columns`` (e.g. CANDOR's ``acq_group``)
  joined by ``" / "``; "" when the stage declares none;
* ``n``: the stage's ``count_column`` (default ``n``), NaN when the summary has no such column;
* metrics: every other numeric column, except the stage's ``param_columns`` (settings such as
  ``k``) and the interval columns; ``<metric>_ci_low`` / ``<metric>_ci_high`` become the
  metric's ``ci_low`` / ``ci_high``;
* ``seed``: the job config's ``stage.params.seed``, else its top-level ``seed``;
* ``config_hash``: :func:`config_hash` of the job's resolved config.
"""
from __future__ import annotations

import hashlib
import json

import numpy as np
import pandas as pd
from omegaconf import DictConfig, OmegaConf

from .. import methods as stages

LONG_COLUMNS = ["encoder", "dataset", "task", "stage", "group", "metric", "value", "ci_low", "ci_high", "n",
                "seed", "config_hash", "job"]
ID_COLUMNS = ("encoder", "dataset", "finding", "stage", "job")
#: config keys left out of :func:`config_hash`: where files are (not what was computed) and which
#: part of a sharded extraction a job ran; ``encoder``/``encoders`` too, since ``encoder`` is a
#: column of its own, so one hash names the settings shared by a whole panel; and the report's
#: ``notes`` (text for the reader).
HASH_EXCLUDED = ("paths", "dataset.root", "features_file", "manifest_file", "dry_run", "debug", "encoder",
                 "encoders", "extract.shard", "extract.num_shards", "extract.num_workers", "hydra", "report.notes")


def config_hash(cfg: DictConfig | dict) -> str:
    """First 12 hex digits of the SHA-256 of the resolved config as sorted-key JSON, without
    the :data:`HASH_EXCLUDED` keys: equal for runs with equal settings on other folders."""
    data = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else json.loads(
        json.dumps(cfg, default=str))
    for dotted in HASH_EXCLUDED:
        *parents, leaf = dotted.split(".")
        node = data
        for key in parents:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(leaf, None)
    text = json.dumps(data, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def config_seed(cfg: DictConfig | None) -> float:
    """The seed a job's stage ran with (``stage.params.seed``, else ``seed``); NaN if neither."""
    if cfg is None:
        return np.nan
    seed = OmegaConf.select(cfg, "stage.params.seed", default=None)
    seed = cfg.get("seed") if seed is None else seed
    return np.nan if seed is None else float(seed)


def stage_conventions(stage: str) -> tuple[list[str], list[str], str]:
    """``(group_columns, param_columns, count_column)`` of a registered stage's declaration (empty
    lists and ``"n"`` for a name no stage is registered under); the stage module is not imported."""
    method = stages.find(stage)
    if method is None:
        return [], [], "n"
    return list(method.group_columns), list(method.param_columns), method.count_column


def to_long(summary: pd.DataFrame, stage: str, cfg: DictConfig | None = None, job: str = "") -> pd.DataFrame:
    """One stage's wide summary rows -> long format (see the module docstring)."""
    if summary.empty:
        return pd.DataFrame(columns=LONG_COLUMNS)
    groups, params, count = stage_conventions(stage)
    numeric = [c for c in summary.columns if pd.api.types.is_numeric_dtype(summary[c])
               and not pd.api.types.is_bool_dtype(summary[c])]
    skip = set(ID_COLUMNS) | set(groups) | set(params) | {count}
    metrics = [c for c in numeric if c not in skip and not c.endswith(("_ci_low", "_ci_high"))]
    base = pd.DataFrame({
        "encoder": summary["encoder"].astype(str) if "encoder" in summary else "",
        "dataset": summary["dataset"].astype(str) if "dataset" in summary else "",
        "task": summary["finding"].astype(str) if "finding" in summary else "",
        "stage": stage,
        "group": summary[groups].astype(str).agg(" / ".join, axis=1) if groups else "",
        "n": pd.to_numeric(summary[count], errors="coerce").astype(float) if count in summary else np.nan,
    }, index=summary.index)
    parts = []
    for metric in metrics:
        part = base.assign(metric=metric, value=summary[metric].astype(float))
        part["ci_low"] = summary[f"{metric}_ci_low"].astype(float) if f"{metric}_ci_low" in summary else np.nan
        part["ci_high"] = summary[f"{metric}_ci_high"].astype(float) if f"{metric}_ci_high" in summary else np.nan
        parts.append(part)
    if not parts:
        return pd.DataFrame(columns=LONG_COLUMNS)
    out = pd.concat(parts, ignore_index=True)
    out["seed"] = config_seed(cfg)
    out["config_hash"] = config_hash(cfg) if cfg is not None else ""
    out["job"] = job
    return out[LONG_COLUMNS]
