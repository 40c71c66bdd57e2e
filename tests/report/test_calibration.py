"""Calibration of the paired comparisons through the public path (issue 58, "Tests that could fail"):
equally good encoders (tests/fixtures/null_cohorts.py) → ``evaluate(stage)`` → ``compare_tables``,
≥ 300 null cohorts of each design, measured by scripts/calibrate_compare.py (one home of the loop and
the tallies; its full run with the metrics no longer compared is benchmarks/cpu2/calibration.json and
docs/comparisons.md "Calibration").

Asserted for every compared metric (CANDOR's D and D_all on three designs unlike
tests/core/test_stats_paired.py's cohort, CRoMa's median on its own), on the pooled rows and on the
per-group rows alike: p < 0.05 in at most 7% of the null pairs, the unadjusted 95% interval covering
0 in at least 93% of them, and a family-wise error (any ``better`` in a family of one metric and row)
of at most 7% for the adjusted decisions; the simultaneous intervals cover 0 together in at least 93%
of the families. The cohorts are fixed (seeds 0..N-1), so the test is deterministic."""
import importlib.util
from pathlib import Path

import pandas as pd
import pytest

COHORTS = 300
ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("calibrate_compare", ROOT / "scripts" / "calibrate_compare.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def calibration():
    import torch

    calib = _script()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the stages' neighbour searches are tiny: threads only add overhead
    try:
        records = [calib.run_design(d, COHORTS, old=False)[0] for d in (*calib.nc.DESIGNS, calib.nc.CROMA_DESIGN)]
    finally:
        torch.set_num_threads(threads)
    return pd.DataFrame(calib.summarise(pd.concat(records, ignore_index=True)))


@pytest.mark.slow
def test_every_compared_metric_is_calibrated_under_the_null(calibration):
    expected = {(d, m, r) for d in ("A", "B", "C") for m in ("d", "d_all") for r in ("pooled", "group")} | \
        {("croma", "croma", "all")}
    assert set(zip(calibration["design"], calibration["metric"], calibration["row_type"])) == expected
    assert (calibration["n_cohorts"] == COHORTS).all()
    assert calibration["compared"].all()
    bad = []
    for _, s in calibration.iterrows():
        where = f"{s['design']} {s['metric']} {s['row_type']}"
        if s["p_below_005"]["rate"] > 0.07:
            bad.append(f"{where}: p < 0.05 in {s['p_below_005']}")
        if s["coverage"]["rate"] < 0.93:
            bad.append(f"{where}: the 95% interval covers 0 in {s['coverage']}")
        if s["fwer"]["rate"] > 0.07:
            bad.append(f"{where}: family-wise error {s['fwer']}")
        if s["family_coverage_sim"]["rate"] < 0.93:
            bad.append(f"{where}: the simultaneous intervals cover 0 together in {s['family_coverage_sim']}")
    assert not bad, "\n".join(bad)
