"""experiment=spar_demo end to end as a user runs it: phantoms, shallow random backbones and the
planted oracle, every SPAR table written with the published row labels and column headers, every
probe with test items in both cohorts, the oracle near-perfect and random backbones at baseline."""
from pathlib import Path

import cli_process
import numpy as np
import pandas as pd
import pytest

from robustbench_fm.methods.spar.samples import L3_PROBES

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[3]
#: Level 3 probes the oracle answers near-perfectly (>= 0.9 in domain) in the demo's budget; distance
#: is held to the question-only prior instead (test_the_planted_oracle_is_near_perfect_...).
ORACLE_PROBES = ("relative_position", "orientation", "kidney_symmetry", "liver_size", "tumour_count")


def _published(n: int) -> pd.DataFrame:
    from robustbench_fm.paper import published

    return published.table("spar", n)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("spar_demo")
    proc = cli_process.run(["-m", "robustbench_fm", "experiment=spar_demo", f"paths.root={out}"],
                           cwd=ROOT, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return sorted((out / "outputs" / "runs").glob("*/*"))[-1]


def test_every_table_is_written_in_the_published_layout(run):
    tables = {n: pd.read_csv(run / "tables" / f"spar_table{n}.csv") for n in range(1, 6)}
    for n, table in tables.items():  # ours beside the published columns: the native-frame MED (issue 29 item 7)
        published = _published(n)
        ours = set(table.columns) - {"Cohort", "Section", "Model", "Frame", "MED (native)"}
        assert ours <= set(published["column"]), (n, ours - set(published["column"]))
    for n, table in tables.items():  # every cell of every model row filled (sd columns: one seed, none)
        models = table[~table["Model"].isin(["Chance", "Majority class", "Question-only prior", "Canonical recall",
                                             "n="])]
        values = models.drop(columns=[c for c in models.columns if c in ("Cohort", "Section", "Model")
                                      or c.endswith("_sd")])
        assert not values.isna().any().any(), (n, values.columns[values.isna().any()].tolist())
    t1 = tables[1]
    want = ["CNN-MLP", "CNN-Trans", "ViT-MLP", "ViT-Trans", "ViT-Combined", "Canonical-MLP", "Canonical-Trans",
            "Oracle-MLP", "Oracle-Trans", "random_vit_s-MLP", "random_vit_s-Trans", "Chance", "Majority class",
            "Question-only prior", "Canonical recall"]
    for cohort in ("spar_phantom_word (in domain)", "TotalSegmentator (zero-shot)"):
        part = t1[t1["Cohort"] == cohort]
        assert part["Model"].tolist() == want
        assert set(want[:5]) <= set(_published(1)["row"])
        chance = part.set_index("Model").loc["Chance"]
        assert chance["RelPos"] == 0.5 and chance["Orient"] == 0.2
        majority = part.set_index("Model").loc["Majority class"]  # the training majority: chance on balanced probes
        assert majority["RelPos"] == 0.5 and float(majority["Symm"]) == pytest.approx(1 / 3)
        assert abs(float(majority["Orient"]) - 0.2) < 0.05
        models = part[~part["Model"].isin(["Chance", "Majority class", "Question-only prior", "Canonical recall"])]
        assert (models["MED"] > 0).all() and models["Perm"].between(0, 1).all()
        assert (models["MED (native)"] < models["MED"]).all()            # 96 px phantom slices, 224 frame
    assert t1["Section"].iloc[0] == "spar_phantom_word (in domain) / Trained from scratch"
    assert tables[3]["Model"].tolist()[:5] == ["CNN-MLP", "CNN-Trans", "ViT-MLP", "ViT-Trans", "ViT-Comb"]
    assert list(tables[3].columns[3:]) == list(_published(3)["column"].drop_duplicates())
    assert tables[3]["Frame"].value_counts().to_dict() == {"224 px": 12, "native px": 12}
    assert tables[4].drop(columns=["Section", "Model"]).stack().dropna().between(0, 1).all()
    assert tables[5]["Model"].tolist()[-4:] == ["Chance", "Majority class", "Question-only prior", "Canonical recall"]
    assert tables[2]["Model"].str.endswith(("(best enc.)", "(worst enc.)")).sum() == 2
    assert tables[2]["Model"].iloc[0] == "n=" and tables[2]["Dist"].iloc[0] >= 100


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


def test_every_in_domain_test_set_gives_an_interval_within_a_tenth(run):
    """Issue 42 item 6: each probe's in-domain accuracy rests on enough test items that its 95%
    interval is at most +-0.1 whatever the accuracy: the normal interval's half-width at p = 0.5,
    1.96 * sqrt(0.25 / n), needs n >= 97. Kidney symmetry (9 items before: +-0.33) and tumour
    counting (11: +-0.30) get there through the demo's test-only phantoms (dataset.options.extra_test)
    and LiTS volumes (n_lits), so the interval of each probe's accuracy is what the half-width says."""
    from scipy.stats import norm

    word = _samples(run, "spar_phantom_word")
    n = word.questions[word.questions["split"] == "test"].groupby("probe").size()
    half = norm.ppf(0.975) * np.sqrt(0.25 / n)
    assert set(n.index) == set(L3_PROBES) and (half <= 0.1).all(), half.to_dict()
    assert n["kidney_symmetry"] >= 97 and n["tumour_count"] >= 97, n.to_dict()
    symm = word.questions[(word.questions["split"] == "test") & (word.questions["probe"] == "kidney_symmetry")]
    assert symm["label"].value_counts().nunique() == 1  # still balanced over its three classes
    for probe in ("kidney_symmetry", "tumour_count"):  # the items the accuracy is computed on are those
        scored = _overall(run, "spar_oracle", probe)
        assert (scored["n"] == n[probe]).all(), (probe, scored["n"].tolist(), n[probe])


def test_every_zero_shot_probe_gives_an_interval_within_a_tenth(run):
    """Issue 42 item 6, zero-shot: every probe asked of the TotalSegmentator-layout cohort (all its
    questions are scored, no counting there) rests on n >= 97 items, so its 95% interval is at most
    +-0.1 whatever the accuracy. Kidney symmetry had 24 items (+-0.20) on the 10 subjects of before;
    the cohort's 30 test-only subjects (transfer options.extra_test) bring it to 99, balanced over its
    three classes within each split as in domain (hence overall), and the oracle's zero-shot
    accuracies are computed on exactly those items."""
    from scipy.stats import norm

    ts = _samples(run, "spar_phantom_totalsegmentator")
    n = ts.questions.groupby("probe").size()
    half = norm.ppf(0.975) * np.sqrt(0.25 / n)
    assert set(n.index) == set(L3_PROBES) - {"tumour_count"} and (half <= 0.1).all(), half.to_dict()
    assert n["kidney_symmetry"] >= 97, n.to_dict()
    symm = ts.questions[ts.questions["probe"] == "kidney_symmetry"]
    assert (symm.groupby("split")["label"].value_counts().unstack().nunique(axis=1) == 1).all()
    assert symm["label"].value_counts().nunique() == 1
    for probe in n.index:
        scored = _overall(run, "spar_oracle", probe, "totalsegmentator")
        assert (scored["n"] == n[probe]).all(), (probe, scored["n"].tolist(), n[probe])


def _distance_prior(train: pd.DataFrame, asked: pd.DataFrame) -> float:
    """Accuracy on ``asked`` of the most frequent training label of the same pair of organ pairs
    (either order: a swapped question votes with its label flipped; ties: 0 in the order with the
    alphabetically first pair ahead), else the training majority: counted here by hand."""
    def canon(a, b, c, d):
        p, q = tuple(sorted((a, b))), tuple(sorted((c, d)))
        return (min(p, q), max(p, q)), p > q

    cols = ["organ_a", "organ_b", "organ_c", "organ_d", "label"]
    votes: dict = {}
    for *organs, label in train[cols].itertuples(index=False):
        key, swapped = canon(*organs)
        votes.setdefault(key, []).append(1 - label if swapped else label)
    counts = train["label"].value_counts()
    fallback = int(counts[counts == counts.max()].index.min())
    right = []
    for *organs, label in asked[cols].itertuples(index=False):
        key, swapped = canon(*organs)
        if key in votes:
            v = np.bincount(votes[key], minlength=2)
            guess = int(v.argmax())
            guess = 1 - guess if swapped else guess
        else:
            guess = fallback
        right.append(guess == label)
    return float(np.mean(right))


def test_reference_rows_come_from_the_training_labels(run):
    """Issue 29 items 8-9: the Majority class and Question-only prior the run records equal an
    independent count over the cached samples' TRAINING questions, in domain and zero-shot. The
    training majority of liver size is not the test one (0.18 in domain, where the test labels'
    own majority share was 0.82), and the distance prior is what the organ pairs asked allow
    (0.893 in domain, 0.916 zero-shot: test_the_docs_figures_are_the_demo_s)."""
    word, ts = _samples(run, "spar_phantom_word"), _samples(run, "spar_phantom_totalsegmentator")
    train = word.questions[word.questions["split"] == "train"]
    for cohort, s in (("spar_phantom_word", word), ("totalsegmentator", ts)):
        q = s.questions[s.questions["split"] == "test"] if cohort == "spar_phantom_word" else s.questions
        size_train = train.loc[train["probe"] == "liver_size", "label"].value_counts().idxmax()
        size = q[q["probe"] == "liver_size"]
        assert np.allclose(_overall(run, "random_vit_s", "liver_size", cohort)["majority"],
                           (size["label"] == size_train).mean())
        prior = _distance_prior(train[train["probe"] == "distance_compare"], q[q["probe"] == "distance_compare"])
        recorded = _overall(run, "random_vit_s", "distance_compare", cohort)["prior"]
        assert np.allclose(recorded, prior) and 0.85 <= prior <= 0.99, (cohort, recorded, prior)


def test_the_planted_oracle_is_near_perfect_and_random_backbones_stay_at_their_baselines(run):
    """The calibration (issue 20): heads on the oracle's mask-derived tokens reach near-perfect
    Levels 1-3 (MED below half the mean-centroid baseline, itself 3.2 px in the 96-px native
    phantom frame; permutation and Level 3 accuracies >= 0.9; see ORACLE_PROBES), while an
    untrained ViT-S stays near what organ identity alone allows: the mean-centroid MED at Level 1,
    few fully right permutations (below 0.1; random_vit_s-Trans 0.093 in domain), chance on the
    balanced kidney-symmetry probe.

    Distance (issue 29 item 8): the oracle must beat the question-only prior (the tables' row: a
    lookup of the pair of organ pairs in the training labels, 0.893 in domain and 0.916 zero-shot
    here), by answering at least half of the questions the prior gets wrong: accuracy >= prior +
    (1 - prior) / 2 (0.988-0.996: test_the_docs_figures_are_the_demo_s). Before the oracle read the question
    (models.AskedTokens) its heads scored 0.88-0.91 against a prior of 0.92-0.94 (32 questions per
    slice), and 0.48 of the questions the prior gets wrong: they had learned the lookup of the
    question, not the read of the slice."""
    baseline = _mean_centroid_med(_samples(run, "spar_phantom_word"))
    loc = _overall(run, "spar_oracle", "localization")
    perm = _overall(run, "spar_oracle", "permutation")
    for label in ("Oracle-MLP", "Oracle-Trans"):
        assert loc.loc[label, "med_native"] < min(3.0, baseline / 2), (label, loc.loc[label, "med_native"], baseline)
        assert perm.loc[label, "perm_acc"] >= 0.9, (label, perm.loc[label, "perm_acc"])
        for probe in ORACLE_PROBES:
            acc = _overall(run, "spar_oracle", probe).loc[label, "accuracy"]
            assert acc >= 0.9, (label, probe, acc)
        for cohort in ("spar_phantom_word", "totalsegmentator"):
            row = _overall(run, "spar_oracle", "distance_compare", cohort).loc[label]
            dist, prior = float(row["accuracy"]), float(row["prior"])
            assert 0.85 <= prior <= 0.99 and dist >= prior + (1 - prior) / 2, (label, cohort, dist, prior)
    rand = _overall(run, "random_vit_s", "localization")
    assert (rand["med_native"] > 0.8 * baseline).all(), (rand["med_native"], baseline)
    assert (_overall(run, "random_vit_s", "permutation")["perm_acc"] < 0.1).all()
    symm = _overall(run, "random_vit_s", "kidney_symmetry")
    assert (symm["accuracy"] <= symm["chance"] + 0.25).all()


def test_the_canonical_backbone_recalls_anatomy_in_domain_and_falls_to_chance_zero_shot(run):
    """Issue 42 item 6, the paper's reading ("what we measured in domain was recall of canonical
    anatomy"): spar_canonical knows organ identity, the training cohort's usual anatomy and the
    orientation of in-domain images, nothing of the slice. On relative position it scores high in
    domain (near the Canonical recall row, 0.933 on these samples) and at chance zero-shot, where
    both forms of a question look alike to it, while the oracle holds in both cohorts. Its MED
    stays near the mean-position row (6.78 px on the demo's 366 test tile sets), never near the oracle's."""
    t1 = pd.read_csv(run / "tables" / "spar_table1.csv")
    for label in ("Canonical-MLP", "Canonical-Trans"):
        own = _overall(run, "spar_canonical", "relative_position").loc[label]
        zero = _overall(run, "spar_canonical", "relative_position", "totalsegmentator").loc[label]
        assert own["accuracy"] >= 0.85 and own["accuracy"] >= own["canonical"] - 0.05, (label, own["accuracy"])
        assert abs(zero["accuracy"] - 0.5) <= 0.05, (label, zero["accuracy"])
        oracle = _overall(run, "spar_oracle", "relative_position", "totalsegmentator").loc[label.replace(
            "Canonical", "Oracle")]
        assert oracle["accuracy"] >= 0.9, (label, oracle["accuracy"])
        loc = _overall(run, "spar_canonical", "localization").loc[label]
        assert loc["med"] >= 0.8 * loc["ref_med"], (label, loc["med"], loc["ref_med"])
    canonical = t1[t1["Model"] == "Canonical recall"].set_index("Cohort")
    assert canonical.loc["spar_phantom_word (in domain)", "RelPos"] >= 0.85
    assert canonical.loc["spar_phantom_word (in domain)", "MED"] == pytest.approx(6.78, abs=0.01)


def test_encoders_are_compared_paired_on_the_same_questions(run):
    """Issue 46: every probe's accuracy, Level 1's MED and Level 2's patch accuracy of the demo's encoders
    are compared on the same test questions and tile slots, resampling volumes, and each estimate is the
    stage's own summary value (else comparisons_notes.txt would say which was not compared)."""
    pairs = pd.read_csv(run / "comparisons.csv", keep_default_na=False, na_values=[""])
    assert {"accuracy", "med", "patch_acc"} <= set(pairs["metric"])
    notes = (run / "comparisons_notes.txt").read_text().splitlines() if (run / "comparisons_notes.txt").exists() \
        else []
    # nothing left out; only the demo's tumour counts (one LiTS volume) come without an interval
    assert all("tumour_count" in line and "no interval or p-value" in line for line in notes), notes
    few = pairs["n_clusters"] < 5
    assert (pairs.loc[few, "finding"] == "tumour_count").all() and pairs.loc[~few, "p_adj"].notna().all()
    ranking = pd.read_csv(run / "ranking.csv", keep_default_na=False, na_values=[""])
    # issue 58 item 2: MED is a distance, ranked lower-is-better; where the oracle leads on accuracy it leads on MED
    med = ranking[ranking["metric"] == "med"]
    assert not med.empty and (med["better_is"] == "lower").all() and (pairs.loc[pairs["metric"] == "med", "better_is"]
                                                                      == "lower").all()
    keys = ["dataset", "setting", "row"]  # one head, mode, cohort and seed: MED is Level 1's, accuracy Level 3's
    accuracy = ranking[ranking["metric"] == "accuracy"]
    first_on_accuracy = accuracy[(accuracy["encoder"] == "spar_oracle") & (accuracy["rank"] == 1)][keys]
    oracle_med = med[med["encoder"] == "spar_oracle"].merge(first_on_accuracy.drop_duplicates(), on=keys)
    assert not oracle_med.empty and (oracle_med["rank"] == 1).all(), oracle_med
    relpos = ranking[(ranking["metric"] == "accuracy") & (ranking["finding"] == "relative_position")]
    assert not relpos.empty and set(relpos["best"]) <= {"spar_oracle", "spar_canonical"}
    assert "## Which encoder" in (run / "report.md").read_text()


#: the in-domain / zero-shot cohorts as Table 1 names them, and the random-weight backbones' rows
COHORTS = {"spar_phantom_word": "spar_phantom_word (in domain)", "totalsegmentator": "TotalSegmentator (zero-shot)"}
RANDOM_ROWS = ("CNN-MLP", "CNN-Trans", "ViT-MLP", "ViT-Trans", "ViT-Combined", "random_vit_s-MLP", "random_vit_s-Trans")


def _varying_questions(s) -> pd.DataFrame:
    """The questions of cached samples ``s`` asked under ``distance_rule="varying"`` (the paper's,
    the default), as build_samples asks them (test_spar_probes.py: test_the_distance_rule_is_...)."""
    from robustbench_fm.methods.spar import probes
    from robustbench_fm.methods.spar.samples import slice_frame_mm

    st = s.slice_table
    return probes.make_questions(st, s.slice_present, s.slice_centroids, s.slice_areas,
                                 (st["height"] * st["width"]).to_numpy(), s.slice_tumours, np.random.default_rng(42),
                                 size=224, frame_mm=slice_frame_mm(st), distance_questions=8, distance_rule="varying")


def demo_figures(run: Path, cache: Path | None = None) -> dict[str, float]:
    """Every figure docs/methods/spar.md quotes from the demo (its "Where the demo's figures come
    from"), from the run folder's tables and summary and the cached samples (under ``cache``, the
    run's ``paths.output_root/cache`` by default)."""
    from robustbench_fm.methods.spar import metrics
    from robustbench_fm.methods.spar.samples import load_samples

    cache = run.parents[2] / "cache" if cache is None else Path(cache)

    def samples(dataset):
        folders = sorted((cache / "features" / "spar").glob(f"{dataset}-*"))
        assert len(folders) == 1, folders
        return load_samples(folders[0])

    t1 = pd.read_csv(run / "tables" / "spar_table1.csv").set_index(["Cohort", "Model"])
    t2 = pd.read_csv(run / "tables" / "spar_table2.csv").set_index("Model")
    t5 = pd.read_csv(run / "tables" / "spar_table5.csv").set_index("Model")
    summary = pd.read_parquet(run / "summary.parquet")
    summary = summary[summary["organ"] == "all"]

    def acc(finding, cohort, labels):
        part = summary[(summary["finding"] == finding) & (summary["eval_dataset"] == cohort)]
        return part.set_index("label").loc[list(labels), ["accuracy", "prior"]]

    out, word = {}, COHORTS["spar_phantom_word"]
    for cohort, prior in (("spar_phantom_word", t2.loc["Question-only prior", "Dist"]),
                          ("totalsegmentator", t5.loc["Question-only prior", "Dist"])):
        out[f"prior random {cohort}"] = prior
        oracle = acc("distance_compare", cohort, ("Oracle-MLP", "Oracle-Trans"))
        out[f"oracle dist min {cohort}"], out[f"oracle dist max {cohort}"] = oracle["accuracy"].min(), \
            oracle["accuracy"].max()
        out[f"oracle share of the prior's misses {cohort}"] = ((oracle["accuracy"] - oracle["prior"])
                                                                / (1 - oracle["prior"])).min()
        rand = acc("distance_compare", cohort, RANDOM_ROWS)["accuracy"]
        out[f"random dist min {cohort}"], out[f"random dist max {cohort}"] = rand.min(), rand.max()
        out[f"canonical-MLP dist {cohort}"] = acc("distance_compare", cohort, ["Canonical-MLP"])["accuracy"].iloc[0]
        out[f"canonical-Trans perm {cohort}"] = t1.loc[(COHORTS[cohort], "Canonical-Trans"), "Perm"]
        out[f"recall perm {cohort}"] = t1.loc[(COHORTS[cohort], "Canonical recall"), "Perm"]
    out["random perm max"] = max(t1.loc[(word, m), "Perm"] for m in RANDOM_ROWS)
    out["random symm max"] = max(t1.loc[(word, m), "Symm"] for m in RANDOM_ROWS)
    out["random MED min"] = min(t1.loc[(word, m), "MED"] for m in RANDOM_ROWS)
    out["recall MED"] = t1.loc[(word, "Canonical recall"), "MED"]
    out["recall relpos"] = t1.loc[(word, "Canonical recall"), "RelPos"]
    relpos = [t1.loc[(word, m), "RelPos"] for m in ("Canonical-MLP", "Canonical-Trans")]
    out["canonical relpos min"], out["canonical relpos max"] = min(relpos), max(relpos)
    # the questions: under the demo's random rule, and the same slices asked under varying
    w, ts = samples("spar_phantom_word"), samples("spar_phantom_totalsegmentator")
    for rule, qw, qt in (("random", w.questions, ts.questions), ("varying", _varying_questions(w),
                                                                  _varying_questions(ts))):
        dw, dt = (q[q["probe"] == "distance_compare"] for q in (qw, qt))
        train, test = dw[dw["split"] == "train"], dw[dw["split"] == "test"]
        out[f"train questions {rule}"] = len(train)
        for cohort, asked in (("spar_phantom_word", test), ("totalsegmentator", dt)):
            out[f"test questions {rule} {cohort}"] = len(asked)
            right = metrics.reference_answers(train, asked)[1] == asked["label"].to_numpy()
            out[f"prior {rule} {cohort} (recounted)"] = right.mean()
            if rule == "random" and cohort == "spar_phantom_word":
                seen = set(k for k, _ in metrics._keys(train))
                new = np.array([k not in seen for k, _ in metrics._keys(asked)])
                out["unseen share"], out["prior on unseen"] = new.mean(), right[new].mean()
    return out


#: (figure, how docs/methods/spar.md prints it, tolerance): 0 where the figure comes from the samples
#: and the training labels alone (no training: the same on every host), else the trained heads' spread
#: between hosts; each printed figure must be in the page
DOC_FIGURES = [
    ("prior varying spar_phantom_word (recounted)", "0.502", 0),
    ("prior varying totalsegmentator (recounted)", "0.497", 0),
    ("test questions varying spar_phantom_word", "1,352", 0), ("test questions varying totalsegmentator", "1,240", 0),
    ("train questions varying", "586", 0), ("train questions random", "1,240", 0),
    ("prior random spar_phantom_word", "0.893", 0), ("prior random totalsegmentator", "0.916", 0),
    ("prior random spar_phantom_word (recounted)", "0.893", 0), ("unseen share", "0.135", 0),
    ("prior on unseen", "0.483", 0), ("recall perm spar_phantom_word", "0.374", 0),
    ("recall perm totalsegmentator", "0.370", 0), ("recall MED", "6.780", 0), ("recall relpos", "0.933", 0),
    ("oracle dist min spar_phantom_word", "0.988", 0.03), ("oracle dist max spar_phantom_word", "0.996", 0.03),
    ("oracle share of the prior's misses spar_phantom_word", "0.89", 0.05),
    ("random dist min spar_phantom_word", "0.632", 0.05), ("random dist max spar_phantom_word", "0.801", 0.05),
    ("random dist min totalsegmentator", "0.641", 0.05), ("random dist max totalsegmentator", "0.808", 0.05),
    ("random perm max", "0.093", 0.05), ("random symm max", "0.333", 0.05), ("random MED min", "7.372", 1.0),
    ("canonical relpos min", "0.929", 0.03), ("canonical relpos max", "0.930", 0.03),
    ("canonical-Trans perm spar_phantom_word", "0.475", 0.1), ("canonical-Trans perm totalsegmentator", "0.489", 0.1),
    ("canonical-MLP dist spar_phantom_word", "0.953", 0.03), ("canonical-MLP dist totalsegmentator", "0.954", 0.03),
]


def check_doc_figures(figures: dict[str, float], text: str) -> None:
    """Each of :data:`DOC_FIGURES` is printed in ``text`` and is the run's (within its tolerance)."""
    text = " ".join(text.split())
    for name, printed, tol in DOC_FIGURES:
        value = float(figures[name])
        shown = f"{value:,.0f}" if "," in printed or printed.isdigit() else f"{value:.{len(printed.split('.')[1])}f}"
        print(f"{name}: {shown} (the page: {printed})")
        assert printed in text, (name, printed)
        assert shown == printed if tol == 0 else abs(value - float(printed.replace(",", ""))) <= tol, \
            (name, value, printed)


def test_the_docs_figures_are_the_demo_s(run):
    """Issue 54 item 18: the figures docs/methods/spar.md (and methods/spar/probes.py) quote from the
    demo are this run's: the question-only prior under varying 0.502 / 0.497 (it was quoted as
    0.470 / 0.493), the random rows' distance from 0.632 (quoted as 0.74-0.83), random_vit_s-Trans's
    0.093 fully right permutations (quoted as none), and the canonical heads beating the recall row
    on Perm and distance (quoted as "no further"). ``-s`` prints each figure."""
    figures = demo_figures(run)
    page = (ROOT / "docs" / "methods" / "spar.md").read_text()
    probes_doc = (ROOT / "robustbench_fm" / "methods" / "spar" / "probes.py").read_text()
    check_doc_figures(figures, page)
    for printed in ("0.502", "0.497", "1,352 and 1,240", "1,240 against 586", "0.893", "0.916"):
        assert printed in " ".join(probes_doc.split()), printed
    # what the text says of them, whatever the host
    word, zero = "spar_phantom_word", "totalsegmentator"
    assert figures["random MED min"] > figures["recall MED"] and figures["random perm max"] > 0
    assert figures["random perm max"] < figures[f"recall perm {word}"]
    for cohort in (word, zero):
        assert 0.5 < figures[f"random dist max {cohort}"] < figures[f"prior random {cohort}"]
        assert figures[f"canonical-Trans perm {cohort}"] > figures[f"recall perm {cohort}"]
        assert figures[f"canonical-MLP dist {cohort}"] > figures[f"prior random {cohort}"]
