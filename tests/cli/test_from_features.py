"""Bring your own features for CRoMa (issue 29, item 3): ``experiment=from_features`` with a string
``bio_label``, the paper table built on the user's features, job folders and results named after
the user's feature set, and a sweep that fails in one line when a requested table cannot be built."""
import json

import cli_process
import numpy as np
import pandas as pd
import pytest
from croma_cohorts import cohort

from robustbench_fm.core.errors import UserError
from robustbench_fm.data import manifest as mf


def _features(tmp_path, name="uni_feats"):
    x, manifest = cohort(slides_per_cell=3, tiles_per_slide=8, seed=3)
    manifest = manifest.assign(path=[f"tiles/{s}.png" for s in manifest["sample_id"]],
                               patient_id=manifest["slide_id"], acq_group=manifest["site"])
    manifest.to_csv(tmp_path / "camelyon.csv", index=False)
    pd.DataFrame({"sample_id": manifest["sample_id"], "embedding": list(x.astype(np.float32))}).to_parquet(
        tmp_path / f"{name}.parquet")
    return tmp_path / f"{name}.parquet", tmp_path / "camelyon.csv"


def _cli(tmp_path, *args):
    flags = [a for a in args if a == "-m"]
    return cli_process.run(["-m", "robustbench_fm", *flags, f"paths.output_root={tmp_path / 'out'}",
                           "experiment=from_features", *[a for a in args if a != "-m"]],
                           cwd=tmp_path, timeout=300)


def test_a_categorical_label_is_read_as_strings_and_a_finding_stays_binary(tmp_path):
    pd.DataFrame({"sample_id": ["a", "b", "c"], "bio_label": ["tumour", "normal", None],
                  "tissue": ["x", "y", "x"], "marker": [1, 0, 1]}).to_csv(tmp_path / "m.csv", index=False)
    read = mf.read(tmp_path / "m.csv", findings=["marker"], labels=["bio_label", "tissue"])
    assert read["bio_label"].tolist()[:2] == ["tumour", "normal"] and pd.isna(read["bio_label"].iloc[2])
    assert read["tissue"].tolist() == ["x", "y", "x"] and read["marker"].tolist() == [1.0, 0.0, 1.0]
    with pytest.raises(UserError, match="column 'bio_label', row 0: non-numeric value 'tumour'"):
        mf.read(tmp_path / "m.csv", findings=["bio_label"])  # as a 0/1 finding it is still refused
    with pytest.raises(UserError, match="column 'grade', header: label column missing"):
        mf.read(tmp_path / "m.csv", labels=["grade"])


@pytest.mark.slow  # two command-line subprocesses (~40 s on 2 shared cores)
def test_croma_on_own_features_builds_table3_in_folders_named_after_them(tmp_path):
    """The old code refused the string label ("non-numeric value"), recorded no entries.json (the
    table: "no croma or shortcut job with recorded cache entries") and named the job folder after
    the planted encoder (0_planted_blur-planted-croma)."""
    feats, manifest = _features(tmp_path)
    sweep = tmp_path / "sweep"
    proc = _cli(tmp_path, "-m", f"features_file={feats}", f"manifest_file={manifest}", "stage=croma",
                "stage.findings=[bio_label]", "features_dataset=pathorob_camelyon", "device=cpu",
                "report.tables=[croma_table3]", f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (job,) = [p for p in sweep.iterdir() if (p / "status.json").exists()]
    assert job.name == "0_uni_feats-pathorob_camelyon-croma"
    record = json.loads((job / "entries.json").read_text())
    assert record["dataset"] == "pathorob_camelyon" and record["entries"][0]["encoder"] == "uni_feats"
    assert record["entries"][0]["entry"] == str(feats)
    summary = pd.read_parquet(job / "summary.parquet")
    assert set(summary["encoder"]) == {"uni_feats"} and set(summary["dataset"]) == {"pathorob_camelyon"}
    table = pd.read_csv(sweep / "tables" / "croma_table3.csv")
    assert table.shape[0] == 1  # the user's one feature set, re-scored at the panel's k
    # the table's RI is the job's own RI at that k (one encoder: the lower median of its own k*)
    row = summary.iloc[0]
    ri_col = next(c for c in table.columns if c.startswith("RI"))
    assert float(table[ri_col].iloc[0]) == pytest.approx(float(row["ri"]), abs=5e-4)


@pytest.mark.slow
def test_a_requested_table_that_cannot_be_built_fails_the_sweep_in_one_line(tmp_path):
    """Before: a Hydra warning, exit 0 and no tables/."""
    feats, manifest = _features(tmp_path)
    proc = _cli(tmp_path, "-m", f"features_file={feats}", f"manifest_file={manifest}", "stage=croma",
                "stage.findings=[bio_label]", "device=cpu", "report.tables=[croma_table14]",
                f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert proc.returncode == 1, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: collect: table croma_table14: "), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "Callback" not in proc.stderr
    assert "table croma_table14: " in (tmp_path / "sweep" / "missing.txt").read_text()
