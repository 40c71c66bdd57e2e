"""Issue 55 item 1, CRoMa: ``neighbours.parquet`` holds each anchor's k nearest cross-group neighbours as
RI and MaRI counted them: a brute-force cosine top-k of the same features over the other slides of the
anchor's scope (ids and distances, ties aside), with their labels, centres and pair types; the type
counts reproduce per_sample's n_so / n_typed and the summary's RI."""
import numpy as np
import pandas as pd
import pytest
from croma_cohorts import cohort, quartets

from robustbench_fm import evaluate
from robustbench_fm.core.neighbors import l2_normalize
from robustbench_fm.methods.croma import stage
from robustbench_fm.methods.run import score_and_save

TIE = 1e-5


def brute(x, man, anchor, scope, k):
    """(ids, distances) of the k + 1 nearest of ``scope`` (manifest rows) to ``anchor`` on other slides."""
    slides = man["slide_id"].to_numpy()
    cands = scope[slides[scope] != slides[anchor]]
    dist = 1 - x[cands] @ x[anchor]
    order = np.lexsort((man["sample_id"].to_numpy()[cands], dist))
    return cands[order[:k + 1]], dist[order[:k + 1]]


def check(x, man, res, scopes):
    nb, per = res.neighbours, res.per_sample
    k = int(res.summary["k"].iloc[0])
    assert list(nb.columns) == stage.NEIGHBOUR_COLUMNS
    xs = l2_normalize(x).astype(np.float64)
    ids = man["sample_id"].to_numpy()
    labels, centres = dict(zip(man["sample_id"], man["bio_label"])), dict(zip(man["sample_id"], man["site"]))
    for (subset, anchor), part in nb.groupby(["subset", "anchor_id"], sort=False):
        part = part.sort_values("rank")
        rows = scopes[subset]
        a = rows[ids[rows] == anchor][0]
        want_ids, want = brute(xs, man, a, rows, k)
        assert part["rank"].tolist() == list(range(1, len(part) + 1)) and len(part) == min(k, len(want_ids))
        np.testing.assert_allclose(part["distance"].to_numpy(), want[:len(part)], rtol=0, atol=TIE)
        apart = np.abs(np.diff(want)) > TIE
        clear = (apart & np.r_[True, apart[:-1]])[:len(part)]
        got = part["neighbour_id"].to_numpy()  # a paired design lists a sample in several subsets: compare ids
        np.testing.assert_array_equal(got[clear], ids[want_ids[:len(part)]][clear])
        assert (part["neighbour_label"] == part["neighbour_id"].map(labels)).all()
        assert (part["neighbour_centre"] == part["neighbour_id"].map(centres)).all()
        assert (part["label"] == labels[anchor]).all() and (part["centre"] == centres[anchor]).all()
    same_label = nb["neighbour_label"] == nb["label"]
    same_centre = nb["neighbour_centre"] == nb["centre"]
    expected = np.select([same_label & ~same_centre, ~same_label & same_centre, same_label & same_centre],
                         ["SO", "OS", "SS"], "OO")
    assert (nb["type"].to_numpy() == expected).all()
    counts = nb.assign(so=nb["type"] == "SO", typed=nb["type"].isin(["SO", "OS"])).groupby(
        ["subset", "anchor_id"], sort=False)[["so", "typed"]].sum()
    keys = list(zip(per["subset"] if "subset" in per.columns else [""] * len(per), per["sample_id"]))
    np.testing.assert_array_equal(counts.loc[keys, "so"].to_numpy(), per["n_so"].to_numpy())
    np.testing.assert_array_equal(counts.loc[keys, "typed"].to_numpy(), per["n_typed"].to_numpy())
    assert counts["so"].sum() / counts["typed"].sum() == pytest.approx(res.summary["ri"].iloc[0], abs=1e-12)


@pytest.mark.parametrize("k", [None, 7])
def test_croma_neighbours_equal_a_brute_force_top_k(k):
    x, man = cohort(slides_per_cell=3, tiles_per_slide=12, seed=3)
    res = evaluate("croma", x, man, **({} if k is None else {"k": k}))
    check(x, man, res, {"": np.arange(len(man))})
    assert (res.neighbours["subset"] == "").all()


def test_croma_neighbours_stay_inside_each_paired_subset():
    x, man = quartets(n_subsets=3, tiles_per_cell=10, seed=1)
    res = evaluate("croma", x, man, design="paired_2x2", k=5)
    scopes = {s: np.flatnonzero(man["subset"].to_numpy() == s) for s in man["subset"].unique()}
    check(x, man, res, scopes)
    assert set(res.neighbours["subset"]) == set(scopes)


def test_croma_neighbours_are_saved_beside_the_results(tmp_path):
    x, man = cohort(slides_per_cell=2, tiles_per_slide=10, seed=4)
    score_and_save("croma", x, man, ["bio_label"], {"k": 5}, tmp_path, "enc", "tiles")
    saved = pd.read_parquet(tmp_path / "results" / "enc" / "tiles" / "croma" / "bio_label" / "neighbours.parquet")
    assert saved.columns[0] == "encoder" and set(saved["encoder"]) == {"enc"}
    assert set(saved["finding"]) == {"bio_label"} and len(saved) == 5 * len(man)
