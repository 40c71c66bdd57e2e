"""experiment=spar_demo end to end as a user runs it: phantoms, shallow random backbones, every
SPAR table written with the published row labels and column headers."""
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[3]


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
    t1 = tables[1]
    want = ["CNN-MLP", "CNN-Trans", "ViT-MLP", "ViT-Trans", "ViT-Combined", "random_vit_s-MLP", "random_vit_s-Trans",
            "Chance", "Majority class"]
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
