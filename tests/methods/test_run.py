"""methods/run.py: a stage overwrites only a matrix handed over to it, and only when its Method
declares ``overwrites_features`` (issue 31 item 7: a CANDOR job holds one copy of its features)."""
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from robustbench_fm.core.handover import hand_over
from robustbench_fm.methods import method
from robustbench_fm.methods.run import evaluate, score_and_save


def _data(n=60, d=8, seed=0):
    rng = np.random.default_rng(seed)
    y = np.r_[np.ones(n // 2), np.zeros(n - n // 2)]
    x = (rng.normal(size=(n, d)) + y[:, None]).astype(np.float32)
    manifest = pd.DataFrame({"sample_id": [f"s{i}" for i in range(n)], "patient_id": [f"p{i}" for i in range(n)],
                             "acq_group": np.where(np.arange(n) % 2, "a", "b"), "finding": y, "other": 1 - y})
    return x, manifest


def _unit(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_candor_scales_a_handed_over_matrix_in_place_with_the_same_results():
    x, manifest = _data()
    assert method("candor").overwrites_features and not method("linear_head").overwrites_features
    before = x.copy()
    kept = evaluate("candor", x, manifest, finding=["finding"], n_boot=20)
    np.testing.assert_array_equal(x, before)  # an API caller's matrix is never touched
    owned = x.copy()
    given = evaluate("candor", hand_over(owned), manifest, finding=["finding"], n_boot=20)
    pd.testing.assert_frame_equal(given.summary, kept.summary)
    np.testing.assert_array_equal(owned, _unit(before))  # scaled in place: the job's one copy


def test_score_and_save_hands_over_only_to_a_stage_that_declares_it(tmp_path):
    x, manifest = _data()
    before = x.copy()
    score_and_save("linear_head", x, manifest, ["finding", "other"], {}, tmp_path, "enc", "ds", handed_over=True)
    np.testing.assert_array_equal(x, before)
    score_and_save("candor", x, manifest, ["finding", "other"], {"n_boot": 20}, tmp_path, "enc", "ds")
    np.testing.assert_array_equal(x, before)  # not handed over
    score_and_save("candor", x, manifest, ["finding", "other"], {"n_boot": 20}, tmp_path, "enc", "ds",
                   handed_over=True)
    np.testing.assert_array_equal(x, _unit(before))


def test_features_read_from_a_path_are_the_stage_s_own(tmp_path):
    """A parquet of the user's features is read into a matrix only the stage holds: the result
    equals the in-memory run's, and the file is unchanged."""
    x, manifest = _data()
    path = tmp_path / "feats.parquet"
    pq.write_table(pa.table({"sample_id": manifest["sample_id"], "embedding": list(x)}), path)
    raw = path.read_bytes()
    from_path = evaluate("candor", path, manifest, finding=["finding"], n_boot=20)
    in_memory = evaluate("candor", x, manifest, finding=["finding"], n_boot=20)
    pd.testing.assert_frame_equal(from_path.summary, in_memory.summary)
    assert path.read_bytes() == raw
