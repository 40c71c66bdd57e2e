"""``python -m robustbench_fm experiment=real_demo`` end to end, offline: CANDOR on 600 real MNIST
digits with EfficientNet-Lite0's ImageNet weights beside the same network with random weights. The
README shows this command (tests/e2e/test_readme.py RUN_BY: it runs here, once) and the pooled rows
it prints, asserted below."""
from pathlib import Path

import cli_process
import pandas as pd
import pytest

pytestmark = pytest.mark.slow  # ~600 forward passes of EfficientNet-Lite0 on the CPU (1.5-5 min on 2 cores)
ROOT = Path(__file__).resolve().parents[2]


def test_real_weights_are_more_concordant_than_random_ones(tmp_path):
    """Measured (seed 42, 60 per digit): pooled D 0.032 [0.018, 0.045] for the real weights against 0.093
    [0.071, 0.117] for random ones; every digit's D at most 0.117 with the real weights (0.217 random)."""
    proc = cli_process.run(["-m", "robustbench_fm", "experiment=real_demo",
                           f"paths.output_root={tmp_path}"], cwd=ROOT, timeout=1200,
                           env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = sorted((tmp_path / "runs").glob("*/*"))[-1]
    summary = pd.read_parquet(run / "summary.parquet")
    pooled = summary[summary["target"] == "__mean__"].set_index("encoder")
    real, rand = pooled.loc["efficientnet_lite0_in1k"], pooled.loc["random_efficientnet_lite0"]
    assert real["n_queries"] == rand["n_queries"] == 600
    assert real["d"] < rand["d"] and real["d_ci_high"] < 0.1
    per_class = summary[(summary["encoder"] == "efficientnet_lite0_in1k") & (summary["target"] != "__mean__")]
    assert per_class["target"].nunique() == 10 and per_class["d"].max() <= 0.2
    # the README's table of what it prints: every row it shows is a row of the console table
    readme = (ROOT / "README.md").read_text().split("## A real pretrained encoder", 1)[1]
    shown = readme.split("```text\n", 1)[1].split("```", 1)[0].splitlines()
    printed = proc.stdout.splitlines()
    shown = [line for line in shown if line]
    assert len(shown) == 4 and all(line in printed for line in shown), (shown, proc.stdout[-3000:])
    # issue 46: the paired comparison says the real weights are better on the pooled D, its interval excluding 0
    pairs = pd.read_csv(run / "comparisons.csv", keep_default_na=False, na_values=[""])
    d = pairs[(pairs["metric"] == "d") & (pairs["row"] == "__mean__ / __pooled__")].iloc[0]
    assert {d["encoder_a"], d["encoder_b"]} == {"efficientnet_lite0_in1k", "random_efficientnet_lite0"}
    sign = 1 if d["encoder_a"] == "efficientnet_lite0_in1k" else -1  # real minus random
    assert sign * d["difference"] == pytest.approx(real["d"] - rand["d"], abs=1e-12)
    assert sign * d["ci_high"] < 0 if sign == 1 else sign * d["ci_low"] < 0
    assert d["better"] == "efficientnet_lite0_in1k" and d["p_adj"] < 0.05
    assert (d["sim_high"] < 0) if sign == 1 else (d["sim_low"] > 0)  # the simultaneous interval excludes 0 too
    assert shown[-1].startswith("- bio_label (mean over its classes), CANDOR d (lower is better): "
                                "efficientnet_lite0_in1k is best alone")
