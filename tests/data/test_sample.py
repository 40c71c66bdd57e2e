"""The resolution ablation's fixed sample (robustbench_fm/data/sample.py; candor.md ablation (5):
"a fixed sample of MIMIC-CXR and CheXpert, with up to 500 positives and 500 negatives per
matched group and finding"), against an independent brute force of the draw."""
import hashlib

import numpy as np
import pandas as pd
import pytest

from robustbench_fm.data.sample import fixed_sample


def _manifest(n: int = 120, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    m = pd.DataFrame({"sample_id": [f"img{i:04d}" for i in range(n)], "path": [f"p/{i}.jpg" for i in range(n)],
                      "acq_group": rng.choice(["site_PA", "site_AP", "other_PA"], n),
                      "edema": rng.choice([0.0, 1.0, np.nan], n, p=[0.6, 0.3, 0.1]),
                      "fracture": rng.choice([0.0, 1.0, np.nan], n, p=[0.8, 0.1, 0.1])})
    m.loc[m["acq_group"] == "other_PA", "fracture"] = np.nan  # a site without the finding
    return m


def _brute(m: pd.DataFrame, findings, n: int, seed: int = 42) -> dict[str, set]:
    """finding -> the sample_ids drawn for it: per group and label, the n smallest SHA-256 values."""
    out = {}
    for f in findings:
        chosen = set()
        for (_, label), part in m[m[f].notna()].groupby(["acq_group", f]):
            h = {s: int(hashlib.sha256(f"{seed}|{f}|{s}".encode()).hexdigest()[:16], 16) for s in part["sample_id"]}
            chosen |= set(sorted(h, key=h.get)[:n])
        out[f] = chosen
    return out


@pytest.mark.parametrize("n", [1, 4, 500])
def test_at_most_n_positives_and_negatives_per_group_and_finding(n):
    m = _manifest()
    got = fixed_sample(m, ["edema", "fracture"], n)
    want = _brute(m, ["edema", "fracture"], n)
    assert set(got["sample_id"]) == want["edema"] | want["fracture"]  # the union of the draws
    for f in ("edema", "fracture"):
        labelled = got[got[f].notna()]
        assert set(labelled["sample_id"]) == want[f]  # each finding sees only its own draw
        counts = labelled.groupby(["acq_group", f]).size()
        full = m[m[f].notna()].groupby(["acq_group", f]).size()
        assert (counts == np.minimum(full, n)).all()  # up to n: all of a smaller class
        same = m.set_index("sample_id").loc[labelled["sample_id"], f].to_numpy()
        assert (labelled[f].to_numpy() == same).all()  # labels kept where drawn
    assert got["sample_id"].tolist() == [s for s in m["sample_id"] if s in set(got["sample_id"])]  # manifest order


def test_the_sample_is_fixed_whatever_the_row_order_and_nested_in_larger_ones():
    m = _manifest()
    a = fixed_sample(m, ["edema"], 5)
    b = fixed_sample(m.sample(frac=1, random_state=1), ["edema"], 5)
    assert set(a["sample_id"]) == set(b["sample_id"])
    assert set(a["sample_id"]) <= set(fixed_sample(m, ["edema"], 6)["sample_id"])
    assert set(a["sample_id"]) != set(fixed_sample(m, ["edema"], 5, seed=7)["sample_id"])


def test_bad_settings_are_one_line():
    m = _manifest()
    with pytest.raises(ValueError, match="fixed_sample=0"):
        fixed_sample(m, ["edema"], 0)
    with pytest.raises(ValueError, match="not 0/1/NaN"):
        fixed_sample(m.assign(edema="a"), ["edema"], 3)
    with pytest.raises(ValueError, match="no 'acq_group' column"):
        fixed_sample(m.drop(columns="acq_group"), ["edema"], 3)


def test_bad_settings_are_invalid_settings_naming_the_setting():
    from robustbench_fm.core.errors import InvalidSetting

    with pytest.raises(InvalidSetting) as err:
        fixed_sample(_manifest(), ["pneumonia"], 3)
    assert str(err.value) == "fixed_sample: finding 'pneumonia' is not a column of the manifest; fix stage.findings"
    with pytest.raises(InvalidSetting, match="^sample=0: draw at least 1"):
        fixed_sample(_manifest(), ["edema"], 0, key="sample")
