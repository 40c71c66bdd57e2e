"""CANDOR's ablation and control experiments end to end through the real command line, on chest
sites written in their real layouts (tests/fixtures/chest_fixtures.py: planted images, the marker
on the positives of one finding) with the two planted encoders: each sweep runs, and its collect
step writes the table in the paper's layout with the published value beside ours."""
import os
from pathlib import Path

import cli_process
import numpy as np
import pandas as pd
import pytest
from chest_fixtures import (
    write_chexpert_planted,
    write_mimic_cxr_planted,
    write_ms_cxr_boxes,
    write_padchest,
    write_rsna_pneumonia_planted,
    write_vindr_cxr,
    write_vindr_pcxr,
)

from robustbench_fm.methods.candor.tasks import SEVERITY_WEIGHTS

pytestmark = pytest.mark.slow  # command-line subprocesses: the full suite runs them

ENCODERS = "encoders=[planted_blur,planted_sharp]"


#: the override the sweeps on a repeated image need (tests/fixtures/chest_fixtures.py, ``same_image``)
KEEP = "extract.duplicates=keep"


def sweep(tmp_path: Path, experiment: str, *overrides: str) -> Path:
    out = tmp_path / f"sweep_{experiment}"
    cmd = ["-m", "robustbench_fm", "-m", f"experiment={experiment}", f"paths.root={tmp_path}",
           ENCODERS, "stage.params.n_boot=20", "device=cpu", "extract.num_workers=0", f"hydra.sweep.dir={out}",
           *overrides]
    proc = cli_process.run(cmd, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "missing.txt").read_text() == ""
    return out


def job_rows(out: Path, stage: str = "candor") -> pd.DataFrame:
    frames = []
    for f in out.glob(f"*/results/*/*/{stage}/*/summary.parquet"):
        cfg = (f.parents[5] / "config.yaml").read_text()
        frames.append(pd.read_parquet(f).assign(job=f.parents[5].name, config=cfg))
    return pd.concat(frames, ignore_index=True)


def test_box_verified_runs_on_the_pool_and_writes_the_ablation(tmp_path):
    rng = np.random.default_rng(0)
    mimic = tmp_path / "data" / "mimic-cxr-jpg" / "2.1.0"
    images = write_mimic_cxr_planted(mimic, rng, marker="Pneumothorax", same_as={"Pneumonia": "Pneumothorax"})
    boxed = images[images["Pneumothorax"] == 1].groupby("view").head(5)
    write_ms_cxr_boxes(mimic, boxed)
    write_rsna_pneumonia_planted(tmp_path / "data" / "rsna-pneumonia-detection-challenge", rng)
    out = sweep(tmp_path, "candor_ablation_box_verified")
    rows = job_rows(out, "candor_box_verified")
    assert set(rows["dataset"]) == {"pool"}
    table = pd.read_csv(out / "tables" / "candor_box_verified.csv").set_index("Encoder")
    assert table["pneumothorax boxed (ms_cxr): queries"].tolist() == [10, 10]  # 5 boxed positives per view
    assert table["pneumothorax all positives (mimic_cxr): queries"].tolist() == [18, 18]
    assert table["pneumonia boxed (rsna_pneumonia): queries"].tolist() == [8, 8]
    # the marker is on the positives: the marker-sensitive encoder never puts one beside a negative
    assert table.loc["planted_sharp", "pneumothorax boxed (ms_cxr): D"] == 0.0
    assert table.loc["planted_sharp", "pneumonia boxed (rsna_pneumonia): D"] == 0.0
    pooled = rows[(rows["acq_group"] == "__pooled__") & (rows["arm"] == "ms_cxr")].set_index("encoder")
    assert table.loc["planted_blur", "pneumothorax boxed (ms_cxr): D"] == pytest.approx(pooled.loc["planted_blur", "d"])
    pub = pd.read_csv(out / "tables" / "candor_box_verified_published.csv").set_index("Quantity")
    assert pub.loc["pneumothorax positives with MS-CXR boxes (queries)", "Published"] == 233
    assert pub.loc["pneumothorax positives with MS-CXR boxes (queries)", "Ours"] == 10
    assert pub.loc["RAD-DINO D on all pneumothorax positives", "Published"] == 0.184


def test_unmatched_pools_the_five_chest_sites_in_one_job(tmp_path):
    rng = np.random.default_rng(1)
    data = tmp_path / "data"
    write_mimic_cxr_planted(data / "mimic-cxr-jpg" / "2.1.0", rng, marker="Atelectasis")
    write_chexpert_planted(data / "CheXpert-v1.0-small", rng, marker="Atelectasis")
    write_padchest(data / "padchest")
    write_vindr_cxr(data / "vindr-cxr" / "1.0.0")
    write_vindr_pcxr(data / "vindr-pcxr" / "1.0.0")
    out = sweep(tmp_path, "candor_ablation_unmatched", KEEP)  # the fixtures' sites share one constant image
    rows = job_rows(out)
    assert set(rows["dataset"]) == {"pool"} and len(set(rows["job"])) == 4  # 2 encoders x matched/pooled
    groups = set(rows.loc[rows["n_queries"] > 0, "acq_group"])
    assert {"mimic_cxr_PA", "mimic_cxr_AP", "chexpert_PA", "chexpert_AP"} <= groups  # sites of one job
    pooled = rows[(rows["acq_group"] == "__pooled__") & rows["finding"].isin(["atelectasis", "cardiomegaly"])]
    pooled = pooled.assign(unmatched=pooled["config"].str.contains("unmatched: true"))
    table = pd.read_csv(out / "tables" / "candor_unmatched.csv")
    assert len(table) == 4
    for r in table.itertuples():
        mine = pooled[(pooled["encoder"] == r.Encoder) & (pooled["finding"] == r.Finding)].set_index("unmatched")
        assert r._3 == pytest.approx(mine.loc[False, "d"]) and r._4 == pytest.approx(mine.loc[True, "d"])
    sharp = table[(table["Encoder"] == "planted_sharp") & (table["Finding"] == "atelectasis")].iloc[0]
    assert sharp["D matched"] == 0.0 and sharp["D pooled"] == 0.0  # the marker separates at every site
    pub = pd.read_csv(out / "tables" / "candor_unmatched_published.csv").set_index("Quantity")
    diff = (table["D pooled"] - table["D matched"]).abs()
    assert pub.loc["mean |change| in D when pooling", "Ours"] == pytest.approx(diff.mean())
    assert pub.loc["mean |change| in D when pooling", "Published"] == 0.046


@pytest.fixture(scope="module")
def main_sites(tmp_path_factory):
    """MIMIC-CXR and CheXpert; MIMIC-CXR's AP images are one image repeated (every query there ties):
    the sweeps on it keep them (``extract.duplicates=keep``; the default refuses an image listed
    under two sample_ids)."""
    root = tmp_path_factory.mktemp("controls")
    rng = np.random.default_rng(2)
    write_mimic_cxr_planted(root / "data" / "mimic-cxr-jpg" / "2.1.0", rng, same_image=("AP",))
    write_chexpert_planted(root / "data" / "CheXpert-v1.0-small", rng)
    return root


def _chest_d(rows: pd.DataFrame) -> pd.Series:
    """Severity-weighted chest D per encoder from the jobs' pooled rows (sites pooled by queries)."""
    out = {}
    for enc, part in rows.groupby("encoder"):
        num = den = 0.0
        for finding, weight in SEVERITY_WEIGHTS.items():
            f = part[part["finding"] == finding]
            num += weight * (f["d"] * f["n_queries"]).sum() / f["n_queries"].sum()
            den += weight
        out[enc] = num / den
    return pd.Series(out)


def test_label_shuffle_and_equal_size_controls(main_sites):
    out = sweep(main_sites, "candor_control_shuffle", KEEP)
    rows = job_rows(out)
    rows = rows[(rows["acq_group"] == "__pooled__") & rows["finding"].isin(list(SEVERITY_WEIGHTS))]
    rows = rows.assign(shuffled=rows["config"].str.contains("shuffle_labels: true"))
    table = pd.read_csv(out / "tables" / "candor_shuffle.csv").set_index("Labels")
    for shuffled, label in ((True, "shuffled"), (False, "as given")):
        part = rows[rows["shuffled"] == shuffled]
        combos = part.groupby(["encoder", "finding"]).apply(
            lambda f: pd.Series({m: (f[m] * f["n_queries"]).sum() / f["n_queries"].sum() for m in ("d", "d_all")}))
        assert len(combos) == 24  # 2 encoders x 12 findings
        assert table.loc[label, "Median D (equal sets)"] == pytest.approx(combos["d"].median())
        assert table.loc[label, "Median D_all (unequal sets)"] == pytest.approx(combos["d_all"].median())
    pub = pd.read_csv(out / "tables" / "candor_shuffle_published.csv").set_index("Quantity")
    assert pub.loc["median D, labels shuffled (equal sets)", "Published"] == 0.498
    assert pub.loc["median D_all, labels shuffled (unequal sets)", "Published"] == 0.996

    out = sweep(main_sites, "candor_control_equal_size", KEEP)
    rows = job_rows(out)
    rows = rows[(rows["acq_group"] == "__pooled__") & rows["finding"].isin(list(SEVERITY_WEIGHTS))]
    equal = rows["config"].str.contains("equal_size: true")
    change = _chest_d(rows[equal]) - _chest_d(rows[~equal])
    table = pd.read_csv(out / "tables" / "candor_equal_size.csv").set_index("Encoder")
    for enc, value in change.items():
        assert table.loc[enc, "Change"] == pytest.approx(value)
    pub = pd.read_csv(out / "tables" / "candor_equal_size_published.csv").set_index("Quantity")
    assert pub.loc["largest |change| of an encoder's D", "Ours"] == pytest.approx(change.abs().max())
    assert pub.loc["largest |change| of an encoder's D", "Published"] == 0.0004


def test_tie_share_counts_the_queries_of_the_repeated_image(main_sites):
    out = sweep(main_sites, "candor_control_ties", KEEP)
    table = pd.read_csv(out / "tables" / "candor_ties.csv").set_index("Encoder")
    # every group holds 9 positives of each of the 12 findings, all sampled as queries; the 9 x 12
    # queries of MIMIC-CXR's AP group (one image repeated) tie, no other query does
    for enc in ("planted_blur", "planted_sharp"):
        assert table.loc[enc, "Queries"] == 4 * 9 * 12
        assert table.loc[enc, "Ties"] == 9 * 12
    assert table.loc["All encoders", "Ties (%)"] == pytest.approx(25.0)
    pub = pd.read_csv(out / "tables" / "candor_ties_published.csv")
    assert pub["Ours"].iloc[0] == pytest.approx(25.0) and pub["Published"].iloc[0] == pytest.approx(0.002)


def test_objective_experiment_groups_the_encoders_by_their_objective(tmp_path):
    """Six plugin encoders (tests/fixtures/objective_encoders.py: 2 "backbones" x 3 objectives) on
    MIMIC-CXR, 3 findings: per objective the mean D of its 6 cells."""
    rng = np.random.default_rng(3)
    write_mimic_cxr_planted(tmp_path / "data" / "mimic-cxr-jpg" / "2.1.0", rng, marker="Edema")
    fixtures = Path(__file__).resolve().parents[2] / "fixtures"
    out = tmp_path / "sweep"
    cmd = ["-m", "robustbench_fm", "-m", "experiment=candor_v1_objective", f"paths.root={tmp_path}",
           "plugins=[objective_encoders]",
           "encoders=[toy_s_it,toy_b_it,toy_s_ssl,toy_b_ssl,toy_s_sup,toy_b_sup]",
           "stage.findings=[edema,pneumothorax,atelectasis]", "stage.params.n_boot=0", "device=cpu",
           "extract.num_workers=0", f"hydra.sweep.dir={out}"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fixtures), os.environ.get("PYTHONPATH", "")])}
    proc = cli_process.run(cmd, timeout=600, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = job_rows(out)
    rows = rows[rows["acq_group"] == "__pooled__"].set_index(["encoder", "finding"])["d"]
    table = pd.read_csv(out / "tables" / "candor_objective.csv").set_index("Objective")
    arms = {"image-text": ["toy_s_it", "toy_b_it"], "self-supervised contrastive": ["toy_s_ssl", "toy_b_ssl"],
            "supervised": ["toy_s_sup", "toy_b_sup"]}
    assert list(table.index) == list(arms)
    for arm, names in arms.items():
        cells = [rows[(e, f)] for e in names for f in ("edema", "pneumothorax", "atelectasis")]
        assert table.loc[arm, "Cells"] == 6 and table.loc[arm, "Mean D"] == pytest.approx(np.mean(cells))
        assert table.loc[arm, "95% low"] <= table.loc[arm, "Mean D"] <= table.loc[arm, "95% high"]
    assert rows[("toy_s_sup", "edema")] == 0.0  # the marker-sensitive stand-in separates the marked finding
    pub = pd.read_csv(out / "tables" / "candor_objective_published.csv").set_index("Quantity")
    assert pub.loc["mean D, image-text", "Published"] == 0.446
    assert pub.loc["95% high, image-text", "Published"] == 0.652
    assert pub.loc["mean D, supervised", "Published"] == 0.329
