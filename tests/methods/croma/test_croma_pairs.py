"""Paired 2x2 quartets from a manifest (issue 19 item 5). The construction is checked against a
brute-force enumeration, and on PathoROB's real TCGA metadata it is shown that the paper's 94
TCGA-2x2 quartets cannot come from the TCGA-4x4 file the adapters read (4 cancer types, 8 centres):
that item is blocked on PathoROB's tcga_2x2.csv."""
from itertools import combinations
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from croma_cohorts import cohort

from robustbench_fm.methods.croma import stage
from robustbench_fm.methods.croma.pairs import paired_quartets
from robustbench_fm.report import published

METADATA = Path(__file__).resolve().parents[2] / "reference" / "pathorob" / "metadata"


def test_quartets_are_every_complete_label_pair_by_centre_pair():
    x, manifest = cohort(n_labels=3, n_confs=3, slides_per_cell=2, tiles_per_slide=4, seed=5)
    gone = (manifest["bio_label"] == "class2") & (manifest["site"] == "centre0")
    x, manifest = x[~gone.to_numpy()], manifest[~gone].reset_index(drop=True)
    out = paired_quartets(manifest)
    want = [(a, b, c, d) for a, b in combinations(["class0", "class1", "class2"], 2)
            for c, d in combinations(["centre0", "centre1", "centre2"], 2)
            if not ("class2" in (a, b) and "centre0" in (c, d))]
    assert out["subset"].nunique() == len(want) == 9 - 2 * 2  # the 2 x 2 quartets with class2 and centre0 lack a cell
    for a, b, c, d in want:
        rows = out[out["subset"] == f"{a}+{b}__{c}_{d}"]
        assert len(rows) == 4 * 8 and set(rows["bio_label"]) == {a, b} and set(rows["site"]) == {c, d}
    rows = pd.Index(manifest["sample_id"]).get_indexer(out["sample_id"])
    res = stage.run(x[rows], out, design="paired_2x2", k_grid=[1, 3, 5], m=3)  # every quartet complete
    assert res.summary["n_subsets"][0] == len(want) and res.summary["n"][0] == len(out)


@pytest.mark.parametrize("subset, quartets", [(("ID",), 36), (("ID", "OOD"), 52)])
def test_tcga_metadata_cannot_give_the_papers_94_quartets(subset, quartets):
    meta = pd.read_csv(METADATA / "tcga_4x4.csv", dtype=str)
    meta = meta[meta["subset"].isin(subset)]
    text = published.text_numbers()
    text = text[(text["paper"] == "croma") & text["where"].str.startswith("A.11")].set_index("quantity")["value"]
    paper = {q.split(" (")[0]: int(v) for q, v in text.items()}
    assert paper["balanced 2x2 quartets"] == 94 and paper["total tile occurrences"] == 94 * 4 * 300
    out = paired_quartets(meta, label_col="biological_class", confounder_col="medical_center")
    assert out["subset"].nunique() == quartets
    if subset == ("ID",):  # every in-domain cell holds 360 tiles (3 x 4 x 30)
        assert len(out) == 36 * 4 * 360
    # no reading reaches 94: 4 cancer types and 8 centres against the paper's 21 and 26, and even
    # all C(4,2) x C(8,2) = 168 pairs would need every cell filled; 300 tiles per cell changes nothing
    assert meta["biological_class"].nunique() == 4 < paper["cancer types across quartets"]
    assert meta["medical_center"].nunique() <= 8 < paper["centres across quartets"]
    for min_per_cell in (1, 300):
        assert paired_quartets(meta, "biological_class", "medical_center", min_per_cell=min_per_cell)[
            "subset"].nunique() == quartets < 94
    assert np.all(meta.groupby(["biological_class", "medical_center"]).size() >= 300)
