"""Bad features are refused with one line naming the row and the fix (issue: reliability 3)."""
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import robustbench_fm


def manifest(n=40):
    return pd.DataFrame({"sample_id": [f"s{i}" for i in range(n)], "patient_id": [f"p{i}" for i in range(n)],
                         "acq_group": "g", "finding": np.r_[np.ones(n // 2), np.zeros(n - n // 2)]})


def features(n=40, d=6, seed=0):
    return np.random.default_rng(seed).normal(size=(n, d)).astype(np.float32)


def one_line_error(exc_type, fn, match):
    with pytest.raises(exc_type, match=match) as err:
        fn()
    assert "\n" not in str(err.value)
    return str(err.value)


@pytest.mark.parametrize("value, what", [(np.nan, "NaN/Inf"), (np.inf, "NaN/Inf"), (-np.inf, "NaN/Inf")])
def test_non_finite_rows_are_refused(value, what):
    x = features()
    x[7, 2] = value
    one_line_error(ValueError, lambda: robustbench_fm.evaluate("candor", x, manifest(), finding="finding"),
                   f"row 7 holds {what}")


def test_zero_vectors_are_refused_before_normalisation():
    x = features()
    x[3] = 0
    one_line_error(ValueError, lambda: robustbench_fm.evaluate("candor", x, manifest(), finding="finding"),
                   "row 3 is a zero vector")


def test_misaligned_matrix_is_refused():
    one_line_error(ValueError, lambda: robustbench_fm.evaluate("candor", features(39), manifest(), finding="finding"),
                   r"shape \(39, 6\) does not match the manifest's 40 rows")


def write_parquet(path, ids, x):
    pq.write_table(pa.table({"sample_id": ids, "embedding": [list(map(float, r)) for r in x]}), path)


def test_duplicated_sample_ids_in_a_feature_file_are_refused(tmp_path):
    ids = [f"s{i}" for i in range(40)]
    ids[5] = "s4"
    write_parquet(tmp_path / "f.parquet", ids, features())
    one_line_error(Exception, lambda: robustbench_fm.evaluate("candor", tmp_path / "f.parquet", manifest(),
                                                              finding="finding"), "s4")


def test_feature_file_missing_rows_is_refused_and_order_is_aligned(tmp_path):
    x = features()
    ids = [f"s{i}" for i in range(40)]
    perm = np.random.default_rng(1).permutation(40)
    write_parquet(tmp_path / "shuffled.parquet", [ids[i] for i in perm], x[perm])
    aligned = robustbench_fm.evaluate("candor", tmp_path / "shuffled.parquet", manifest(), finding="finding",
                                      n_boot=20).summary
    direct = robustbench_fm.evaluate("candor", x, manifest(), finding="finding", n_boot=20).summary
    pd.testing.assert_frame_equal(aligned, direct)
    write_parquet(tmp_path / "short.parquet", ids[:-1], x[:-1])
    one_line_error(Exception, lambda: robustbench_fm.evaluate("candor", tmp_path / "short.parquet", manifest(),
                                                              finding="finding"), "s39")


def test_duplicated_manifest_rows_are_refused():
    m = manifest()
    m.loc[9, "sample_id"] = "s8"
    one_line_error(ValueError, lambda: robustbench_fm.evaluate("candor", features(), m, finding="finding"),
                   "column 'sample_id', row 9: duplicate key")


@pytest.mark.parametrize("row, value, what", [(3, np.nan, "hold NaN/Inf"), (5, 0.0, "are a zero vector")])
def test_nan_or_zero_rows_in_a_users_feature_file_are_a_user_error_naming_the_file_and_sample(tmp_path, row, value,
                                                                                                 what):
    """Issue 41 item 7: printed as "this is a bug in robustbench_fm" (a plain ValueError) before."""
    from robustbench_fm.core.errors import UserError

    x = features()
    x[row] = value
    write_parquet(tmp_path / "f.parquet", [f"s{i}" for i in range(40)], x)
    text = one_line_error(UserError, lambda: robustbench_fm.evaluate("candor", tmp_path / "f.parquet", manifest(),
                                                                     finding="finding"), what)
    assert text.startswith(f"{tmp_path / 'f.parquet'}: the features of sample_id 's{row}' {what}")
    assert "(1 of 40 manifest rows)" in text


def test_nan_rows_of_an_in_memory_matrix_are_a_user_error():
    from robustbench_fm.core.errors import UserError

    x = features()
    x[7, 2] = np.nan
    one_line_error(UserError, lambda: robustbench_fm.evaluate("candor", x, manifest(), finding="finding"),
                   "row 7 holds NaN/Inf")
