"""experiment=heads through the app on the planted demo dataset (200 generated images)."""
import pandas as pd
import pytest

pytestmark = pytest.mark.slow


def test_heads_experiment_on_planted_images(tmp_path):
    from hydra import compose, initialize_config_dir

    from robustbench_fm.cli import app
    from robustbench_fm.cli.main import CONFIG_DIR

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"paths.root={tmp_path}", "experiment=heads",
                                           "encoders=[planted_sharp,planted_blur]", "stage.params.n_boot=200"])
    summary = app.run(cfg, tmp_path / "run").set_index("encoder")
    assert summary["finding"].eq("marker").all() and summary["head"].eq("linear").all()
    sharp, blur = summary.loc["planted_sharp"], summary.loc["planted_blur"]
    print(summary.T)
    assert sharp["auroc"] > 0.95 and blur["auroc_ci_low"] <= 0.5 <= blur["auroc_ci_high"]
    assert sharp["val_sensitivity"] >= 0.8 and sharp["n"] == blur["n"] > 0
    per = {e: pd.read_parquet(tmp_path / "run" / "results" / e / "planted" / "linear_head" / "marker" /
                              "per_sample.parquet") for e in summary.index}
    assert per["planted_sharp"][["sample_id", "split"]].equals(per["planted_blur"][["sample_id", "split"]])
