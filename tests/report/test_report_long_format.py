"""The long-format collector: stage conventions (group, count, params,
intervals), seed and config hash from the job config, and collect() writing results_long.* with
numbers as numbers next to combined.* and missing.txt."""
from __future__ import annotations

import pandas as pd
import pytest
from omegaconf import OmegaConf
from report_fixtures import candor_summary, job_config

from robustbench_fm.report.long_format import LONG_COLUMNS, config_hash, to_long


def test_candor_summary_to_long_and_back():
    summary = candor_summary("uni", "marker", 40, d=0.3, d_all=0.8)
    cfg = OmegaConf.create(job_config("candor", "planted", seed=7))
    long = to_long(summary, "candor", cfg, job="0_uni")
    assert list(long.columns) == LONG_COLUMNS
    metrics = ["n_pos", "n_neg", "d", "d_sd", "d_all", "d_all_sd", "margin_auroc"]  # not k, bank_size, n_queries
    assert sorted(long["metric"].unique()) == sorted(metrics) and len(long) == 2 * len(metrics)
    assert set(long["group"]) == {"AP / marker", "__pooled__ / marker"}  # its declared group_columns: acq_group, target
    assert (long["n"] == 40).all() and (long["seed"] == 7).all() and (long["task"] == "marker").all()
    d = long[(long["metric"] == "d")].iloc[0]
    assert (d["value"], d["ci_low"], d["ci_high"]) == (0.3, 0.3 - 0.04, 0.3 + 0.04)
    assert long.loc[long["metric"] == "d_sd", "ci_low"].isna().all()
    back = long.pivot_table(index="group", columns="metric", values="value")
    for metric in metrics:  # exact round trip of every number
        assert back[metric].tolist() == summary.set_index(summary["acq_group"] + " / marker")[metric].loc[
            back.index].tolist()


def test_config_hash_ignores_paths_and_sees_settings():
    base = config_hash(OmegaConf.create(job_config("candor", "planted")))
    assert base == config_hash(OmegaConf.create(job_config("candor", "planted", root="/elsewhere")))
    assert base != config_hash(OmegaConf.create(job_config("candor", "planted", k=7)))
    assert base != config_hash(OmegaConf.create(job_config("candor", "planted", seed=1)))
    assert len(base) == 12 and int(base, 16) >= 0


@pytest.mark.slow  # end to end: collect() on a synthetic sweep
def test_collect_writes_long_format_beside_combined(collected):
    sweep, combined, out = collected
    long = pd.read_parquet(sweep / "results_long.parquet")
    assert len(combined) == 12 and len(long) == 12 * 7
    assert list(long.columns) == LONG_COLUMNS
    assert {c: str(long[c].dtype) for c in ("value", "ci_low", "ci_high", "n", "seed")} == dict.fromkeys(
        ("value", "ci_low", "ci_high", "n", "seed"), "float64")
    csv = pd.read_csv(sweep / "results_long.csv")
    assert csv["value"].dtype == float and csv["value"].tolist() == long["value"].tolist()
    assert long["config_hash"].nunique() == 1 and set(long["stage"]) == {"candor"}
    assert set(long["job"]) == {"0_planted_blur-planted-candor", "1_planted_sharp-planted-candor"}
    assert (sweep / "missing.txt").read_text() == "2_random_vit_s-planted-candor: failed (boom)\n"
    assert "| stage | encoder | dataset | task | group |" in out and "report.html" in out


def test_croma_fields_of_issue_42_are_metrics_and_m_sweep_a_setting():
    """The fields croma reports beyond the headline (issue 42) reach the long format as metrics;
    m_sweep (the end of the m sweep) is a setting, and the reason text is not a metric."""
    import numpy as np
    from croma_cohorts import cohort

    from robustbench_fm import evaluate

    x, manifest = cohort(slides_per_cell=2, tiles_per_slide=10)
    summary = evaluate("croma", x, manifest).summary.assign(encoder="e", dataset="d")
    long = to_long(summary, "croma")
    metrics = set(long["metric"])
    assert {"selected_k_confounder", "ri_median", "ri_q_alpha", "ri_ltm", "mari_median", "mari_q_alpha", "mari_ltm",
            "ss_undefined_frac", "oo_undefined_frac", "mixed_undefined_frac", "croma_auc", "croma_min",
            "croma_delta"} <= metrics
    assert not {"m_sweep", "k", "tau", "reason"} & metrics and set(long["group"]) == {""}
    row = long.set_index("metric")["value"]
    assert row["croma_auc"] == summary["croma_auc"][0] and np.isfinite(row["croma_delta"])
