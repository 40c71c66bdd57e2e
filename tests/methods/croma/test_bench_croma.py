"""scripts/bench_croma.py in --quick mode: both sides run in their own process on the same
cohort, agree, and the JSON carries the figures the issue asks for."""
import importlib.util
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # command-line subprocesses: the full suite runs them

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "bench_croma.py"


def test_quick_bench_writes_agreeing_figures(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_croma", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "croma.json"
    bench.main(["--quick", "--cases", "separable", "--out", str(out)])
    result = json.loads(out.read_text())
    case = result["cases"]["separable"]
    assert case["n"] == 600 and case["n_slides"] == 20 and result["targets"]["ratio_max"] == 0.1
    for side in ("ours", "reference"):
        assert case[side]["wall_s"] > 0 and case[side]["peak_rss_mb"] >= case[side]["baseline_rss_mb"] > 0
    assert case["ratio_ours_over_reference"] == round(case["ours"]["wall_s"] / case["reference"]["wall_s"], 4)
    diffs = case["max_abs_diff"]
    assert diffs["k"] == diffs["ri"] == diffs["support"] == diffs["f0"] == 0
    assert diffs["bio_knn_bacc"] == diffs["conf_knn_bacc"] == 0
    assert max(diffs["mari"], diffs["tau"], diffs["croma"], diffs["q_alpha"], diffs["ltm"]) < 1e-6
    # the separable case really sends the reference's typed search beyond its first radius
    assert case["reference"]["values"]["croma_search_retries"] >= 1
