"""CANDOR table builders on small synthetic sweep folders: published headers and row labels,
pooling over sites and the severity weights, ΔJ/Sig. rows, ablation bookkeeping."""
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

import robustbench_fm.paper
from robustbench_fm.core.stats import bh_adjust
from robustbench_fm.core.tables import SweepResults
from robustbench_fm.methods.candor.sets import overlap_test
from robustbench_fm.methods.candor.tables import (
    SEVERITY_WEIGHTS,
    candor_ablation,
    candor_associations,
    candor_calibration,
    candor_chest_overlap,
    candor_table2,
    candor_table3,
    chest_retention,
)

PUBLISHED = Path(robustbench_fm.paper.__file__).parent / "published"
FINDINGS = ["pneumothorax", "edema", "fracture", "cardiomegaly", "atelectasis", "pleural_other"]  # weights 3, 2, 1
CHEST = ["rad_dino", "densenet121_xrv", "dinov3_s", "random_vit_l"]


def published_table(number: int) -> pd.DataFrame:
    return pd.read_csv(PUBLISHED / f"candor_v4_table{number}.csv", dtype={"value": str})


def published_columns(number: int, row: str | None = None) -> list[str]:
    """The value columns in printed order (``row``: a row that has every column)."""
    pub = published_table(number)
    return list(dict.fromkeys(pub.loc[pub["row"] == row, "column"] if row else pub["column"]))


def write_result(root: Path, job: str, stage: str, encoder: str, dataset: str, finding: str,
                 summary: dict | list, per_sample: pd.DataFrame | None = None, config: dict | None = None):
    """One results folder as pipeline.job._stage_results writes it, plus the job's config.yaml."""
    job_dir = root / job
    job_dir.mkdir(parents=True, exist_ok=True)
    if not (job_dir / "config.yaml").exists():
        (job_dir / "config.yaml").write_text(yaml.safe_dump(config or {"stage": {"name": stage, "params": {}}}))
    out = job_dir / "results" / encoder / dataset / stage / finding
    out.mkdir(parents=True, exist_ok=True)
    rows = summary if isinstance(summary, list) else [summary]
    pd.DataFrame([{"encoder": encoder, "dataset": dataset, "finding": finding, **r} for r in rows]) \
        .to_parquet(out / "summary.parquet")
    if per_sample is not None:
        per_sample.assign(finding=finding).to_parquet(out / "per_sample.parquet")


def candor_row(d, d_all, auroc, n_queries, n_pos=None, n_neg=100, group="__pooled__"):
    return dict(acq_group=group, n_queries=n_queries, n_pos=n_pos or n_queries, n_neg=n_neg, d=d,
                d_ci_low=d - 0.05, d_ci_high=d + 0.05, d_all=d_all, margin_auroc=auroc)


def test_table2_has_the_published_layout_and_pools_sites_then_severity(tmp_path):
    rng = np.random.default_rng(0)
    expected_d = {}
    for enc_i, enc in enumerate(CHEST):
        num = den = 0.0
        for finding in FINDINGS:
            weight = SEVERITY_WEIGHTS[finding]
            ds = {"mimic_cxr": (0.2 + 0.05 * enc_i + rng.uniform(0, 0.05), 30),
                  "chexpert": (0.3 + 0.05 * enc_i + rng.uniform(0, 0.05), 10)}
            for dataset, (d, n) in ds.items():
                write_result(tmp_path, f"candor-{dataset}-{enc}", "candor", enc, dataset, finding,
                             [{**candor_row(d, d + 0.4, 0.8 - 0.05 * enc_i, n), "target": finding},
                              {**candor_row(0.9, 0.9, 0.5, 3, group=f"{dataset}_PA"),  # groups are not read
                               "target": finding}])
                write_result(tmp_path, f"head-{dataset}-{enc}", "linear_head", enc, dataset, finding,
                             dict(auroc=0.75 - 0.02 * enc_i, n=100))
            pooled = (ds["mimic_cxr"][0] * 30 + ds["chexpert"][0] * 10) / 40
            num, den = num + weight * pooled, den + weight
        for dataset in ("mimic_cxr", "chexpert"):  # the stage's own severity-weighted pool is not read
            write_result(tmp_path, f"candor-{dataset}-{enc}", "candor", enc, dataset, "__chest__",
                         {**candor_row(0.99, 0.99, 0.99, 500), "target": "__chest__"})
        expected_d[enc] = num / den
        if enc != "random_vit_l":  # retention missing for one encoder -> NaN cell
            write_result(tmp_path, f"ret-{enc}", "retention", enc, "ms_cxr", "pneumothorax",
                         dict(retention=0.6 + 0.1 * enc_i, n=20))
    [table] = candor_table2(SweepResults(tmp_path))
    frame = table.frame.set_index("Encoder")
    pub = published_table(2)
    assert [c for c in table.frame.columns if c not in ("Encoder", "Objective")] == published_columns(2)
    assert set(frame.index) <= set(pub["row"]) and len(frame) == 4
    # order: specialists, general-purpose, untrained (each by D)
    assert list(frame.index) == ["RAD-DINO", "DenseNet-121", "DINOv3-S", "Random ViT-L"]
    for enc, d in expected_d.items():
        name = {"rad_dino": "RAD-DINO", "densenet121_xrv": "DenseNet-121", "dinov3_s": "DINOv3-S",
                "random_vit_l": "Random ViT-L"}[enc]
        assert frame.loc[name, "D"] == pytest.approx(d)
        assert frame.loc[name, "D_all"] == pytest.approx(d + 0.4)
    assert frame.loc["RAD-DINO", "AUROC Head"] == pytest.approx(0.75)
    assert frame.loc["DenseNet-121", "AUROC Margin"] == pytest.approx(0.75)
    assert frame.loc["RAD-DINO", "Params (M)"] == pytest.approx(
        float(pub.query("row == 'RAD-DINO' and column == 'Params (M)'")["value"].iloc[0]), abs=5)
    assert frame.loc["DINOv3-S", "Objective"] == "SSL" and np.isnan(frame.loc["Random ViT-L", "Retention"])
    assert table.best == {"AUROC Head": "max", "AUROC Margin": "max", "D": "min", "Retention": "min"}
    # the same sweep feeds the association tests: D and head AUROC are perfectly anti-ranked here
    [assoc] = candor_associations(SweepResults(tmp_path))
    row = assoc.frame.set_index("Quantity").loc["head AUROC vs D (encoders)"]
    assert row["Statistic"] == pytest.approx(-1.0)


def _disc(rng, n, shared):
    return shared | (rng.uniform(size=n) < 0.1)


def test_table3_layout_task_rows_and_overlap(tmp_path):
    rng = np.random.default_rng(1)
    n = 200
    shared = rng.uniform(size=n) < 0.2
    encs = {"uni": 0.03, "dinov3_s": 0.09, "random_vit_l": 0.12}
    for enc, d in encs.items():
        for dataset in ("nct_crc", "pcam"):
            ps = pd.DataFrame({"sample_id": [f"{dataset}-{i}" for i in range(n)], "acq_group": dataset,
                               "discordant": _disc(rng, n, shared)})
            write_result(tmp_path, f"{enc}-{dataset}", "candor", enc, dataset, "tumour",
                         candor_row(d, 0.5, 0.9, n), ps)
        if enc != "uni":  # specialists are shown on their own domain only
            write_result(tmp_path, f"{enc}-mammo", "candor", enc, "vindr_mammo", "mass_or_calcification",
                         candor_row(0.5, 0.9, 0.5, 50))
            write_result(tmp_path, f"{enc}-errors", "error_detection", enc, "nct_crc", "tumour",
                         [dict(stratum="__all__", method="impurity", auroc=0.6),
                          dict(stratum="__all__", method="msp", auroc=0.9),
                          dict(stratum="site_a", method="msp", auroc=0.1)])  # strata are not read
    write_result(tmp_path, "uni-mammo", "candor", "uni", "vindr_mammo", "mass_or_calcification",
                 candor_row(0.1, 0.9, 0.5, 50))
    # birds: one-vs-rest classes (target) of the class column; D = unweighted mean over the classes,
    # the stage's own __mean__ row is not read
    write_result(tmp_path, "dinov3_s-cub", "candor", "dinov3_s", "cub", "bio_label",
                 [{**candor_row(0.1, 0.6, 0.8, 10), "target": "a"}, {**candor_row(0.3, 0.6, 0.8, 90), "target": "b"},
                  {**candor_row(0.9, 0.6, 0.8, 100), "target": "__mean__"}])
    encoder_table, task_table = candor_table3(SweepResults(tmp_path))
    pub = published_table(3)
    assert list(encoder_table.frame.columns[1:]) == published_columns(3, "Positive queries")
    assert list(task_table.frame.columns[1:]) == published_columns(3, "Positive queries")
    assert set(encoder_table.frame["Encoder"]) <= set(pub["row"])
    assert list(task_table.frame.iloc[:, 0]) == list(pub.loc[pub["section"] == "task-level", "row"].unique())
    frame = encoder_table.frame.set_index("Encoder")
    assert frame.loc["UNI", "Tumor"] == pytest.approx(0.03) and np.isnan(frame.loc["UNI", "Mammogram"])
    assert frame.loc["DINOv3-S", "Birds"] == pytest.approx(0.2)
    tasks = task_table.frame.set_index("Task-level")
    assert tasks.loc["Positive queries", "Tumor"] == 2 * n
    assert tasks.loc["ΔJ", "Tumor"] > 0.3 and tasks.loc["Sig. (%)", "Tumor"] == 1.0
    assert tasks.loc["Conf.", "Tumor"] == pytest.approx(0.9) and np.isnan(tasks.loc["r", "Skin"])


def _one_vs_rest(classes: dict, encoder_d: dict) -> list[dict]:
    """Summary rows as stages/candor.py writes a one-vs-rest task (finding bio_label): per class its
    family's row and its pooled row, then the ``__mean__`` row (unweighted mean over the classes)."""
    rows = []
    for cls, (family, n) in classes.items():
        d = encoder_d[cls]
        rows += [{**candor_row(d, 0.6, 0.8, n, n_neg=3 * n, group=family), "target": cls},
                 {**candor_row(d, 0.6, 0.8, n, n_neg=3 * n), "target": cls}]
    return rows + [{**candor_row(float(np.mean(list(encoder_d.values()))), 0.6, 0.8,
                                 sum(n for _, n in classes.values())), "target": "__mean__"}]


def test_table3_natural_task_is_the_mean_over_classes_and_overlaps_align_on_class_and_sample(tmp_path):
    rng = np.random.default_rng(5)
    classes = {"a1": ("fam_a", 10), "a2": ("fam_a", 30), "b1": ("fam_b", 20), "b2": ("fam_b", 40)}
    d = {"dinov3_s": {"a1": 0.1, "a2": 0.3, "b1": 0.5, "b2": 0.0},
         "random_vit_l": {"a1": 0.4, "a2": 0.4, "b1": 0.2, "b2": 0.6}}
    # the same sample ids in every class: a query is (class, sample), never a sample alone
    queries = pd.DataFrame([(cls, fam, f"img{i}") for cls, (fam, n) in classes.items() for i in range(n)],
                           columns=["target", "acq_group", "sample_id"])
    shared = rng.uniform(size=len(queries)) < 0.3
    disc = {"dinov3_s": shared | (rng.uniform(size=len(queries)) < 0.05),
            "random_vit_l": shared & (rng.uniform(size=len(queries)) < 0.8)}
    for enc in d:
        ps = queries.assign(discordant=disc[enc]).sample(frac=1.0, random_state=1)  # rows in any order
        write_result(tmp_path, f"{enc}-cub", "candor", enc, "cub", "bio_label", _one_vs_rest(classes, d[enc]), ps)
    encoder_table, task_table = candor_table3(SweepResults(tmp_path))
    frame = encoder_table.frame.set_index("Encoder")
    # unweighted mean over the classes (the __mean__ row), not the query-weighted 0.20
    assert frame.loc["DINOv3-S", "Birds"] == pytest.approx((0.1 + 0.3 + 0.5 + 0.0) / 4)
    assert frame.loc["Random ViT-L", "Birds"] == pytest.approx((0.4 + 0.4 + 0.2 + 0.6) / 4)
    assert frame["Aircraft"].isna().all()
    tasks = task_table.frame.set_index("Task-level")
    assert tasks.loc["Positive queries", "Birds"] == 100  # pooled class rows only, no family or __mean__ rows
    # one test for the pair per class (the same sample ids in every class stay apart), BH over the classes
    tests = [overlap_test(disc["dinov3_s"][queries["target"] == cls], disc["random_vit_l"][queries["target"] == cls])
             for cls in classes]
    _, significant = bh_adjust([t["p_value"] for t in tests])
    assert tasks.loc["ΔJ", "Birds"] == pytest.approx(np.mean([t["delta_j"] for t in tests]))
    assert tasks.loc["Sig. (%)", "Birds"] == pytest.approx(significant.mean())
    # the pooled form, an option: one test for the pair over all (class, sample) queries of the task
    _, pooled_tasks = candor_table3(SweepResults(tmp_path), overlap="pooled")
    expected = overlap_test(disc["dinov3_s"], disc["random_vit_l"])
    assert pooled_tasks.frame.set_index("Task-level").loc["ΔJ", "Birds"] == pytest.approx(expected["delta_j"])


def test_table3_per_class_overlap_is_near_chance_when_encoders_share_only_class_difficulty(tmp_path):
    """Significance (candor.md Table 3, "Sig." for birds and aircraft): 8 encoders whose
    discordance depends only on the class (hard classes: P = 0.8, easy: 0.05), independently
    across encoders within a class. Per class each test is null: Sig. ≈ 0 and ΔJ ≈ 0 (E[ΔJ] = 0
    under the null); pooling the classes makes every pair overlap "above chance" (Sig. 1.0,
    ΔJ > 0.1) although no query is shared beyond its class's difficulty."""
    rng = np.random.default_rng(31)
    encoders = ["dinov3_s", "dinov3_b", "dinov3_l", "dinov3_h", "dinov2_l", "clip_l14", "siglip2_l", "random_vit_l"]
    n_classes, per_class = 24, 40
    classes = {f"c{c:02d}": (f"fam{c // 4}", 0.8 if c % 2 else 0.05) for c in range(n_classes)}
    queries = pd.DataFrame([(cls, fam, f"img{cls}_{i}") for cls, (fam, _) in classes.items() for i in range(per_class)],
                           columns=["target", "acq_group", "sample_id"])
    p_disc = queries["target"].map({cls: p for cls, (_, p) in classes.items()}).to_numpy()
    for enc in encoders:
        disc = rng.random(len(queries)) < p_disc
        rows = [{**candor_row(float(disc[queries["target"] == cls].mean()), 0.6, 0.8, per_class, n_neg=3 * per_class),
                 "target": cls} for cls in classes]
        write_result(tmp_path, f"{enc}-cub", "candor", enc, "cub", "bio_label", rows, queries.assign(discordant=disc))
    _, per_class_table = candor_table3(SweepResults(tmp_path))
    _, pooled_table = candor_table3(SweepResults(tmp_path), overlap="pooled")
    per_class_row = per_class_table.frame.set_index("Task-level")["Birds"]
    pooled_row = pooled_table.frame.set_index("Task-level")["Birds"]
    # 28 pairs x 24 classes = 672 null tests under BH at 0.05
    assert per_class_row["Sig. (%)"] <= 0.02 and abs(per_class_row["ΔJ"]) < 0.02
    assert pooled_row["Sig. (%)"] == 1.0 and pooled_row["ΔJ"] > 0.1
    with pytest.raises(ValueError, match="overlap='both'"):
        candor_table3(SweepResults(tmp_path), overlap="both")


def test_ablation_reads_the_swept_setting_from_each_job(tmp_path):
    d_by_k = {1: 0.30, 5: 0.40, 20: 0.42}
    for k, base in d_by_k.items():
        for enc_i, enc in enumerate(["rad_dino", "dinov3_s"]):
            job = f"{k}-{enc}"
            for finding in ("pneumothorax", "atelectasis"):
                write_result(tmp_path, job, "candor", enc, "chexpert", finding,
                             candor_row(base + 0.1 * enc_i, 0.9, 0.7, 20),
                             config={"stage": {"name": "candor", "params": {"k": k, "seed": 42}},
                                     "encoder": {"name": enc}})
    table, summary = candor_ablation(SweepResults(tmp_path))
    assert table.name == "candor_ablation_k" and list(table.frame.columns) == ["Encoder", "k=1", "k=5", "k=20"]
    assert table.frame.set_index("Encoder").loc["DINOv3-S", "k=1"] == pytest.approx(0.40)
    s = summary.frame.set_index("k")
    assert s.loc["1", "Max abs ΔD (encoders)"] == pytest.approx(0.10)
    assert s.loc["5", "Max abs ΔD (encoders)"] == 0 and s.loc["20", "Median D (combinations)"] == pytest.approx(0.47)


def test_calibration_rows_report_prevalence(tmp_path):
    for frac, n_pos in ((0.1, 20), (0.5, 100)):
        for enc, d, d_all in (("planted_blur", 0.5, 0.9 - frac), ("planted_sharp", 0.0, 0.0)):
            write_result(tmp_path, f"{frac}-{enc}", "candor", enc, "planted", "marker",
                         candor_row(d, d_all, 0.5, n_pos, n_pos=n_pos, n_neg=200 - n_pos))
    [table] = candor_calibration(SweepResults(tmp_path))
    blur = table.frame[table.frame["Encoder"] == "planted_blur"]
    assert blur["Prevalence"].tolist() == pytest.approx([0.1, 0.5]) and blur["Positives"].tolist() == [20, 100]
    assert blur["D_all"].tolist() == pytest.approx([0.8, 0.4])


def test_chest_overlap_is_corrected_over_the_whole_chest_family(tmp_path):
    rng = np.random.default_rng(3)
    n = 150
    for finding in ("edema", "atelectasis"):
        shared = rng.uniform(size=n) < 0.25
        for enc in ("rad_dino", "dinov3_s", "random_vit_l"):
            disc = _disc(rng, n, shared) if enc != "random_vit_l" else rng.uniform(size=n) < 0.3
            for dataset in ("mimic_cxr", "chexpert"):
                ps = pd.DataFrame({"sample_id": [f"s{i}" for i in range(n)], "acq_group": dataset,
                                   "discordant": disc})  # the same ids in two sites stay distinct queries
                write_result(tmp_path, f"{enc}-{dataset}", "candor", enc, dataset, finding,
                             candor_row(0.3, 0.8, 0.7, n), ps)
    [table] = candor_chest_overlap(SweepResults(tmp_path))
    frame = table.frame.set_index("Finding")
    assert frame.loc["All findings", "Pairs"] == 6 and frame.loc["edema", "Pairs"] == 3
    assert frame.loc["edema", "ΔJ"] > 0.1 and frame.loc["All findings", "Sig."] == pytest.approx(2 / 6)


def test_table2_caption_names_the_datasets_that_ran_and_labels_untrained_encoders(tmp_path):
    """A CheXpert-only sweep is not titled "MIMIC-CXR and CheXpert"; the planted
    references are "synthetic (calibration)", a random ViT "random init", neither "SSL"."""
    for enc in ("planted_blur", "planted_sharp", "random_vit_s", "dinov3_s"):
        for finding in FINDINGS:
            write_result(tmp_path, f"candor-chexpert-{enc}", "candor", enc, "chexpert", finding,
                         {**candor_row(0.4, 0.8, 0.6, 10), "target": finding})
    [table] = candor_table2(SweepResults(tmp_path))
    assert table.caption.startswith("Chest encoders on CheXpert (") and "MIMIC" not in table.caption
    objective = table.frame.set_index("Encoder")["Objective"]
    assert objective["planted_blur"] == objective["planted_sharp"] == "synthetic (calibration)"
    assert objective["random_vit_s"] == "random init" and objective["DINOv3-S"] == "SSL"
    assert list(table.frame["Encoder"])[-2:] == ["planted_blur", "planted_sharp"]  # after the untrained block
    for finding in FINDINGS:
        write_result(tmp_path, "candor-mimic-dinov3_s", "candor", "dinov3_s", "mimic_cxr", finding,
                     {**candor_row(0.4, 0.8, 0.6, 10), "target": finding})
    [both] = candor_table2(SweepResults(tmp_path))
    assert both.caption.startswith("Chest encoders on MIMIC-CXR and CheXpert (")


def test_associations_refuse_a_rank_test_over_three_encoders(tmp_path):
    """N = 3 encoders gave "Significant: True" with p = 0.000; now no p-value,
    no verdict, and a note, rendered as "—"."""
    from robustbench_fm.report.render import to_markdown

    for i, enc in enumerate(("rad_dino", "dinov3_s", "random_vit_l")):
        for finding in FINDINGS:
            write_result(tmp_path, f"candor-{enc}", "candor", enc, "chexpert", finding,
                         {**candor_row(0.2 + 0.1 * i, 0.6 + 0.1 * i, 0.8, 10 + i), "target": finding})
    [assoc] = candor_associations(SweepResults(tmp_path))
    row = assoc.frame.set_index("Quantity").loc["D_all vs D (encoders)"]
    assert row["Statistic"] == pytest.approx(1.0) and row["n"] == 3
    assert np.isnan(row["p"]) and row["Significant"] is None
    assert row["Note"] == "too few encoders (n = 3) for a rank test"
    assert "| D_all vs D (encoders) | spearman | 1.000 | — | 3 | — | — | too few encoders (n = 3) for a rank test |" \
        in to_markdown(assoc)
    flagged = assoc.frame["Note"] != ""
    assert flagged.sum() >= 2 and assoc.frame.loc[flagged, "Significant"].isna().all()
    assert (assoc.frame.loc[assoc.frame["Significant"].fillna(False).astype(bool), "n"] >= 5).all()


def test_standardised_retention_association_uses_one_c_per_encoder(tmp_path):
    """The retention stage standardises every row of an encoder's job with one c
    (all boxed images of the domain), and the association test "standardised retention vs D"
    ranks that pooled value. Brute force: ρ̄ over the boxed positives of both findings, c over all
    pairs of their images, (ρ̄ − c)/(1 − c), Spearman with the chest D. The findings' images differ
    in their within-finding similarity from encoder to encoder, so the old per-finding c (mixed in
    the chest pool) ranks the encoders differently."""
    from scipy.stats import spearmanr

    from robustbench_fm.methods.candor import retention

    rng = np.random.default_rng(41)
    encoders = ["rad_dino", "densenet121_xrv", "biomedclip", "dinov3_s", "dinov3_b", "dinov3_l", "dinov2_l"]
    boxed = pd.DataFrame({"sample_id": [f"s{i}" for i in range(8)], "path": "x",
                          "patient_id": [f"p{i}" for i in range(8)],
                          "box_x0": 0.1, "box_y0": 0.1, "box_x1": 0.3, "box_y1": 0.3})
    m = retention.derived_manifest({"pneumothorax": boxed.iloc[:3], "pneumonia": boxed.iloc[3:]}, seed=0)
    kind = m["occlusion"].astype(object).fillna("").to_numpy()
    of = np.where(kind == "", m["sample_id"], m["occlusion_of"])
    index = np.array([int(x[1:]) for x in of])
    expected, mixed, d_chest = {}, {}, {}
    for enc_i, enc in enumerate(encoders):
        d = 6
        tight, loose = rng.uniform(0.1, 0.3), rng.uniform(1.5, 2.5)  # one source's images alike, the other's not
        first, second = (tight, loose) if enc_i % 2 else (loose, tight)
        spread = np.r_[np.full(3, first), np.full(5, second)]
        originals = np.eye(d)[0] + spread[:, None] * rng.normal(size=(8, d))
        feats = originals[index] + np.where(kind == "", 0, 1)[:, None] * rng.normal(scale=rng.uniform(0.2, 1.0),
                                                                                      size=(len(m), d))
        res = retention.run(feats, m, finding=["pneumothorax", "pneumonia"], n_boot=0, n_pairs=10_000)
        for _, row in res.summary.iterrows():
            write_result(tmp_path, f"ret-{enc}", "retention", enc, "rsna_pneumonia", row["finding"], row.to_dict())
        unit = originals / np.linalg.norm(originals, axis=1, keepdims=True)
        rho = res.per_sample["rho_box"].to_numpy()
        c = float(np.mean([unit[a] @ unit[b] for a, b in zip(*np.triu_indices(8, k=1))]))
        expected[enc] = (rho.mean() - c) / (1 - c)
        # the old stage: a c per finding, its rows n-weighted with the pooled row in the chest pool
        c_f = [float(np.mean([u[a] @ u[b] for a, b in zip(*np.triu_indices(len(u), k=1))]))
               for u in (unit[:3], unit[3:])]
        stds = [(rho[:3].mean() - c_f[0]) / (1 - c_f[0]), (rho[3:].mean() - c_f[1]) / (1 - c_f[1]), expected[enc]]
        mixed[enc] = np.average(stds, weights=[3, 5, 8])
        d_chest[enc] = 0.2 + 0.05 * enc_i + rng.uniform(0, 0.04)
        for finding in ("pneumothorax", "atelectasis"):
            write_result(tmp_path, f"candor-{enc}", "candor", enc, "mimic_cxr", finding,
                         {**candor_row(d_chest[enc], 0.8, 0.7, 30), "target": finding})
    [assoc] = candor_associations(SweepResults(tmp_path))
    row = assoc.frame.set_index("Quantity").loc["standardised retention vs D (trained encoders)"]
    rho_new = spearmanr([expected[e] for e in encoders], [d_chest[e] for e in encoders]).statistic
    assert row["Statistic"] == pytest.approx(rho_new) and row["n"] == len(encoders)
    table = chest_retention(SweepResults(tmp_path)).set_index("encoder")
    assert table.loc[encoders, "retention_std"].to_numpy() == pytest.approx([expected[e] for e in encoders])
    # what the per-finding references gave (the old stage's rows in the old pool)
    assert all(abs(expected[e] - mixed[e]) > 0.01 for e in encoders)
