"""experiment=candor_heads (Table 4) and experiment=candor_failure_detection through the real CLI
on the five chest sites in their official layouts (tests/fixtures/chest_pool_fixtures.py) as one
manifest (dataset=chest_pool), with the two planted encoders: one job per encoder, the collect
step writing the tables in the paper's layout with the published values beside ours."""
from pathlib import Path

import cli_process
import numpy as np
import pandas as pd
import pytest
from chest_pool_fixtures import write_chest_pool
from omegaconf import OmegaConf

from robustbench_fm.data import build_manifest
from robustbench_fm.data.cards import CONFIG_DIR
from robustbench_fm.methods.heads.rows import draw_first, head_splits
from robustbench_fm.paper.published import text_numbers

pytestmark = pytest.mark.slow  # command-line subprocesses: the full suite runs them

SITES = ["mimic_cxr", "chexpert", "padchest", "vindr_cxr", "vindr_pcxr"]
COMMON = ["encoders=[planted_blur,planted_sharp]", "stage.findings=[pneumonia]", "stage.params.epochs=5",
          "stage.params.n_boot=50", "device=cpu", "extract.num_workers=0"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("chest_pool")
    write_chest_pool(root / "data", per_view=30)
    return root


def _manifest(root: Path) -> pd.DataFrame:
    members = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "dataset" / "chest_pool.yaml").options.members)
    return build_manifest("pool", root / "data", members=members)


def _run(root: Path, experiment: str, sweep: Path, *extra: str) -> None:
    cmd = ["-m", "robustbench_fm", "-m", f"experiment={experiment}", f"paths.root={root}",
           *COMMON, *extra, f"hydra.sweep.dir={sweep}"]
    proc = cli_process.run(cmd, timeout=400, cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (sweep / "missing.txt").read_text() == ""


def test_failure_detection_trains_on_mimic_and_tests_the_five_sites(root):
    sweep = root / "sweep_fd"
    _run(root, "candor_failure_detection", sweep, "stage.params.n_members=2", "stage.params.knn_k=10")
    jobs = sorted(p.name for p in sweep.iterdir() if (p / "status.json").exists())
    assert len(jobs) == 2  # one job per encoder on the pooled manifest
    m = _manifest(root)
    split = pd.Series(head_splits(m, seed=42), index=m["sample_id"])
    site = pd.Series(m["dataset"].to_numpy(), index=m["sample_id"])
    summ = pd.concat([pd.read_parquet(f).assign(encoder=f.parts[-5])
                      for f in sweep.glob("*/results/*/*/error_detection/pneumonia/summary.parquet")])
    for f in sweep.glob("*/results/*/*/error_detection/pneumonia/per_sample.parquet"):
        per = pd.read_parquet(f)
        # only test rows are scored, of every site, each under its own site's stratum: no MIMIC training row
        assert (split[per["sample_id"]] == "test").all()
        assert set(per["stratum"]) == set(SITES) and (site[per["sample_id"]].to_numpy() == per["stratum"]).all()
    table = pd.read_csv(sweep / "tables" / "candor_failure_detection.csv").set_index("Quantity")
    text = text_numbers()
    published = text[text["version"] == "v4"].set_index("quantity")["value"]
    assert table.loc["Combinations (encoder x finding x test site)", "Published"] == 573
    assert table.loc["r: mean AUROC", "Published"] == published["chest: mean AUROC of neighborhood impurity r for "
                                                                 "head errors"] == 0.522
    assert table.loc["Confidence significantly better than r (FDR)", "Published"] == 538
    # ours, recomputed from the jobs' per-site rows (the combinations where r and MSP are both scored)
    sites = summ[(summ["stratum"] != "__all__") & summ["auroc"].notna()]
    wide = sites.pivot_table(index=["encoder", "stratum"], columns="method", values="auroc")
    wide = wide.dropna(subset=["msp", "impurity"])
    assert table.loc["Combinations (encoder x finding x test site)", "Ours"] == len(wide) >= 6
    assert table.loc["r: mean AUROC", "Ours"] == pytest.approx(wide["impurity"].mean())
    assert table.loc["Confidence: mean AUROC (same images)", "Ours"] == pytest.approx(wide["msp"].mean())
    assert table.loc["Largest AUROC gap among MSP, max logit, energy", "Ours"] < 1e-6  # binary heads


def test_table4_scores_every_rule_on_one_pooled_test_sample(root):
    sweep = root / "sweep_t4"
    _run(root, "candor_heads", sweep, "stage.params.max_test=70")
    jobs = sorted(p.name for p in sweep.iterdir() if (p / "status.json").exists())
    assert len(jobs) == 2  # one job per encoder: the heads are trained once on the pooled chest domain
    per = {f.parts[-5]: pd.read_parquet(f)
           for f in sweep.glob("*/results/*/*/candor_heads/pneumonia/per_sample.parquet")}
    m = _manifest(root)
    split = head_splits(m, seed=42)
    drawn = set(m["sample_id"].to_numpy()[draw_first(np.flatnonzero(split == "test"), m["sample_id"].to_numpy(),
                                                        70, 42)])
    samples = {e: set(p.loc[p["in_sample"], "sample_id"]) for e, p in per.items()}
    labelled = set(m.loc[m["pneumonia"].isin([0, 1]), "sample_id"])
    # one stable-hash draw of <= 70 rows over the pooled test split, the same for both encoders, spanning the sites
    assert samples["planted_blur"] == samples["planted_sharp"] == drawn & labelled
    assert len({s.split("/")[0] for s in drawn}) >= 4
    table = pd.read_csv(sweep / "tables" / "candor_table4.csv").set_index("Rule")
    assert list(table.index) == ["Single head (mean of 2)", "Head chosen on validation", "Majority vote",
                                 "Mean probability of 2 heads", "Stacked logistic regression", "OR rule",
                                 "Oracle selector (candor_v1.md)"]
    assert table.loc["OR rule", "Published as"] == "OR rule"
    assert table.loc["OR rule", "Miss rate 263 published"] == 0.049
    # single head: the mean of the two heads' miss rates on the sample's positives (independent count)
    misses = []
    for p in per.values():
        pos = p[p["in_sample"] & (p["label"] == 1)]
        misses.append((~pos["pred"].astype(bool)).mean())
    assert table.loc["Single head (mean of 2)", "Miss rate All"] == pytest.approx(np.mean(misses))
    both = pd.concat([p.assign(encoder=e) for e, p in per.items()])
    pos = both[both["in_sample"] & (both["label"] == 1)].pivot(index="sample_id", columns="encoder", values="pred")
    assert table.loc["Oracle selector (candor_v1.md)", "Miss rate All"] == pytest.approx(
        (~pos.astype(bool)).all(axis=1).mean())
    assert table["Miss rate All ±"].notna().all() and (table["Miss rate All ±"] > 0).any()
    errors = pd.read_csv(sweep / "tables" / "candor_head_errors.csv").set_index("Encoder")
    assert errors.loc["Published (candor.md)", "MH difference"] == 0.136
    compare = pd.read_csv(sweep / "compare.csv")
    assert {"Single head (mean of 11)", "OR rule"} <= set(compare.loc[compare["table"] == "candor_table4", "row"])
