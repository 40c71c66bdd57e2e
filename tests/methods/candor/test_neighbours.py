"""Issue 55 item 1: ``neighbours.parquet`` holds the neighbours CANDOR scored, as it found them.

Checked against a brute-force cosine top-k (float64 numpy) of the same features within each matched
group: the ids and similarities of every query's k nearest positives and negatives, among the banks
(``candidates="bank"``, the banks redrawn with the stage's own seeded draw) and among all positives /
negatives of the group (``"all"``); and the means of each query's rows reproduce per_sample's c+ / c−
(and the margin of the sampled negatives), on every path the stage takes (the shared shortlist with
its held matrix, the tile pass, the exact searches, the neighbour controls, copies of one vector).
Ties aside: the features are continuous, and an id is compared only where its similarity is not
within :data:`TIE` of the next one.
"""
import numpy as np
import pandas as pd
import pytest
import torch

import robustbench_fm
from robustbench_fm.core.neighbors import l2_normalize
from robustbench_fm.methods.candor import shortlist as csl
from robustbench_fm.methods.candor import stage as candor
from robustbench_fm.methods.candor.shortlist import Shortlist
from robustbench_fm.methods.run import score_and_save

K = 5
TIE = 1e-5
FINDINGS = ["pneumothorax", "cardiomegaly"]


def cohort(n=500, d=16, seed=0, copies=False):
    rng = np.random.default_rng(seed)
    feats = rng.standard_normal((n, d)).astype(np.float32)
    man = pd.DataFrame({"sample_id": [f"s{i:04d}" for i in range(n)],
                        "patient_id": [f"p{i // 2:04d}" for i in range(n)],
                        "acq_group": np.array(["A", "B", "C"])[rng.integers(0, 3, n)]})
    for j, (finding, prevalence) in enumerate(zip(FINDINGS, (0.3, 0.6))):
        labels = (rng.random(n) < prevalence).astype(float)
        labels[rng.random(n) < 0.05] = np.nan  # unlabelled images: in the sample, never a query
        man[finding] = labels
        feats[labels == 1, j] += 0.8
    if copies:
        feats[1::9] = feats[0::9][:len(feats[1::9])]
    return feats, man


def brute(x, queries, cands, k, patients=None):
    """(ids, similarities) of the k + 1 nearest of ``cands`` to each query (itself, and with
    ``patients`` its patient's images, excluded), float64, descending."""
    sims = x[queries] @ x[cands].T
    sims[queries[:, None] == cands[None, :]] = -np.inf
    if patients is not None:
        sims[patients[queries][:, None] == patients[cands][None, :]] = -np.inf
    order = np.argsort(-sims, axis=1, kind="stable")[:, :k + 1]
    return cands[order], np.take_along_axis(sims, order, 1)


def check_against_brute_force(feats, man, res, bank_size, max_group_sample, seed=42, exclude_patient=False,
                              compare_ids=True):
    x = l2_normalize(feats).astype(np.float64)
    nb = res.neighbours.sort_values(["query_id", "rank"], kind="stable")
    index = {s: i for i, s in enumerate(man["sample_id"])}
    groups = man["acq_group"].astype(str).to_numpy()
    patients = man["patient_id"].to_numpy() if exclude_patient else None
    checked = 0
    for finding in FINDINGS:
        labels = man[finding].to_numpy()
        for group in sorted(set(groups)):
            in_group = groups == group
            pos, neg = np.flatnonzero(in_group & (labels == 1)), np.flatnonzero(in_group & (labels == 0))
            _, bank_pos, bank_neg = candor.draw_group(np.flatnonzero(in_group), pos, neg, bank_size,
                                                      max_group_sample, candor.group_rng(seed, group))
            rows = nb[(nb["finding"] == finding) & (nb["acq_group"] == group)]
            for (candidates, side), part in rows.groupby(["candidates", "side"]):
                assert (part["rank"].to_numpy().reshape(-1, K) == np.arange(1, K + 1)).all()
                queries = part["query_id"].map(index).to_numpy().reshape(-1, K)[:, 0]
                cands = {("bank", "pos"): bank_pos, ("bank", "neg"): bank_neg,
                         ("all", "pos"): pos, ("all", "neg"): neg}[(candidates, side)]
                ids, sims = brute(x, queries, cands, K, patients)
                np.testing.assert_allclose(part["similarity"].to_numpy().reshape(-1, K), sims[:, :K], rtol=0,
                                           atol=TIE)
                if compare_ids:
                    got = part["neighbour_id"].map(index).to_numpy().reshape(-1, K)
                    apart = np.abs(np.diff(sims, axis=1)) > TIE  # rank i apart from rank i + 1
                    clear = apart & np.c_[np.ones(len(sims), bool), apart[:, :-1]]  # ... and from rank i - 1
                    np.testing.assert_array_equal(got[clear], ids[:, :K][clear])
                    assert clear.mean() > 0.9
                checked += len(queries)
    assert checked > 100
    return checked


def check_means(res):
    """Each query's rows average to per_sample's c+ and c− (bank) and c+_all, c−_all (all); ``dm`` and
    ``discordant`` are per_sample's; a sampled negative's ``dm`` is minus its margin in ``items``."""
    nb, per, items = res.neighbours, res.per_sample, res.items
    keys = ["finding", "target", "acq_group", "query_id"]
    means = nb.groupby(keys + ["query_label", "candidates", "side"])["similarity"].mean().unstack("side")
    flags = nb.groupby(keys + ["query_label", "candidates"])[["dm", "discordant"]].first()
    pos = means.xs(1, level="query_label")
    per = per.rename(columns={"sample_id": "query_id"}).set_index(keys)
    bank, every = pos.xs("bank", level="candidates"), pos.xs("all", level="candidates")
    assert len(bank) == len(per) and len(every) == len(per)
    bank, every = bank.loc[per.index], every.loc[per.index]
    np.testing.assert_allclose(bank["pos"], per["c_pos"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(bank["neg"], per["c_neg"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(every["pos"], per["c_pos_all"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(every["neg"], per["c_neg_all"], rtol=0, atol=1e-12)
    q_flags = flags.xs(1, level="query_label")
    np.testing.assert_array_equal(q_flags.xs("bank", level="candidates").loc[per.index, "dm"], per["dm"])
    np.testing.assert_array_equal(q_flags.xs("bank", level="candidates").loc[per.index, "discordant"],
                                  per["discordant"])
    np.testing.assert_array_equal(q_flags.xs("all", level="candidates").loc[per.index, "dm"], per["dm_all"])
    np.testing.assert_array_equal(q_flags.xs("all", level="candidates").loc[per.index, "discordant"],
                                  per["discordant_all"])
    negs = flags.xs(0, level="query_label").xs("bank", level="candidates")
    assert len(negs)
    margins = items[items["label"] == 0].rename(columns={"sample_id": "query_id"}).set_index(keys)["margin"]
    np.testing.assert_array_equal(negs["dm"].to_numpy(), -margins.loc[negs.index].to_numpy())
    np.testing.assert_array_equal(negs["discordant"].to_numpy(), negs["dm"].to_numpy() < 0)
    neg_means = means.xs(0, level="query_label").xs("bank", level="candidates").loc[negs.index]
    np.testing.assert_allclose(neg_means["neg"] - neg_means["pos"], negs["dm"], rtol=0, atol=1e-12)
    per_group = negs.reset_index().groupby(["finding", "acq_group"]).size()
    assert per_group.max() <= candor.NEIGHBOUR_NEGATIVES


@pytest.mark.parametrize("path", ["shortlist", "exact"])
@pytest.mark.parametrize("bank_size, max_group_sample", [(4000, 4000), (40, 120)])
def test_neighbours_equal_a_brute_force_top_k(path, bank_size, max_group_sample):
    """Full banks and small ones (banks a draw of each class, queries from a sample), on the shared
    shortlist and on the exact searches."""
    feats, man = cohort()
    res = robustbench_fm.evaluate("candor", feats, man, finding=FINDINGS, k=K, n_boot=0, bank_size=bank_size,
                                  max_group_sample=max_group_sample, neighbour_path=path)
    assert list(res.neighbours.columns) == candor.NEIGHBOUR_COLUMNS
    check_against_brute_force(feats, man, res, bank_size, max_group_sample)
    check_means(res)


def test_neighbours_of_the_tile_pass_and_a_short_shortlist(monkeypatch):
    """No held matrix (the tile-by-tile shortlist, short rows answered by exact searches) and a
    shortlist too short for most rows (the held matrix answers them)."""
    feats, man = cohort(seed=1)
    short = robustbench_fm.evaluate("candor", feats, man, finding=FINDINGS, k=K, n_boot=0, bank_size=60,
                                    neighbour_path="shortlist", shortlist=K + 1)
    check_against_brute_force(feats, man, short, 60, 4000)
    check_means(short)
    monkeypatch.setattr(csl, "MATRIX_BYTES", 0)
    tiles = robustbench_fm.evaluate("candor", feats, man, finding=FINDINGS, k=K, n_boot=0, bank_size=60,
                                    neighbour_path="shortlist")
    check_against_brute_force(feats, man, tiles, 60, 4000)
    check_means(tiles)


def test_neighbours_under_the_neighbour_controls():
    """``exclude_patient``: the query's patient is in no candidate set (the brute force leaves it out
    too); ``equal_size``: the means still give per_sample's c± (one negative removed per query in R+)."""
    feats, man = cohort(seed=2)
    res = robustbench_fm.evaluate("candor", feats, man, finding=FINDINGS, k=K, n_boot=0, bank_size=80,
                                  exclude_patient=True)
    check_against_brute_force(feats, man, res, 80, 4000, exclude_patient=True)
    check_means(res)
    patients = man.set_index("sample_id")["patient_id"]
    assert (patients[res.neighbours["query_id"]].to_numpy()
            != patients[res.neighbours["neighbour_id"]].to_numpy()).all()
    check_means(robustbench_fm.evaluate("candor", feats, man, finding=FINDINGS, k=K, n_boot=0, bank_size=80,
                                        equal_size=True))


@pytest.mark.parametrize("control", [{"shuffle_labels": True}, {"queries": "negative"}, {"unmatched": True},
                                     {"isolated": True}])
def test_neighbours_reproduce_per_sample_under_the_label_controls(control):
    feats, man = cohort(seed=6)
    check_means(robustbench_fm.evaluate("candor", feats, man, finding=FINDINGS, k=K, n_boot=0, bank_size=80,
                                        **control))


def test_neighbours_of_copies():
    """Bitwise-identical vectors (the distinct pass): similarities still the brute force's, means
    per_sample's (ids of tied copies are interchangeable, so only similarities are compared)."""
    feats, man = cohort(seed=3, copies=True)
    for path in ("shortlist", "exact"):
        res = robustbench_fm.evaluate("candor", feats, man, finding=FINDINGS, k=K, n_boot=0, bank_size=50,
                                      neighbour_path=path)
        check_against_brute_force(feats, man, res, 50, 4000, compare_ids=False)
        check_means(res)


def test_negatives_are_a_seeded_draw_of_at_most_200_per_group(tmp_path):
    """Every scored query, at most NEIGHBOUR_NEGATIVES negatives per (finding, group), the same draw
    run to run; score_and_save writes neighbours.parquet per finding with the encoder."""
    feats, man = cohort(n=1500, seed=4)
    first = robustbench_fm.evaluate("candor", feats, man, finding=FINDINGS, k=K, n_boot=0)
    again = robustbench_fm.evaluate("candor", feats, man, finding=FINDINGS, k=K, n_boot=0)
    pd.testing.assert_frame_equal(first.neighbours, again.neighbours)
    negs = first.neighbours[first.neighbours["query_label"] == 0]
    counts = negs.groupby(["finding", "acq_group"])["query_id"].nunique()
    labelled = man.melt(id_vars=["acq_group"], value_vars=FINDINGS, var_name="finding")
    available = labelled[labelled["value"] == 0].groupby(["finding", "acq_group"]).size()
    np.testing.assert_array_equal(counts.to_numpy(), np.minimum(available.loc[counts.index].to_numpy(), 200))
    assert (counts == 200).any()
    queries = first.neighbours[first.neighbours["query_label"] == 1].groupby("finding")["query_id"].nunique()
    assert queries.to_dict() == first.per_sample.groupby("finding")["sample_id"].nunique().to_dict()

    score_and_save("candor", feats, man, FINDINGS, {"k": K, "n_boot": 0}, tmp_path, "enc_a", "toy")
    for finding in FINDINGS:
        saved = pd.read_parquet(tmp_path / "results" / "enc_a" / "toy" / "candor" / finding / "neighbours.parquet")
        want = first.neighbours[first.neighbours["finding"] == finding].reset_index(drop=True)
        assert saved.columns[0] == "encoder" and set(saved["encoder"]) == {"enc_a"}
        pd.testing.assert_frame_equal(saved.drop(columns="encoder"), want)


def test_shortlist_neighbours_on_every_branch(monkeypatch):
    """:meth:`Shortlist.mean_topk` with ``neighbours``: on every branch (first hits in numpy and in
    the tensor form a GPU takes, the held matrix by keyed columns, by ``topk_columns`` and by rows,
    the exact fallback) the rows' similarities are the features' and average to the c(x) returned,
    which equal the c(x) without ``neighbours`` bit for bit."""
    rng = np.random.default_rng(5)
    x = l2_normalize(rng.standard_normal((600, 12)))
    rows = np.sort(rng.choice(600, 500, replace=False))
    feats = torch.as_tensor(x)
    cases = [(np.sort(rng.choice(rows, 100, replace=False)), rows),         # sparse: off the matrix, by columns
             (np.sort(rng.choice(rows, 12, replace=False)), rows[:60]),     # sparse, few rows: by rows
             (np.sort(rng.choice(rows, 300, replace=False)), rows)]         # dense: first hits
    shortlists = {"held": Shortlist(feats, rows, size=40, block_size=64)}
    monkeypatch.setattr(csl, "MATRIX_BYTES", 0)
    shortlists["tiles"] = Shortlist(feats, rows, size=40, block_size=64)
    for name, shortlist in shortlists.items():
        for cands, queries in cases:
            plain = shortlist.mean_topk(queries, cands, K)
            means, found = shortlist.mean_topk(queries, cands, K, neighbours=True)
            np.testing.assert_array_equal(means, plain)
            assert np.isin(found.rows, cands).all() and (found.rows != queries[:, None]).all()
            np.testing.assert_allclose(found.sims, np.einsum("qd,qkd->qk", x[queries], x[found.rows]), atol=1e-6)
            np.testing.assert_allclose(found.sims.astype(np.float64).mean(axis=1), means, rtol=0, atol=1e-12)
            assert (np.diff(found.sims, axis=1) <= 0).all()
    held = shortlists["held"]
    monkeypatch.setattr(csl, "topk_columns_keyed", lambda *a: None)  # the GPU's column path on the CPU
    cands, queries = cases[0]
    means, found = held.mean_topk(queries, cands, K, neighbours=True)
    np.testing.assert_array_equal(means, held.mean_topk(queries, cands, K))
    np.testing.assert_allclose(found.sims.astype(np.float64).mean(axis=1), means, rtol=0, atol=1e-12)
    # the tensor form of the first hits (a GPU's), on CPU tensors
    cands = np.sort(rng.choice(rows, 300, replace=False))
    in_r = torch.zeros(len(x), dtype=torch.bool)
    in_r[torch.as_tensor(cands)] = True
    local = torch.as_tensor(np.searchsorted(rows, rows[:100]))
    sums, hits, members, sims = held._first_hits(local, in_r, K, 40, True)
    np_sums, np_hits, np_members, np_sims = held._first_hits(local.numpy(), in_r.numpy(), K, 40, True)
    done = hits == K
    assert done.any()
    np.testing.assert_array_equal(hits, np_hits)
    np.testing.assert_array_equal(members[done], np_members[done])
    np.testing.assert_array_equal(sims[done], np_sims[done])
    np.testing.assert_allclose(sums[done], np_sums[done], rtol=0, atol=1e-12)
