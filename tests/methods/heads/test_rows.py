"""The stable-hash row draw and the split carve-out (robustbench_fm/heads/rows.py)."""
import hashlib

import numpy as np
import pandas as pd
from heads_data import synthetic

from robustbench_fm.methods.heads.rows import draw_rows, head_splits, stable_uniform


def test_stable_uniform_is_sha256_of_seed_and_id():
    digest = hashlib.sha256(b"42\x1fs00007").digest()
    assert stable_uniform(["s00007"], 42)[0] == int.from_bytes(digest[:8], "big") / 2 ** 64


def test_draw_is_the_smallest_hashes_and_ignores_row_order_and_encoder():
    _, m = synthetic(n=400)
    rows = draw_rows(m, max_train=50, max_test=20, seed=42)
    train_ids = set(m["sample_id"].to_numpy()[rows.train])
    pool = m[m["split"] == "train"]["sample_id"].to_numpy()
    expected = set(pool[np.argsort(stable_uniform(pool, 42))[:50]])
    assert train_ids == expected and len(rows.test) == 20 and len(rows.val) == (m["split"] == "val").sum()
    shuffled = m.sample(frac=1.0, random_state=3).reset_index(drop=True)
    again = draw_rows(shuffled, max_train=50, max_test=20, seed=42)
    assert set(shuffled["sample_id"].to_numpy()[again.train]) == train_ids
    assert set(shuffled["sample_id"].to_numpy()[again.test]) == set(m["sample_id"].to_numpy()[rows.test])
    assert not np.array_equal(draw_rows(m, 50, 20, seed=7).train, rows.train)  # the seed matters


def test_carve_out_keeps_patients_whole_and_uses_the_fractions():
    _, m = synthetic(n=4000, split=False)
    split = head_splits(m, seed=42, val_fraction=0.1, test_fraction=0.2)
    per_patient = pd.Series(split).groupby(m["patient_id"]).nunique()
    assert per_patient.max() == 1
    share = pd.Series(split).value_counts(normalize=True)
    assert abs(share["test"] - 0.2) < 0.03 and abs(share["val"] - 0.1) < 0.03
    # a manifest with train and test but no val: only val is carved, out of train
    m["split"] = np.where(np.arange(4000) // 2 % 5 == 0, "test", "train")
    carved = head_splits(m, seed=42)
    assert (carved[m["split"] == "test"] == "test").all() and set(carved) == {"train", "val", "test"}
