"""experiment=spar_demo end to end as a user runs it: phantoms, shallow random backbones and the
planted oracle, every SPAR table written with the published row labels and column headers, every
probe with test items in both cohorts, the oracle near-perfect and random backbones at baseline."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from robustbench_fm.methods.spar.samples import L3_PROBES

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[3]
#: Level 3 probes the oracle answers near-perfectly (>= 0.9) in the demo's budget. Relative position
#: and distance are asserted >= 0.85 (0.89-0.99 and 0.90-0.94 over our runs: their heads must pick
#: two organs' x ranks, or two organ pairs' distances, out of the planted tokens by the question;
#: distance with the demo's 32 questions per slice, 0.71-0.80 with one), and distance must beat
#: what the question alone allows: a random backbone's heads reach 0.74-0.83 on distance from the
#: organ pairs asked (canonical anatomy, spar.md Section 4: "distance and organ size hold").
ORACLE_PROBES = ("orientation", "kidney_symmetry", "liver_size", "tumour_count")


def _published(n: int) -> pd.DataFrame:
    from robustbench_fm.report import published

    return published.table("spar", n)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("spar_demo")
    proc = subprocess.run([sys.executable, "-m", "robustbench_fm", "experiment=spar_demo", f"paths.root={out}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return sorted((out / "outputs" / "runs").glob("*/*"))[-1]


def test_every_table_is_written_in_the_published_layout(run):
    tables = {n: pd.read_csv(run / "tables" / f"spar_table{n}.csv") for n in range(1, 6)}
    for n, table in tables.items():
        published = _published(n)
        ours = set(table.columns) - {"Cohort", "Section", "Model"}
        assert ours <= set(published["column"]), (n, ours - set(published["column"]))
    for n, table in tables.items():  # every cell of every model row filled (sd columns: one seed, none)
        models = table[~table["Model"].isin(["Chance", "Majority class"])]
        values = models.drop(columns=[c for c in models.columns if c in ("Cohort", "Section", "Model")
                                      or c.endswith("_sd")])
        assert not values.isna().any().any(), (n, values.columns[values.isna().any()].tolist())
    t1 = tables[1]
    want = ["CNN-MLP", "CNN-Trans", "ViT-MLP", "ViT-Trans", "ViT-Combined", "Oracle-MLP", "Oracle-Trans",
            "random_vit_s-MLP", "random_vit_s-Trans", "Chance", "Majority class"]
    for cohort in ("spar_phantom_word (in domain)", "TotalSegmentator (zero-shot)"):
        part = t1[t1["Cohort"] == cohort]
        assert part["Model"].tolist() == want
        assert set(want[:5]) <= set(_published(1)["row"])
        chance = part.set_index("Model").loc["Chance"]
        assert chance["RelPos"] == 0.5 and chance["Orient"] == 0.2
        majority = part.set_index("Model").loc["Majority class"]  # beside chance: >= it, equal when balanced
        both = chance[["RelPos", "Orient", "Symm"]].astype(float).dropna().index
        assert (majority[both].astype(float) >= chance[both].astype(float) - 1e-12).all()
        assert majority["RelPos"] == 0.5
        models = part[~part["Model"].isin(["Chance", "Majority class"])]
        assert (models["MED"] > 0).all() and models["Perm"].between(0, 1).all()
    assert t1["Section"].iloc[0] == "spar_phantom_word (in domain) / Trained from scratch"
    assert tables[3]["Model"].tolist()[:5] == ["CNN-MLP", "CNN-Trans", "ViT-MLP", "ViT-Trans", "ViT-Comb"]
    assert list(tables[3].columns[2:]) == list(_published(3)["column"].drop_duplicates())
    assert tables[4].drop(columns=["Section", "Model"]).stack().dropna().between(0, 1).all()
    assert tables[5]["Model"].tolist()[-2:] == ["Chance", "Majority class"]
    assert tables[2]["Model"].str.endswith(("(best enc.)", "(worst enc.)")).sum() == 2


def test_results_per_finding_and_summary_columns(run):
    root = run / "results"
    for encoder in ("resnet50_in1k", "vit_b32_in1k", "random_vit_s"):
        spar = root / encoder / "spar_phantom_word" / "spar"
        assert {"localization", "permutation", "relative_position", "orientation", "macro"} <= \
            {p.name for p in spar.iterdir()}
    loc = pd.read_parquet(root / "vit_b32_in1k" / "spar_phantom_word" / "spar" / "localization" / "summary.parquet")
    assert set(loc["label"]) == {"ViT-MLP", "ViT-Trans", "ViT-Combined"}
    assert set(loc["eval_dataset"]) == {"spar_phantom_word", "totalsegmentator"}
    overall = loc[loc["organ"] == "all"]
    assert len(overall) == 3 * 2 and (overall["epochs"] == 2).all() and overall["sdr"].between(0, 1).all()
    summary = pd.read_parquet(run / "summary.parquet")
    assert {"encoder", "dataset", "finding"} <= set(summary.columns)


def _samples(run, dataset):
    from robustbench_fm.methods.spar.samples import load_samples

    folders = sorted((run.parents[2] / "cache" / "features" / "spar").glob(f"{dataset}-*"))
    assert len(folders) == 1, folders
    return load_samples(folders[0])


def _overall(run, encoder, finding, cohort="spar_phantom_word"):
    part = pd.read_parquet(run / "results" / encoder / "spar_phantom_word" / "spar" / finding / "summary.parquet")
    return part[(part["organ"] == "all") & (part["eval_dataset"] == cohort)].set_index("label")


def _mean_centroid_med(s) -> float:
    """MED (px, native slice frame like the reported MED) of predicting each organ's mean training
    centroid: what a backbone that only knows which organ a tile shows can reach, since cropping
    removes the tile's position."""
    from robustbench_fm.methods.spar.metrics import native_frame

    split = s.table["split"].to_numpy()
    native = native_frame(s.table["sample_id"].to_numpy(), s.slice_table)  # (W, H) per tile set
    present = np.asarray(s.present)
    px = np.nan_to_num(np.asarray(s.centroids, float)) * native[:, None, :]
    tr, te = split == "train", split == "test"
    mean = np.nansum(np.where(present[tr][..., None], px[tr], 0), 0) / np.maximum(present[tr].sum(0), 1)[:, None]
    return float(np.linalg.norm(px[te] - mean[None], axis=-1)[present[te]].mean())


def test_every_probe_has_test_items_in_both_cohorts(run):
    word, ts = _samples(run, "spar_phantom_word"), _samples(run, "spar_phantom_totalsegmentator")
    test = word.questions[word.questions["split"] == "test"]
    assert set(test["probe"]) == set(L3_PROBES)
    assert (test.groupby("probe").size() >= 3).all(), test.groupby("probe").size()
    # zero-shot: every sample of the cohort; no LiTS there, so no counting (spar.md Table 5 has none)
    assert set(ts.questions["probe"]) == set(L3_PROBES) - {"tumour_count"}
    for s in (word, ts):
        assert (s.table["split"] == "test").sum() >= 10


def test_the_planted_oracle_is_near_perfect_and_random_backbones_stay_at_their_baselines(run):
    """The calibration (issue 20): heads on the oracle's mask-derived tokens reach near-perfect
    Levels 1-3 (MED below half the mean-centroid baseline, itself 3.2 px in the 96-px native
    phantom frame; permutation and Level 3 accuracies >= 0.9; see ORACLE_PROBES), while an
    untrained ViT-S stays at what organ identity alone allows: the mean-centroid MED at Level 1,
    no fully right permutation, chance on the balanced kidney-symmetry probe."""
    baseline = _mean_centroid_med(_samples(run, "spar_phantom_word"))
    loc = _overall(run, "spar_oracle", "localization")
    perm = _overall(run, "spar_oracle", "permutation")
    for label in ("Oracle-MLP", "Oracle-Trans"):
        assert loc.loc[label, "med"] < min(3.0, baseline / 2), (label, loc.loc[label, "med"], baseline)
        assert perm.loc[label, "perm_acc"] >= 0.9, (label, perm.loc[label, "perm_acc"])
        for probe in ORACLE_PROBES:
            acc = _overall(run, "spar_oracle", probe).loc[label, "accuracy"]
            assert acc >= 0.9, (label, probe, acc)
        assert _overall(run, "spar_oracle", "relative_position").loc[label, "accuracy"] >= 0.85
        for cohort in ("spar_phantom_word", "totalsegmentator"):
            dist = _overall(run, "spar_oracle", "distance_compare", cohort).loc[label, "accuracy"]
            prior = _overall(run, "random_vit_s", "distance_compare", cohort)["accuracy"].max()
            assert dist >= 0.85 and dist >= prior + 0.05, (label, cohort, dist, prior)
    rand = _overall(run, "random_vit_s", "localization")
    assert (rand["med"] > 0.8 * baseline).all(), (rand["med"], baseline)
    assert (_overall(run, "random_vit_s", "permutation")["perm_acc"] < 0.1).all()
    symm = _overall(run, "random_vit_s", "kidney_symmetry")
    assert (symm["accuracy"] <= symm["chance"] + 0.25).all()
