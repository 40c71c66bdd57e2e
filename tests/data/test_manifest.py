"""Manifest validation: one-line errors that name the file, column, row and fix; content hash."""
import numpy as np
import pandas as pd
import pytest

from robustbench_fm.data import manifest as mf


def good():
    return pd.DataFrame({"sample_id": ["a", "b", "c"], "path": ["x/a.png", "x/b.png", "x/c.png"],
                         "patient_id": ["p1", "p1", "p2"], "acq_group": ["s|PA"] * 3,
                         "split": ["train", "val", "test"], "pneumothorax": [1, 0, np.nan]})


def test_valid_manifest_round_trips_with_canonical_dtypes(tmp_path):
    df = mf.validate(good(), findings=["pneumothorax"])
    assert df["pneumothorax"].dtype == float and np.isnan(df["pneumothorax"][2])
    df.to_csv(tmp_path / "m.csv", index=False)
    back = mf.read(tmp_path / "m.csv", findings=["pneumothorax"])
    pd.testing.assert_frame_equal(back, df)
    assert mf.content_hash(back) == mf.content_hash(df)


@pytest.mark.parametrize("mutate, column, row", [
    (lambda d: d.drop(columns="sample_id"), "sample_id", "header"),
    (lambda d: d.assign(sample_id=["a", "b", "a"]), "sample_id", "row 2"),
    (lambda d: d.assign(pneumothorax=[1, 2, 0]), "pneumothorax", "row 1"),
    (lambda d: d.assign(pneumothorax=[1, "yes", 0]), "pneumothorax", "row 1"),
    (lambda d: d.assign(split=["train", "dev", "test"]), "split", "row 1"),
    (lambda d: d.assign(path=["x/a.png", "../b.png", "x/c.png"]), "path", "row 1"),
    (lambda d: d.assign(acq_group=["g", None, "g"]), "acq_group", "row 1"),
    (lambda d: d.assign(box_x0=[0.1, 1.5, 0.2]), "box_x0", "row 1"),
])
def test_errors_are_one_line_and_name_file_column_row(tmp_path, mutate, column, row):
    path = tmp_path / "bad.csv"
    mutate(good()).to_csv(path, index=False)
    with pytest.raises(mf.ManifestError) as err:
        mf.read(path, findings=["pneumothorax"])
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith(str(path)) and f"column '{column}'" in msg and row in msg and ";" in msg


def test_missing_finding_column_is_named():
    with pytest.raises(mf.ManifestError, match="column 'edema'.*finding column missing"):
        mf.validate(good(), findings=["edema"])


def test_locator_hash_ignores_labels_but_not_paths():
    a = good()
    relabelled = a.assign(pneumothorax=[0, 0, 1])
    moved = a.assign(path=["y/a.png", "x/b.png", "x/c.png"])
    h = mf.content_hash(a, mf.LOCATOR_COLUMNS)
    assert mf.content_hash(relabelled, mf.LOCATOR_COLUMNS) == h
    assert mf.content_hash(moved, mf.LOCATOR_COLUMNS) != h
    assert mf.content_hash(a.iloc[::-1], mf.LOCATOR_COLUMNS) != h
    assert mf.content_hash(relabelled) != mf.content_hash(a)
