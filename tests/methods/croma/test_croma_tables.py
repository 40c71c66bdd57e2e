"""CRoMa's collect step on finished sweep folders: the panel median-k protocol (lower median of the
jobs' k*, every encoder re-scored at it from its cache entry) and the published layouts of
Tables 3, 7, 8, 9, 11 and 14."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from croma_sweeps import camelyon_root, compose_cfg, fake_sweep, panda_table
from scipy.stats import spearmanr

from robustbench_fm.api import evaluate
from robustbench_fm.core.errors import UserError
from robustbench_fm.core.results import Results
from robustbench_fm.core.tables import SweepResults
from robustbench_fm.data import build_manifest
from robustbench_fm.methods.croma import tables as tc
from robustbench_fm.methods.croma.panel import median_k, typed_ranks
from robustbench_fm.paper import published
from robustbench_fm.pipeline.job import job_manifest

SCORES = ["ri", "mari", "tau", "k", "support", "croma", "f0", "q_alpha", "ltm", "bio_knn_bacc", "conf_knn_bacc"]


def published_columns(number: int) -> list[str]:
    return list(dict.fromkeys(published.table("croma", number, "")["column"]))


def features_for(manifest: pd.DataFrame, strengths: dict[str, tuple[float, float]], dim=16, seed=0):
    """Per encoder: label signal a, confounder signal b, slide signal and noise (distinct sample_ids)."""
    rng = np.random.default_rng(seed)
    rows = manifest.drop_duplicates("sample_id")
    lab = pd.factorize(rows["bio_label"])[0]
    con = pd.factorize(rows["site"])[0]
    out = {}
    for name, (a, b) in strengths.items():
        d_lab, d_con = rng.standard_normal((lab.max() + 1, dim)), rng.standard_normal((con.max() + 1, dim))
        out[name] = (a * d_lab[lab] + b * d_con[con] + 0.7 * rng.standard_normal((len(rows), dim))).astype(np.float32)
    return out


@pytest.fixture(scope="module")
def camelyon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("croma_tables")
    root = camelyon_root(tmp / "camelyon")
    cfg = compose_cfg([f"paths.root={tmp}", "experiment=croma_camelyon", f"dataset.root={root}", "device=cpu"])
    manifest = build_manifest("pathorob_camelyon", root)
    feats = features_for(manifest, {"uni": (1.2, 0.4), "phikon": (0.5, 1.0), "dinov2_b": (0.3, 0.3),
                                    "virchow2": (0.9, 0.9)})
    sweep = tmp / "sweep"
    fake_sweep(sweep, cfg, manifest, feats, tmp / "cache")
    return dict(tmp=tmp, root=root, cfg=cfg, manifest=manifest, feats=feats,
                results=SweepResults(sweep, load_manifest=job_manifest))


def test_median_k_rescores_every_encoder_at_the_lower_median(camelyon):
    results, manifest = camelyon["results"], camelyon["manifest"]
    k_star = results.summaries("croma").set_index("encoder")["k"]
    shared = sorted(k_star)[(len(k_star) - 1) // 2]
    assert shared == median_k(k_star)
    panel = tc.croma_panel(results)
    assert (results.root / "collect" / "median_k" / "panel.json").is_file()
    summary = panel.summary.set_index("encoder")
    assert set(summary["k"]) == {shared}
    assert summary["k_star"].to_dict() == k_star.to_dict()
    for name, x in camelyon["feats"].items():
        ref = evaluate("croma", x, manifest, finding="bio_label", k=shared, **{
            k: v for k, v in dict(camelyon["cfg"].stage.params).items() if k not in ("k", "device")})
        for col in SCORES:
            assert summary.at[name, col] == pytest.approx(ref.summary[col].iloc[0], rel=1e-12, abs=1e-12), col
        mine = panel.per_sample[panel.per_sample["encoder"] == name].reset_index(drop=True)
        pd.testing.assert_frame_equal(mine[ref.per_sample.columns], ref.per_sample, check_exact=False, rtol=1e-12)
    # the m / α sweeps come from the same pass: CRoMa at m = 5 is the headline
    by_m = panel.by_m.set_index(["encoder", "m"])["croma"]
    for name in camelyon["feats"]:
        assert by_m[(name, 5)] == pytest.approx(summary.at[name, "croma"], abs=1e-12)
    stamp = (results.root / "collect" / "median_k" / "panel.json").stat().st_mtime_ns
    tc.croma_panel(results)  # unchanged entries: read back, not recomputed
    assert (results.root / "collect" / "median_k" / "panel.json").stat().st_mtime_ns == stamp


def test_score_and_rank_tables_have_the_published_layout(camelyon):
    results = camelyon["results"]
    (t3,) = tc.croma_table3(results)
    assert list(t3.frame.columns) == ["Model"] + published_columns(3)
    published_rows = set(published.table("croma", 3, "")["row"])
    assert set(t3.frame["Model"]) <= published_rows
    assert t3.frame["Model"].iloc[-1] == "DINOv2-B"  # the control is listed last
    pathology = t3.frame.iloc[:-1]
    assert pathology["CRoMa"].is_monotonic_decreasing
    np.testing.assert_allclose(t3.frame["Δ"], t3.frame["MaRI"] - t3.frame["RI"])
    assert t3.best["F(0)"] == "min" and "conf bacc" not in t3.best and "Δ" not in t3.best
    assert "F(0) = share of samples with CRoMa <= 0 (croma 1.0.1; the paper's Eq. 12 writes < 0)" in t3.caption
    summary = tc.croma_panel(results).summary
    summary = summary[~summary["encoder"].isin(tc.CONTROLS)]
    for number, builder in ((7, tc.croma_table7), (8, tc.croma_table8), (9, tc.croma_table9)):
        (table,) = builder(results)
        assert list(table.frame.columns) == ["Benchmark"] + published_columns(number)
        assert table.frame["Benchmark"].tolist() == ["Camelyon"]
    (t12,) = tc.croma_table12(results)
    assert list(t12.frame.columns) == ["Model"] + published_columns(12)
    assert t12.frame["Model"].tolist() == t3.frame["Model"].tolist()
    np.testing.assert_allclose(t12.frame["CRoMa"], t3.frame["CRoMa"])
    ranks = typed_ranks(camelyon["feats"]["uni"], camelyon["manifest"], device="cpu")
    row = t12.frame.set_index("Model").loc["UNI"]
    assert row["median rank SO"] == ranks["rank_so"].median() and row["median rank OS"] == ranks["rank_os"].median()
    first = np.concatenate([typed_ranks(camelyon["feats"][e], camelyon["manifest"], device="cpu")[
        ["rank_so", "rank_os"]].min(axis=1).to_numpy() for e in ("uni", "phikon", "virchow2")])  # no DINOv2-B
    n = len(camelyon["manifest"])
    assert f"Pooled across the 3 pathology encoders, the first SO or OS neighbour occurs at a median rank of " \
           f"{np.median(first):g} among {n - 1:,} candidates" in t12.caption
    (t9,) = tc.croma_table9(results)
    assert t9.frame.at[0, "CRoMa vs RI"] == pytest.approx(spearmanr(summary["croma"], summary["ri"]).statistic)
    with pytest.raises(UserError, match="no TCGA-4x4"):
        tc.croma_table4(results)


def test_table11_scores_croma_on_the_ri_rows_of_the_shortcut_entries(camelyon, tmp_path):
    cfg = compose_cfg([f"paths.root={tmp_path}", "experiment=croma_shortcut", f"dataset.root={camelyon['root']}",
                       "device=cpu"])
    apd_view = build_manifest("pathorob_camelyon", camelyon["root"], view="apd")
    feats = features_for(apd_view, {"uni": (1.2, 0.4), "phikon": (0.5, 1.0), "virchow2": (0.9, 0.9)}, seed=1)
    apd = {"uni": (-0.01, -0.05), "phikon": (-0.20, -0.15), "virchow2": (-0.08, -0.30)}

    def shortcut(name):
        def results(x, manifest):
            summary = pd.DataFrame({"benchmark": "camelyon", "test_set": ["id", "ood"], "apd": apd[name]})
            probe = pd.DataFrame({"test_set": "id", "split": [0, 1], "replicate": 0, "seed": 1, "cramers_v": [0, 1.0],
                                  "best_c": 1.0, "accuracy": [0.9, 0.7]})
            return Results(summary, probe, {})
        return results

    sweep = tmp_path / "sweep"
    for n, (name, x) in enumerate(feats.items()):
        fake_sweep(sweep, cfg, apd_view, {name: x}, tmp_path / "cache", start=n, stage_results=shortcut(name))
    results = SweepResults(sweep, load_manifest=job_manifest)
    (t11,) = tc.croma_table11(results)
    assert list(t11.frame.columns) == ["section", "Metric"] + published_columns(11)
    assert t11.frame[["section", "Metric"]].values.tolist() == [
        [s, m] for s in ("APD_ID", "APD_OOD") for m in ("CRoMa", "RI", "MaRI")]
    ri_view = build_manifest("pathorob_camelyon", camelyon["root"])  # the 60 in-domain rows of the 72
    panel = tc.croma_panel(results).summary.set_index("encoder")
    ids = apd_view["sample_id"].to_numpy()
    rows = pd.Index(ids).get_indexer(ri_view["sample_id"])
    shared = panel["k"].iloc[0]
    for name, x in feats.items():
        ref = evaluate("croma", x[rows], ri_view, k=int(shared), device="cpu")
        assert panel.at[name, "croma"] == pytest.approx(ref.summary["croma"].iloc[0], abs=1e-12)
    rho = spearmanr(panel.loc[list(apd), "croma"], [v[0] for v in apd.values()]).statistic
    assert t11.frame.at[0, "Camelyon"] == pytest.approx(rho)
    assert t11.frame.at[0, "pooled"] == pytest.approx(rho)
    assert np.isnan(t11.frame.at[0, "TCGA-4x4"])


def test_table14_keeps_each_slide_encoder_at_its_own_k(tmp_path):
    panda_table(tmp_path / "panda" / "train.csv", per_cell=4)
    parts = []
    for n, view in enumerate(("binary", "isup")):
        cfg = compose_cfg([f"paths.root={tmp_path}", "experiment=croma_pcabiop", f"dataset.root={tmp_path / 'panda'}",
                           "device=cpu", f"dataset.options.view={view}", "dataset.options.per_cell=4",
                           "stage.params.m=2", "stage.params.k_grid=[1,3]"])
        manifest = build_manifest("pcabiop", tmp_path / "panda", verify_images=False,
                                  **dict(cfg.dataset.options))
        feats = features_for(manifest, {"prism": (1.0, 0.5), "moozy": (0.6, 1.0)}, seed=n)
        fake_sweep(tmp_path / "sweep", cfg, manifest, feats, tmp_path / "cache", start=2 * n)
        parts.append(cfg)
    results = SweepResults(tmp_path / "sweep", load_manifest=job_manifest)
    (t14,) = tc.croma_table14(results)
    assert list(t14.frame.columns) == ["section", "Model"] + published_columns(14)
    assert sorted(set(t14.frame["section"])) == ["(a) Cancer detection", "(b) ISUP grading"]
    assert set(t14.frame["Model"]) == {"PRISM", "MOOZY"}
    jobs = results.summaries("croma")
    panel = tc.croma_panel(results).summary
    assert sorted(panel["k"]) == sorted(jobs["k"])  # k-star: every encoder at its own k*
    assert (panel["conf_knn_bacc_max"] >= panel["conf_knn_bacc"] - 1e-12).all()
    isup = panel[panel["benchmark"] == "pcabiop-isup"]
    assert (isup["n_subsets"] == 15).all()


def test_figure5_and_pareto_planes_from_the_collect_step(camelyon, monkeypatch):
    """croma_figures (listed by every croma_* experiment) writes Figure 5, the mean
    median-CRoMa rank against the mean LTM10 rank of the pathology encoders, and the Pareto planes
    leave the natural-image control out, as the paper's Figures 3, 5, 14 and 15 do."""
    from scipy.stats import rankdata

    from robustbench_fm.methods.croma import plots as cp

    drawn = {}
    real = cp.plot_pareto
    monkeypatch.setattr(cp, "plot_pareto", lambda summary, stem, frontier=None: drawn.setdefault(
        stem.name, summary) is not None and real(summary, stem, frontier))
    results = camelyon["results"]
    assert tc.croma_figures(results) == []
    out = results.root / "figures"
    for suffix in ("png", "pdf"):
        assert (out / f"croma_figure5_mean_ranks.{suffix}").stat().st_size > 1000
    ranks = pd.read_csv(out / "croma_figure5_mean_ranks.csv").set_index("encoder")
    summary = tc.croma_panel(results).summary
    pathology = summary[~summary["encoder"].isin(tc.CONTROLS)].set_index("encoder")
    assert sorted(ranks.index) == sorted(pathology.index) and "dinov2_b" not in ranks.index
    want_croma = dict(zip(pathology.index, rankdata(-pathology["croma"].to_numpy())))
    want_ltm = dict(zip(pathology.index, rankdata(-pathology["ltm"].to_numpy())))
    for name in pathology.index:  # one tile benchmark in this sweep: the mean rank is its rank
        assert ranks.at[name, "mean_croma_rank"] == want_croma[name]
        assert ranks.at[name, "mean_ltm_rank"] == want_ltm[name]
        assert ranks.at[name, "Model"] == tc.label(name)
    pts = ranks[["mean_croma_rank", "mean_ltm_rank"]].to_numpy()
    dominated = [any((q <= p).all() and (q < p).any() for q in pts) for p in pts]
    assert ranks["pareto"].tolist() == [not d for d in dominated]
    plane = drawn["pathorob_camelyon_pareto"]
    assert "DINOv2-B" not in set(plane["encoder"]) and len(plane) == 3
