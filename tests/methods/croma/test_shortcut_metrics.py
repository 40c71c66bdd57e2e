"""APD / nIPD reductions and the PathoROB schedules (conventions B, F G3/G4)."""
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from croma.downstream._pathorob import get_patches_map_to_split

from robustbench_fm.methods.croma import shortcut_metrics as sm

APD_DIR = Path(__file__).resolve().parents[2] / "reference" / "pathorob" / "apd"
METADATA = Path(__file__).resolve().parents[2] / "reference" / "pathorob" / "metadata"

# conventions F, G4: (model, dataset) -> APD ID, APD OOD, nIPD ID, nIPD OOD
G4 = {
    ("uni2h_clsmean", "camelyon"): (-0.0462926521, -0.0131458909, -0.0671213209, -0.0139512421),
    ("uni2h_clsmean", "tcga"): (-0.0259862428, -0.0262117914, -0.0288553335, -0.0284793205),
    ("uni2h_clsmean", "tolkach_esca"): (-0.0041749983, +0.0003551494, -0.0030862608, +0.0006255946),
    ("phikonv2_clsmean", "camelyon"): (-0.1164740901, -0.0910389446, -0.1759973404, -0.1416138389),
    ("phikonv2_clsmean", "tcga"): (-0.0569901890, -0.0455730077, -0.0625883332, -0.0528913434),
    ("phikonv2_clsmean", "tolkach_esca"): (-0.0496594929, -0.0134865777, -0.0338893199, -0.0081216728),
}


@pytest.mark.parametrize("model,dataset", sorted(G4))
def test_reductions_reproduce_the_published_values(model, dataset):
    raw = json.loads((APD_DIR / model / f"{dataset}_raw.json").read_text())
    published = json.loads((APD_DIR / model / f"{dataset}_summary.json").read_text())
    v = sm.schedule_cramers_v(dataset)
    chance = 1 / len(sm.benchmark(dataset).classes)
    ident, ood = raw["ID_test_accuracies"], raw["OOD_test_accuracies"]
    assert np.shape(ident) == (sm.benchmark(dataset).n_splits, 20)
    got = (sm.apd(ident), sm.apd(ood), sm.nipd(ident, v, chance), sm.nipd(ood, v, chance))
    assert got == pytest.approx(G4[model, dataset], abs=1e-9)
    assert got[:2] == pytest.approx((published["apd_id"], published["apd_ood"]), abs=1e-12)


def test_nipd_unit_cases():
    assert sm.nipd([[.9, .9], [.82, .82], [.5, .5]], [0, .2, 1], .5) == pytest.approx(-0.5)
    assert sm.nipd([[.9, .51], [.82, .50]], [0, 1], .5) == pytest.approx(-9 / 82)
    dense = np.linspace(.9, .5, 5)[:, None].repeat(3, axis=1)
    assert sm.nipd(dense, np.linspace(0, 1, 5), .5) == pytest.approx(-0.5)
    with pytest.raises(ValueError, match="not above chance"):
        sm.nipd([[.5], [.4]], [0, 1], .5)
    with pytest.raises(ValueError, match="strictly increasing"):
        sm.nipd([[.9], [.8]], [0, .5], .5)
    with pytest.raises(ValueError, match="balanced-split accuracy must be positive"):
        sm.apd([[0.0], [.5]])


@pytest.mark.parametrize("dataset,expected", [
    ("camelyon", [s / 7 for s in range(8)]),
    ("tcga", [0, 0.204124, 0.353553, 0.5, 0.677003, 0.841625, 1]),
    ("tolkach_esca", [0, 1 / 3, 2 / 3, 1]),
])
def test_schedules_give_the_listed_cramers_v(dataset, expected):
    assert sm.schedule_cramers_v(dataset) == pytest.approx(expected, abs=5e-7)


@pytest.mark.parametrize("dataset", ["camelyon", "tcga", "tolkach_esca"])
def test_schedules_match_pathorob(dataset):
    bm = sm.benchmark(dataset)
    for split in range(bm.n_splits):
        pairs, max_slides = get_patches_map_to_split(dataset, split, bm.rows_per_slide)
        ours = sm.training_slides(dataset, split) * bm.rows_per_slide
        assert max_slides == bm.max_train_slides
        assert [(i, j, int(ours[i, j])) for i, j, _ in pairs] == pairs


def test_replicate_seeds_are_pathorobs():
    seeds = sm.replicate_seeds()
    assert len(seeds) == 20 and seeds[:3] == [7028, 1624, 6448]


def test_tolkach_case_splits_reproduce_pathorobs_resource_file():
    """PathoROB's resources/tolkach_splits.json (commit b559d16, 161,937 characters as written by
    json.dump(indent=2)): 17 splits for VALSET2_WNS, 240 for VALSET4_CHA_FULL, first and last as below."""
    meta = pd.read_csv(METADATA / "tolkach_esca.csv", dtype=str)
    bm = sm.benchmark("tolkach_esca")
    out = {"train": {}, "test": {}}
    for centre, max_size in zip(bm.centres, bm.case_split_max_sizes):
        rows = meta[meta["medical_center"] == centre]
        labels = rows["biological_class"].map({c: j for j, c in enumerate(bm.classes)}).to_numpy()
        out["train"][centre], out["test"][centre] = sm.feasible_case_splits(rows["slide_id"], labels, 6, 200, max_size)
    assert [len(out["test"][c]) for c in bm.centres] == [17, 240]
    assert out["test"]["VALSET2_WNS"][0] == ["case_021", "case_025"]
    assert out["train"]["VALSET4_CHA_FULL"][0] == [f"case_{k:03d}" for k in range(47, 78) if k not in (53, 59, 76)]
    assert out["test"]["VALSET4_CHA_FULL"][-1] == ["case_062", "case_072", "case_075", "case_076", "case_077"]
    assert len(json.dumps(out, indent=2)) == 161937
