"""The command line's face of one job: the pipeline itself is :mod:`robustbench_fm.pipeline.job`
(plan, manifest, extraction, stage, results, report); here :func:`run` adds what only a Hydra job
knows, whether it is one job of a multirun and under which experiment, and the names the sweeps
and the tests use are re-exported."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from ..pipeline.job import (  # noqa: F401  (re-exported: the sweeps and the tests use them from here)
    MAX_REASONS,
    USER_ERRORS,
    EncoderSettings,
    ExtractOptions,
    Paths,
    Plan,
    ReportOptions,
    _check_scorable,
    _extract_panel,
    _record_entries,
    _record_part,
    _refuse_all_blank,
    _stage_results,
    _sweep_first,
    _tables_after_run,
    _write_report,
    console_table,
    embedder,
    encoder_options,
    feature_set_name,
    features_names,
    fixed_sample_size,
    generic_entry,
    job_context,
    job_manifest,
    label_columns,
    load_manifest,
    panel,
    plan,
    read_manifest_file,
    recorded,
    resolution,
    resolved_prepared_dir,
    run_planned,
    run_stage_on_entries,
    write_status,
)


def hydra_mode() -> tuple[bool, str | None]:
    """``(multirun, experiment)`` of the Hydra job running now: (False, None) outside one."""
    if not HydraConfig.initialized():
        return False, None
    hc = HydraConfig.get()
    return hc.mode == RunMode.MULTIRUN, hc.runtime.choices.get("experiment")


def run(cfg: DictConfig, out_dir: Path, cli_overrides: list[str] | None = None) -> pd.DataFrame:
    """Run the job under ``out_dir`` (as :func:`robustbench_fm.pipeline.job.run`: locked, with
    ``status.json``) and return the combined summary."""
    with recorded(out_dir):
        job = plan(cfg, cli_overrides)
        return _run(job, out_dir)


def _run(job: Plan, out_dir: Path) -> pd.DataFrame:
    """The planned job, told what only the Hydra job knows (:func:`hydra_mode`: one job of a
    multirun, the experiment)."""
    multirun, experiment = hydra_mode()
    job = dataclasses.replace(job, multirun=job.multirun or multirun, experiment=job.experiment or experiment)
    return run_planned(job, out_dir)
