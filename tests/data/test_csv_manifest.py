"""``dataset=csv``: a CSV of labels and an image folder become the canonical
manifest; a CSV without a needed column is refused in one line naming the file, the column and the fix."""
import pandas as pd
import pytest

from robustbench_fm import data
from robustbench_fm.data import csv_manifest
from robustbench_fm.data.manifest import ManifestError


def _csv(tmp_path, frame: pd.DataFrame, name="labels.csv"):
    path = tmp_path / name
    frame.to_csv(path, index=False)
    return path


def test_defaults_and_finding_columns(tmp_path):
    path = _csv(tmp_path, pd.DataFrame({"path": ["a.png", "b.png", "c.png"], "marker": [1, 0, None],
                                        "age": [30, 41, 52], "site": ["x", "y", "x"], "other": [0, 2, 1]}))
    assert csv_manifest.finding_columns(path) == ["marker"]  # binary only: age and other are not findings
    m = data.build_manifest("csv", tmp_path, verify_images=False, manifest=path, finding_columns=["marker"])
    assert m["sample_id"].tolist() == m["path"].tolist() == ["a.png", "b.png", "c.png"]
    assert m["patient_id"].tolist() == m["sample_id"].tolist()  # each image its own bootstrap cluster
    assert set(m["acq_group"]) == {"all"}
    assert m["marker"].tolist()[:2] == [1.0, 0.0] and pd.isna(m["marker"].iloc[2])


def test_own_ids_and_groups_are_kept(tmp_path):
    path = _csv(tmp_path, pd.DataFrame({"sample_id": ["s1", "s2"], "path": ["a.png", "b.png"],
                                        "patient_id": ["p", "p"], "acq_group": ["ct", "mr"], "f": [1, 0]}))
    m = data.build_manifest("csv", tmp_path, verify_images=False, manifest=path, finding_columns=["f"])
    assert m[["sample_id", "patient_id", "acq_group"]].values.tolist() == [["s1", "p", "ct"], ["s2", "p", "mr"]]


@pytest.mark.parametrize("frame, findings, expected", [
    (pd.DataFrame({"file": ["a.png"], "marker": [1]}), ["marker"],
     "labels.csv: column 'path' missing; add a 'path' column with each image's file relative to dataset.root"),
    (pd.DataFrame({"path": ["a.png"], "marker": [1]}), ["effusion"],
     "labels.csv: column 'effusion' missing for finding 'effusion'; add it (1 positive, 0 negative, empty "
     "unlabelled) or set dataset.findings=[...] to columns of the CSV (marker)"),
    (pd.DataFrame({"path": ["a.png", "b.png"], "marker": [1, 2]}), ["marker"],
     "column 'marker', row 1: value 2.0 out of range; use 1 positive, 0 negative, NaN unlabelled"),
])
def test_bad_csv_is_refused_in_one_line(tmp_path, frame, findings, expected):
    path = _csv(tmp_path, frame)
    with pytest.raises(ManifestError) as err:
        data.build_manifest("csv", tmp_path, verify_images=False, manifest=path, finding_columns=findings)
    text = str(err.value)
    assert expected in text and str(path) in text and "\n" not in text


def test_missing_manifest_option_and_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"dataset=csv needs dataset.manifest=<labels.csv>"):
        data.build_manifest("csv", tmp_path, verify_images=False)
    with pytest.raises(FileNotFoundError, match=r"nope.csv: file not found; set dataset.manifest"):
        data.build_manifest("csv", tmp_path, verify_images=False, manifest=tmp_path / "nope.csv")
    assert csv_manifest.finding_columns(None) == [] == csv_manifest.finding_columns(tmp_path / "nope.csv")


def test_a_missing_manifest_is_a_user_error_naming_the_setting(tmp_path):
    from robustbench_fm.core.errors import UserError
    from robustbench_fm.data.files import DatasetFileMissing

    with pytest.raises(DatasetFileMissing) as err:
        data.build_manifest("csv", tmp_path, verify_images=False, manifest=tmp_path / "nope.csv")
    assert isinstance(err.value, (UserError, FileNotFoundError))
    assert str(err.value) == f"{tmp_path / 'nope.csv'}: file not found; set dataset.manifest=<labels.csv>"


def test_an_empty_csv_says_it_has_0_rows(tmp_path):
    """Issue 41 item 5: with dataset.findings=[marker] it ended in "KeyError: 2 ... this is a bug"."""
    path = _csv(tmp_path, pd.DataFrame({"path": [], "marker": []}))
    with pytest.raises(ManifestError) as err:
        data.build_manifest("csv", tmp_path, manifest=path, finding_columns=["marker"])
    assert str(err.value) == (f"{path}: the CSV has 0 rows (only its header); add one row per image (path and one "
                              "0/1 column per finding)")
    assert csv_manifest.no_findings_reason(path) == (f"{path}: the CSV has 0 rows (only its header); add one row per "
                                                     "image")


@pytest.mark.parametrize("values, shown", [([0, 1, 2, 1], "value '2'"), (["yes", "no", "no", "yes"], "value 'yes'")])
def test_a_column_the_finding_detection_skips_is_named_with_the_value_that_kept_it_out(tmp_path, values, shown):
    """Issue 41 item 6: the error talked about dataset=pool and pneumothorax."""
    path = _csv(tmp_path, pd.DataFrame({"path": [f"{i}.png" for i in range(4)], "grade": values}))
    assert csv_manifest.finding_columns(path) == []
    assert csv_manifest.no_findings_reason(path) == (
        f"{path}: no finding column: column 'grade' was skipped ({shown}; a finding column holds 1, 0 or empty); "
        "recode one as 0/1 (1 positive, 0 negative), or name the finding columns with dataset.findings=[...]")


@pytest.mark.parametrize("inside", [True, False])
def test_an_absolute_path_is_refused_with_its_relative_form(tmp_path, inside):
    """Issue 41 item 10: an absolute path inside the root was refused as leaving the root "without '..'"."""
    root = tmp_path / "imgs"
    root.mkdir()
    given = (root / "a" / "x.png") if inside else (tmp_path / "elsewhere.png")
    path = _csv(tmp_path, pd.DataFrame({"path": ["b.png", str(given)], "m": [0, 1]}))
    with pytest.raises(ManifestError) as err:
        data.build_manifest("csv", root, verify_images=False, manifest=path, finding_columns=["m"])
    fix = (f"write it relative to dataset.root '{root}': 'a/x.png'" if inside else
           f"it is outside dataset.root '{root}': set dataset.root to a folder holding every image")
    assert str(err.value).startswith(f"{path}: column 'path', row 1: '{given}' is an absolute path; {fix}")
