"""The ablation and control tables (methods/candor/controls.py) on small sweep folders: the swept
setting read from each job's config, the paper's summary numbers recomputed by hand, and the
published value beside each."""
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from robustbench_fm.core.tables import SweepResults
from robustbench_fm.methods.candor.controls import (
    candor_box_verified,
    candor_equal_size,
    candor_shuffle,
    candor_ties,
    candor_unmatched,
)
from robustbench_fm.methods.candor.tasks import SEVERITY_WEIGHTS


def write(root: Path, job: str, encoder: str, dataset: str, finding: str, rows: list[dict], params: dict,
          stage: str = "candor", per_sample: pd.DataFrame | None = None):
    job_dir = root / job
    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / "config.yaml").write_text(yaml.safe_dump({"stage": {"name": stage, "params": params},
                                                         "encoder": {"name": encoder}}))
    out = job_dir / "results" / encoder / dataset / stage / finding
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame([{"encoder": encoder, "dataset": dataset, "finding": finding, **r} for r in rows]) \
        .to_parquet(out / "summary.parquet")
    if per_sample is not None:
        per_sample.assign(finding=finding).to_parquet(out / "per_sample.parquet")


def pooled(d, d_all=0.9, n=10):
    return dict(acq_group="__pooled__", target=None, n_queries=n, n_pos=n, n_neg=50, d=d, d_ci_low=d, d_ci_high=d,
                d_all=d_all, margin_auroc=0.7)


def published(table) -> pd.Series:
    return table.frame.set_index("Quantity")


def test_unmatched_table_recomputes_the_papers_summary(tmp_path):
    d = {("rad_dino", "atelectasis"): (0.30, 0.35), ("rad_dino", "cardiomegaly"): (0.20, 0.10),
         ("dinov3_s", "atelectasis"): (0.40, 0.41), ("dinov3_s", "cardiomegaly"): (0.50, 0.60)}
    for unmatched in (False, True):
        for enc in ("rad_dino", "dinov3_s"):
            for finding in ("atelectasis", "cardiomegaly"):
                write(tmp_path, f"{unmatched}-{enc}", enc, "pool", finding,
                      [pooled(d[(enc, finding)][int(unmatched)])], {"unmatched": unmatched})
    table, pub = candor_unmatched(SweepResults(tmp_path))
    frame = table.frame.set_index(["Encoder", "Finding"])
    assert frame.loc[("RAD-DINO", "cardiomegaly"), "Pooled − matched"] == pytest.approx(-0.10)
    p = published(pub)
    diffs = np.array([0.05, -0.10, 0.01, 0.10])
    assert p.loc["combinations", "Ours"] == 4 and p.loc["combinations", "Published"] == 22
    assert p.loc["mean |change| in D when pooling", "Ours"] == pytest.approx(np.abs(diffs).mean())
    assert p.loc["mean |change| in D when pooling", "Published"] == 0.046
    assert p.loc["largest |change| in D when pooling", "Ours"] == pytest.approx(0.10)
    assert p.loc["largest |change| in D when pooling", "Published"] == 0.123
    assert p.loc["combinations where the matched rate is lower", "Ours"] == 3
    assert p.loc["combinations where the matched rate is lower", "Published"] == 9


def test_shuffle_medians_over_combinations_pool_sites_first(tmp_path):
    # two sites: a combination's D is pooled over them by queries before the median
    for shuffled in (False, True):
        for e, enc in enumerate(("rad_dino", "dinov3_s", "random_vit_l")):
            for finding in ("pneumothorax", "edema"):
                base = 0.5 if shuffled else 0.3 + 0.05 * e
                write(tmp_path, f"{shuffled}-{enc}-mimic", enc, "mimic_cxr", finding,
                      [pooled(base, 0.99 if shuffled else 0.9, n=10)], {"shuffle_labels": shuffled})
                write(tmp_path, f"{shuffled}-{enc}-chexpert", enc, "chexpert", finding,
                      [pooled(base + 0.03, 1.0 if shuffled else 0.93, n=30)], {"shuffle_labels": shuffled})
    table, pub = candor_shuffle(SweepResults(tmp_path))
    rows = table.frame.set_index("Labels")
    assert rows.loc["shuffled", "Combinations"] == 6
    assert rows.loc["shuffled", "Median D (equal sets)"] == pytest.approx(0.5 + 0.03 * 30 / 40)
    assert rows.loc["shuffled", "Median D_all (unequal sets)"] == pytest.approx((0.99 * 10 + 30) / 40)
    assert rows.loc["as given", "Median D (equal sets)"] == pytest.approx(0.35 + 0.03 * 0.75)
    p = published(pub)
    assert p.loc["median D, labels shuffled (equal sets)", "Published"] == 0.498
    assert p.loc["median D_all, labels shuffled (unequal sets)", "Published"] == 0.996
    assert p.loc["median D, labels as given", "Published"] == 0.410
    assert p.loc["median D_all, labels shuffled (unequal sets)", "Ours"] == pytest.approx((0.99 * 10 + 30) / 40)


def test_equal_size_change_is_of_the_severity_weighted_chest_d(tmp_path):
    d = {"pneumothorax": 0.2, "edema": 0.4}  # severity weights 3 and 2
    shift = {"pneumothorax": 0.001, "edema": -0.0005}
    for eq in (False, True):
        for enc, offset in (("rad_dino", 0.0), ("dinov3_s", 0.1)):
            for finding in d:
                write(tmp_path, f"{eq}-{enc}", enc, "mimic_cxr", finding,
                      [pooled(d[finding] + offset + (shift[finding] if eq else 0.0))], {"equal_size": eq})
    table, pub = candor_equal_size(SweepResults(tmp_path))
    w = {f: SEVERITY_WEIGHTS[f] for f in d}
    expected = (w["pneumothorax"] * 0.001 + w["edema"] * -0.0005) / sum(w.values())
    frame = table.frame.set_index("Encoder")
    assert frame.loc["RAD-DINO", "D"] == pytest.approx((w["pneumothorax"] * 0.2 + w["edema"] * 0.4) / sum(w.values()))
    assert frame.loc["RAD-DINO", "Change"] == pytest.approx(expected)
    p = published(pub)
    assert p.loc["largest |change| of an encoder's D", "Ours"] == pytest.approx(abs(expected))
    assert p.loc["largest |change| of an encoder's D", "Published"] == 0.0004
    assert p.loc["largest |change| of a combination's D (encoder × finding)", "Ours"] == pytest.approx(0.001)


def test_ties_count_equal_c_plus_and_c_minus_of_chest_queries_only(tmp_path):
    rng = np.random.default_rng(0)
    ties = {"rad_dino": 3, "dinov3_s": 0}
    for enc, n_ties in ties.items():
        for finding in ("pneumothorax", "edema", "bio_label"):
            c = rng.uniform(0.5, 0.9, size=(50, 2))
            if finding != "edema":
                c[:n_ties, 1] = c[:n_ties, 0]  # ties in pneumothorax, and in a non-chest task (left out)
            per = pd.DataFrame({"sample_id": [f"s{i}" for i in range(50)], "target": finding, "acq_group": "g",
                                "c_pos": c[:, 0], "c_neg": c[:, 1], "dm": c[:, 1] - c[:, 0],
                                "discordant": c[:, 1] > c[:, 0]})
            write(tmp_path, f"{enc}", enc, "mimic_cxr", finding, [pooled(0.4)], {}, per_sample=per)
    table, pub = candor_ties(SweepResults(tmp_path))
    frame = table.frame.set_index("Encoder")
    assert frame.loc["RAD-DINO", "Queries"] == 100 and frame.loc["RAD-DINO", "Ties"] == 3
    assert frame.loc["All encoders", "Ties"] == 3 and frame.loc["All encoders", "Ties (%)"] == pytest.approx(1.5)
    p = published(pub)
    assert p.iloc[0]["Ours"] == pytest.approx(1.5) and p.iloc[0]["Published"] == pytest.approx(0.002)


def test_box_verified_table_puts_the_papers_sentence_beside_ours(tmp_path):
    for enc, boxed, everyone in (("rad_dino", 0.2, 0.25), ("dinov3_s", 0.45, 0.4)):
        rows = [dict(arm="ms_cxr", acq_group="__pooled__", n_queries=7, d=boxed),
                dict(arm="mimic_cxr", acq_group="__pooled__", n_queries=30, d=everyone),
                dict(arm="ms_cxr", acq_group="mimic_cxr_PA", n_queries=4, d=0.0)]
        write(tmp_path, enc, enc, "pool", "pneumothorax", rows, {}, stage="candor_box_verified")
        write(tmp_path, enc, enc, "pool", "pneumonia", [dict(arm="rsna_pneumonia", acq_group="__pooled__",
                                                             n_queries=5, d=0.6)], {}, stage="candor_box_verified")
    table, pub = candor_box_verified(SweepResults(tmp_path))
    assert list(table.frame.columns)[1:5] == ["pneumothorax boxed (ms_cxr): queries", "pneumothorax boxed (ms_cxr): D",
                                              "pneumothorax all positives (mimic_cxr): queries",
                                              "pneumothorax all positives (mimic_cxr): D"]
    frame = table.frame.set_index("Encoder")
    assert frame.loc["RAD-DINO", "pneumothorax boxed (ms_cxr): D"] == 0.2  # the pooled row, not a group's
    assert frame.loc["DINOv3-S", "pneumonia boxed (rsna_pneumonia): D"] == 0.6
    p = published(pub)
    assert p.loc["pneumothorax positives with MS-CXR boxes (queries)", ["Ours", "Published"]].tolist() == [7, 233]
    assert p.loc["RAD-DINO D on box-verified pneumothorax positives", ["Ours", "Published"]].tolist() == [0.2, 0.167]
    assert p.loc["RAD-DINO D on all pneumothorax positives", ["Ours", "Published"]].tolist() == [0.25, 0.184]
    assert p.iloc[1]["Ours"] == 0.45 and p.iloc[1]["Published"] == 0.5


def test_objective_contrast_is_the_mean_of_the_cells_with_a_percentile_interval():
    from robustbench_fm.methods.candor.controls import objective_contrast

    cells = pd.DataFrame({"objective": ["image-text"] * 6 + ["supervised"] * 6,
                          "encoder": ["a", "a", "a", "b", "b", "b"] * 2,
                          "d": [0.3, 0.4, 0.5, 0.6, 0.2, 0.7] + [0.33] * 6})
    arms = objective_contrast(cells, n_boot=2000, seed=0).set_index("objective")
    assert arms.loc["image-text", "mean_d"] == pytest.approx(0.45) and arms.loc["image-text", "cells"] == 6
    assert arms.loc["image-text", "encoders"] == 2
    # the bootstrap mean of 6 cells: inside the cells' range, around the mean, sd ~ s/sqrt(6)
    lo, hi = arms.loc["image-text", ["ci_low", "ci_high"]]
    sd = np.std([0.3, 0.4, 0.5, 0.6, 0.2, 0.7]) / np.sqrt(6)
    assert 0.2 <= lo < 0.45 < hi <= 0.7 and (hi - lo) == pytest.approx(2 * 1.96 * sd, rel=0.25)
    assert arms.loc["supervised", ["mean_d", "ci_low", "ci_high"]].tolist() == pytest.approx([0.33] * 3)
    assert list(arms.index) == ["image-text", "supervised"]  # the paper's order
