"""A single run's confounder scan after its stage (issue 55 item 4: ``report.scan``, pipeline/job.scan)."""
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from robustbench_fm.core.errors import InvalidSetting
from robustbench_fm.methods.confounders.stage import metadata_columns
from robustbench_fm.pipeline.job import scan
from robustbench_fm.pipeline.plan import _scan_option


@pytest.mark.parametrize("value, want", [("auto", True), (True, True), (False, False), ("false", False)])
def test_report_scan_values(value, want):
    assert _scan_option(OmegaConf.create({"report": {"scan": value}})) is want


def test_a_config_without_report_scan_scans_and_a_bad_value_names_the_key():
    assert _scan_option(OmegaConf.create({"report": {"tables": []}})) is True
    with pytest.raises(InvalidSetting, match=r"report.scan='sometimes' is not auto or false; set report.scan=auto"):
        _scan_option(OmegaConf.create({"report": {"scan": "sometimes"}}))


def _manifest(n=40):
    rng = np.random.default_rng(0)
    return pd.DataFrame({"sample_id": [f"s{i}" for i in range(n)], "path": [f"{i}.png" for i in range(n)],
                         "patient_id": [f"p{i}" for i in range(n)], "site": rng.choice(["a", "b"], n),
                         "view": "PA", "acq_group": "all", "marker": rng.integers(0, 2, n).astype(float)})


def test_metadata_columns_are_the_default_columns_with_two_values_besides_the_findings():
    m = _manifest()
    assert metadata_columns(m, ["marker"]) == ["site"]  # ids, the path, constant view / acq_group left out
    assert metadata_columns(m.drop(columns="site"), ["marker"]) == []
    assert metadata_columns(m, []) == ["site", "marker"]  # a column that is not this run's finding is metadata


def _job(**kw):
    base = dict(report=SimpleNamespace(scan=True), multirun=False, stage="candor", findings=["marker"], seed=0,
                extract=SimpleNamespace(device="cpu"), dataset="d", encoders=["e"])
    return SimpleNamespace(**{**base, **kw})


@pytest.mark.parametrize("kw", [dict(report=SimpleNamespace(scan=False)), dict(multirun=True),
                                dict(stage="confounders")])
def test_no_scan_off_in_a_sweep_or_after_the_scan_itself(tmp_path, kw):
    assert scan(_job(**kw), _manifest(), [("e", tmp_path / "none")], [], tmp_path) is None
    assert not (tmp_path / "results").exists()


def test_a_manifest_too_small_for_k_is_left_out_with_one_line(tmp_path, caplog):
    with caplog.at_level("WARNING", logger="robustbench_fm"):
        assert scan(_job(), _manifest(8), [("e", tmp_path / "none")], [], tmp_path) is None
    assert "confounder scan of site left out:" in caplog.text and "report.scan=false turns it off" in caplog.text


def test_the_scan_reads_the_features_again_and_saves_a_stage(tmp_path):
    m = _manifest()
    rng = np.random.default_rng(1)
    feats = rng.standard_normal((len(m), 8)).astype(np.float32)
    feats[:, 0] += np.where(m["site"] == "a", 4.0, -4.0)
    path = tmp_path / "features.parquet"
    pd.DataFrame({"sample_id": m["sample_id"], "embedding": list(feats)}).to_parquet(path)
    out = scan(_job(), m.iloc[::-1].reset_index(drop=True), [("e", path)], ["s0"], tmp_path)
    assert sorted(out["column"]) == ["marker", "site"] and out["n"].eq(39).all()  # s0 skipped
    site = out.set_index("column").loc["site"]
    assert site["score"] > 0.9  # the features are the site plus noise
    saved = pd.read_parquet(tmp_path / "results/e/d/confounders/site/summary.parquet")
    assert saved["score"].iloc[0] == site["score"]
