"""The ``shortcut`` stage end to end on small synthetic Camelyon-shaped cohorts: a planted centre
shortcut gives a clearly negative APD / nIPD against a clean control, the accuracy matrices equal
the ones croma's vendored PathoROB protocol produces on the same rows, and Tolkach's case split
puts the test cases in the held-out tail."""
import random

import numpy as np
import pandas as pd
import pytest
from croma.downstream import pathorob_schedule, probe_sweep_over_test_sets
from threadpoolctl import threadpool_limits

from robustbench_fm import evaluate
from robustbench_fm.methods.croma import shortcut
from robustbench_fm.methods.croma import shortcut_metrics as sm

RPS = 5  # rows per slide: 17 slides x 5 rows per (centre, class) cell
ITER = 2  # replicates (the protocol uses 20)


def camelyon_like(site_strength: float, seed: int = 0):
    """Manifest in PathoROB's layout (cells slide-contiguous, OOD centres after) + features:
    class signal on axis 0, centre signal on axis 1 (``site_strength``), unit noise."""
    rng = np.random.default_rng(seed)
    rows = []
    for ci, centre in enumerate(["RUMC", "UMCU"]):
        for label in ["normal", "tumor"]:
            for s in range(17):
                rows += [dict(site=centre, bio_label=label, slide_id=f"{centre}_{label}_{s}")] * RPS
    for centre in ["CWZ", "RST", "LPON"]:
        for label in ["normal", "tumor"]:
            rows += [dict(site=centre, bio_label=label, slide_id=f"{centre}_{label}")] * 4
    m = pd.DataFrame(rows)
    m.insert(0, "sample_id", [f"t{i}" for i in range(len(m))])
    x = rng.normal(size=(len(m), 6))
    x[:, 0] += 1.2 * np.where(m["bio_label"] == "tumor", 1, -1)
    x[:, 1] += site_strength * np.select([m["site"] == "RUMC", m["site"] == "UMCU"], [1, -1], 0)
    return m, x


@pytest.fixture(scope="module", autouse=True)
def one_blas_thread():
    """Tiny probes run fastest single-threaded on the shared test machine."""
    with threadpool_limits(1):
        yield


@pytest.fixture(scope="module")
def planted(one_blas_thread):
    m, x = camelyon_like(site_strength=4.0)
    return m, x, evaluate("shortcut", x, m, benchmark="camelyon", iterations=ITER, rows_per_slide=RPS)


def test_planted_shortcut_drops_accuracy_and_clean_control_does_not(planted):
    _, _, res = planted
    clean_m, clean_x = camelyon_like(site_strength=0.0)
    clean = shortcut.run(clean_x, clean_m, benchmark="camelyon", iterations=ITER, rows_per_slide=RPS)
    s, c = res.summary.set_index("test_set"), clean.summary.set_index("test_set")
    assert list(s.index) == ["id", "ood"] and s.loc["id", "n_test"] == 4 * 2 * RPS and s.loc["ood", "n_test"] == 24
    assert s.loc["id", "apd"] < -0.15 and s.loc["id", "nipd"] < -0.2
    assert abs(c.loc["id", "apd"]) < 0.06
    assert s.loc["id", "apd"] < c.loc["id", "apd"] - 0.1
    assert s.loc["id", "acc_confounded"] < s.loc["id", "acc_balanced"] - 0.2
    assert len(res.per_sample) == 2 * 8 * ITER
    assert res.per_sample["cramers_v"].max() == pytest.approx(1.0)


def test_matrices_equal_the_vendored_pathorob_protocol(planted):
    m, x, res = planted
    ident = m["site"].isin(["RUMC", "UMCU"]).to_numpy()
    y = (m["bio_label"] == "tumor").to_numpy().astype(int)
    ref = probe_sweep_over_test_sets(
        x[ident], (m["site"][ident] == "UMCU").to_numpy().astype(int), y[ident],
        schedule=pathorob_schedule("camelyon", rows_per_slide=RPS), rows_per_slide=RPS, iterations=ITER,
        seed=1000, test_sets={"ood": (x[~ident], y[~ident])})
    for ours, theirs in (("id", "in_domain"), ("ood", "ood")):
        got = res.per_sample[res.per_sample["test_set"] == ours].pivot(index="split", columns="replicate",
                                                                        values="accuracy").to_numpy()
        np.testing.assert_array_equal(got, ref[theirs])


def test_tolkach_case_split_moves_test_cases_to_the_tail():
    cells = [[[np.array([100 * i + 10 * j + s]) for s in range(9)] for j in range(6)] for i in range(2)]
    case_of = {100 * i + 10 * j + s: f"c{i}_{s}" for i in range(2) for j in range(6) for s in range(9)}
    slide_ids = np.array([case_of.get(k, "") for k in range(200)], dtype=object)
    splits = [([[f"c{i}_{s}" for s in range(7)], [f"c{i}_{s}" for s in range(2, 9)]],
               [[f"c{i}_7", f"c{i}_8"], [f"c{i}_0", f"c{i}_1"]]) for i in range(2)]
    replay = random.Random(7)
    draws = [replay.randint(0, 1), replay.randint(0, 1)]  # drawn before any shuffle, one per centre
    shortcut._arrange(cells, random.Random(7), slide_ids, splits)
    for i in range(2):
        tail = sorted(splits[i][1][draws[i]])
        for cell in cells[i]:
            assert [slide_ids[s[0]] for s in cell[-2:]] == tail
            assert sorted(slide_ids[s[0]] for s in cell) == [f"c{i}_{s}" for s in range(9)]


def test_bad_input_fails_in_one_line():
    m, x = camelyon_like(0.0)
    with pytest.raises(ValueError, match="unknown benchmark 'camelyn'"):
        shortcut.check_params(benchmark="camelyn")
    with pytest.raises(ValueError, match=r"cell \(RUMC, normal\) has 85 rows"):
        shortcut.run(x, m, iterations=1)  # the default 300 rows per slide
    with pytest.raises(ValueError, match="centre outside 'camelyon' .*first 'X'"):
        shortcut.run(x, m.assign(site=m["site"].replace("CWZ", "X")), iterations=1, rows_per_slide=RPS)
    shuffled = m.copy()
    shuffled.loc[[4, 5], "slide_id"] = shuffled.loc[[5, 4], "slide_id"].to_numpy()
    with pytest.raises(ValueError, match="block 0 of 5 rows spans slides"):
        shortcut.run(x, shuffled, iterations=1, rows_per_slide=RPS)


def test_tolkach_runs_end_to_end():
    """Each case holds one slide of every class, so every pair of cases is a feasible test set."""
    bm = sm.benchmark("tolkach_esca")
    rows = [dict(site=c, bio_label=k, slide_id=f"c{i}_{s}") for i, c in enumerate(bm.centres) for k in bm.classes
            for s in range(9) for _ in range(3)]
    rows += [dict(site="VALSET3_TCGA", bio_label=k, slide_id="t") for k in bm.classes if k != "REGR_TU"
             for _ in range(2)]
    m = pd.DataFrame(rows).assign(sample_id=lambda d: [f"r{i}" for i in range(len(d))])
    x = np.random.default_rng(1).normal(size=(len(m), 8))
    x[np.arange(len(m)), m["bio_label"].map({k: j for j, k in enumerate(bm.classes)}).to_numpy()] += 3.0
    res = shortcut.run(x, m, benchmark="tolkach_esca", iterations=1, rows_per_slide=3)
    s = res.summary.set_index("test_set")
    assert s.loc["id", "n_test"] == 2 * 6 * 2 * 3 and s.loc["ood", "n_test"] == 10
    assert s.loc["id", "chance"] == pytest.approx(1 / 6) and s.loc["id", "acc_balanced"] > 0.8
    assert res.per_sample["cramers_v"].unique().tolist() == pytest.approx([0, 1 / 3, 2 / 3, 1])
    with pytest.raises(ValueError, match="no set of 2..12 cases holding exactly 6 rows"):
        shortcut.run(x, m.assign(slide_id="one_case"), benchmark="tolkach_esca", iterations=1, rows_per_slide=3)


def test_rows_per_slide_without_validation_rows_is_refused_in_one_line():
    """TCGA with rows_per_slide=2 keeps int(2·2 / 8) = 0 validation rows per cell
    at split 0; one line naming the setting and the smallest value that works, not sklearn's
    "Found array with 0 sample(s)"."""
    from robustbench_fm.core.errors import InvalidSetting

    bm = sm.benchmark("tcga")
    rows = [dict(site=c, bio_label=k, slide_id=f"{c}_{k}_{s}") for c in bm.centres for k in bm.classes
            for s in range(bm.max_train_slides + 2) for _ in range(2)]  # enough rows for rows_per_slide=2
    m = pd.DataFrame(rows)
    m.insert(0, "sample_id", [f"t{i}" for i in range(len(m))])
    x = np.random.default_rng(0).normal(size=(len(m), 4))
    with pytest.raises(InvalidSetting) as err:
        shortcut.run(x, m, benchmark="tcga", rows_per_slide=2, iterations=1)
    message = str(err.value)
    assert "\n" not in message and "rows_per_slide=2" in message and "without validation rows" in message
    assert "at least 4" in message  # split 0 trains at most 2 slides per cell: 2·4 // 8 = 1
    assert "at least 4" in message and all(
        (sm.training_slides("tcga", s) * 4 // bm.max_train_slides).any() for s in range(bm.n_splits))
