"""Miniature end-to-end run of ``experiment=chest_candor`` through the real CLI: MIMIC-CXR-JPG
and CheXpert layouts (two sites x two views, 12 findings), two cheap planted encoders, the
multirun over encoder x dataset, and the collect step writing Table 2's layout."""
from pathlib import Path

import cli_process
import numpy as np
import pandas as pd
import pytest
from chest_fixtures import CHEXPERT_LABELS, MIMIC_LABELS, _csv_gz  # noqa: E402
from PIL import Image

from robustbench_fm.data.synthetic import _draw_image
from robustbench_fm.methods.candor.tables import SEVERITY_WEIGHTS

pytestmark = pytest.mark.slow  # command-line subprocesses: the full suite runs them

PER_VIEW = 22  # images per (site, view)
LABELS = {  # our finding -> the CheXpert-labeler column both sites use
    "pneumothorax": "Pneumothorax", "pneumonia": "Pneumonia", "consolidation": "Consolidation", "edema": "Edema",
    "lung_lesion": "Lung Lesion", "pleural_effusion": "Pleural Effusion", "fracture": "Fracture",
    "cardiomegaly": "Cardiomegaly", "lung_opacity": "Lung Opacity",
    "enlarged_cardiomediastinum": "Enlarged Cardiomediastinum", "atelectasis": "Atelectasis",
    "pleural_other": "Pleural Other"}


def _image(path: Path, rng, marker: bool) -> None:
    """A JPEG radiograph stand-in: the planted generator's smooth background, with its local
    marker on the edema positives only (planted_sharp sees it, planted_blur does not)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(_draw_image(rng, 112, marker)).save(path, quality=95)


def _labels(rng) -> dict:
    """0/1 for each of the 12 labels, at least 4 positives and 4 negatives per view."""
    return {c: rng.permutation(np.r_[np.ones(9), np.zeros(PER_VIEW - 9)]) for c in LABELS.values()}


def write_mimic(root: Path, rng) -> None:
    meta, split, labels = [], [], []
    for v, view in enumerate(("PA", "AP")):
        lab = _labels(rng)
        for i in range(PER_VIEW):
            subject, study, dicom = 10000000 + 100 * v + i, 50000000 + 100 * v + i, f"d{v}-{i:04d}"
            meta.append({"dicom_id": dicom, "subject_id": subject, "study_id": study, "ViewPosition": view})
            split.append({"dicom_id": dicom, "study_id": study, "subject_id": subject, "split": "train"})
            labels.append({"subject_id": subject, "study_id": study,
                           **{c: (lab[c][i] if c in lab else np.nan) for c in MIMIC_LABELS}})
            _image(root / "files" / f"p{str(subject)[:2]}" / f"p{subject}" / f"s{study}" / f"{dicom}.jpg", rng,
                   lab["Edema"][i] == 1)
    _csv_gz(pd.DataFrame(meta), root / "mimic-cxr-2.0.0-metadata.csv.gz")
    _csv_gz(pd.DataFrame(split), root / "mimic-cxr-2.0.0-split.csv.gz")
    _csv_gz(pd.DataFrame(labels), root / "mimic-cxr-2.0.0-chexpert.csv.gz")


def write_chexpert(root: Path, rng) -> None:
    rows = []
    for v, view in enumerate(("PA", "AP")):
        lab = _labels(rng)
        for i in range(PER_VIEW):
            rel = f"train/patient{100 * v + i + 1:05d}/study1/view1_frontal.jpg"
            _image(root / rel, rng, lab["Edema"][i] == 1)
            rows.append({"Path": f"CheXpert-v1.0-small/{rel}", "Sex": "Female", "Age": 60,
                         "Frontal/Lateral": "Frontal", "AP/PA": view,
                         **{c: (lab[c][i] if c in lab else np.nan) for c in CHEXPERT_LABELS}})
    root.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(root / "train.csv", index=False)
    pd.DataFrame(columns=list(rows[0])).to_csv(root / "valid.csv", index=False)


@pytest.mark.slow
def test_chest_candor_multirun_writes_table2(tmp_path):
    rng = np.random.default_rng(0)
    write_mimic(tmp_path / "data" / "mimic-cxr-jpg" / "2.1.0", rng)
    write_chexpert(tmp_path / "data" / "CheXpert-v1.0-small", rng)
    sweep = tmp_path / "sweep"
    cmd = ["-m", "robustbench_fm", "-m", "experiment=chest_candor", f"paths.root={tmp_path}",
           "encoders=[planted_blur,planted_sharp]", "stage=candor",
           "stage.params.n_boot=20", "device=cpu", "extract.num_workers=0",
           f"hydra.sweep.dir={sweep}"]
    proc = cli_process.run(cmd, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = sorted(p.name for p in sweep.iterdir() if (p / "status.json").exists())
    # 2 encoders x 2 sites (the head and retention stages: tests/methods/candor/test_candor_tables.py)
    assert len(jobs) == 4
    assert (sweep / "missing.txt").read_text() == ""

    table = pd.read_csv(sweep / "tables" / "candor_table2.csv")
    published = pd.read_csv(Path(__file__).resolve().parents[3] / "robustbench_fm" / "paper" / "published"
                            / "candor_v4_table2.csv")
    assert list(table.columns) == ["Encoder", "Objective", *dict.fromkeys(published["column"])]
    assert sorted(table["Encoder"]) == ["planted_blur", "planted_sharp"]
    assert table["AUROC Head"].isna().all() and table["Retention"].isna().all()  # stages not swept here

    # independent recomputation from the jobs' pooled rows: sites by queries, findings by severity
    rows = pd.concat([pd.read_parquet(f) for f in sweep.glob("*/results/*/*/candor/*/summary.parquet")])
    rows = rows[rows["acq_group"] == "__pooled__"]
    assert set(rows["dataset"]) == {"mimic_cxr", "chexpert"} and set(SEVERITY_WEIGHTS) <= set(rows["finding"])
    assert rows[rows["finding"].isin(list(SEVERITY_WEIGHTS))].groupby(["encoder", "dataset"]).size().min() == 12
    for enc, part in rows.groupby("encoder"):
        num = den = 0.0
        for finding, weight in SEVERITY_WEIGHTS.items():
            f = part[part["finding"] == finding]
            num += weight * (f["d"] * f["n_queries"]).sum() / f["n_queries"].sum()
            den += weight
        got = table.loc[table["Encoder"] == enc].iloc[0]
        assert got["D"] == pytest.approx(num / den)
        assert 0.0 <= got["D_all"] <= 1.0 and 0.0 <= got["AUROC Margin"] <= 1.0
    # the matched groups are site x view, each query in exactly one
    per_sample = pd.concat([pd.read_parquet(f)
                            for f in sweep.glob("*/results/planted_blur/*/candor/edema/per_sample.parquet")])
    groups = set(per_sample["acq_group"])
    assert groups == {"mimic_cxr_PA", "mimic_cxr_AP", "chexpert_PA", "chexpert_AP"}
    assert (sweep / "tables" / "candor_associations.md").exists()
    overlap = pd.read_csv(sweep / "tables" / "candor_chest_overlap.csv").set_index("Finding")
    assert overlap.loc["All findings", "Pairs"] == 12 and set(SEVERITY_WEIGHTS) <= set(overlap.index)
    # the positive queries beside the paper's 22,133: per finding summed over the two sites
    queries = pd.read_csv(sweep / "tables" / "candor_chest_queries.csv").set_index("Finding")
    chest = rows[rows["finding"].isin(list(SEVERITY_WEIGHTS))]
    ours = chest.groupby(["finding", "encoder"])["n_queries"].sum().groupby("finding").max()
    assert queries.loc["All findings", "Positive queries"] == ours.sum() > 0
    assert queries.loc["All findings", "Paper"] == 22133 and queries["Paper"].drop("All findings").isna().all()
    # the planted marker: edema positives are concordant under the marker-sensitive encoder only
    edema = rows[rows["finding"] == "edema"].groupby("encoder")
    d_edema = (edema.apply(lambda f: (f["d"] * f["n_queries"]).sum() / f["n_queries"].sum()))
    assert d_edema["planted_sharp"] < 0.1 < 0.25 < d_edema["planted_blur"]
