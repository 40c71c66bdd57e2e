"""End to end: `python -m robustbench_fm -m experiment=croma_camelyon` with two small encoders on a
synthetic PathoROB-Camelyon root fans out one job per encoder, and its collect step re-scores
the panel at the lower-median k and writes Table 3 in the published layout plus the figures; the
same command without `-m` runs both jobs here and writes the same tables, byte for byte."""
from __future__ import annotations

import json

import cli_process
import pandas as pd
import pytest
from croma_sweeps import camelyon_root

from robustbench_fm.methods.croma.panel import median_k
from robustbench_fm.paper import published

pytestmark = pytest.mark.slow


def test_croma_camelyon_multirun_writes_table3(tmp_path):
    root = camelyon_root(tmp_path / "camelyon", slides_per_cell=2, tiles_per_slide=4)
    sweep = tmp_path / "sweep"
    args = ["experiment=croma_camelyon", "encoders=[planted_blur,planted_sharp]", f"dataset.root={root}",
            f"paths.root={tmp_path}", "device=cpu", "extract.num_workers=0", "stage.params.k_grid=[1,3,5,7]",
            "stage.params.m=3"]
    proc = cli_process.run(["-m", "robustbench_fm", "-m", *args, f"hydra.sweep.dir={sweep}"],
                           cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    unit = tmp_path / "unit"  # the experiment as one command: the same jobs here, then the same collect step
    proc = cli_process.run(["-m", "robustbench_fm", *args, f"hydra.run.dir={unit}"],
                           cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    tables = {p.name: p.read_bytes() for p in sorted((sweep / "tables").iterdir())}
    assert "croma_table3.csv" in tables and {p.name: p.read_bytes() for p in sorted((unit / "tables").iterdir())} \
        == tables
    jobs = sorted(p.name for p in sweep.iterdir() if (p / "entries.json").exists())
    assert jobs == ["0_planted_blur-pathorob_camelyon-croma", "1_planted_sharp-pathorob_camelyon-croma"]
    k_star = [int(pd.read_parquet(sweep / j / "summary.parquet")["k"].iloc[0]) for j in jobs]
    table = pd.read_csv(sweep / "tables" / "croma_table3.csv")
    columns = list(dict.fromkeys(published.table("croma", 3, "")["column"]))
    assert list(table.columns) == ["Model"] + columns
    assert sorted(table["Model"]) == ["planted_blur", "planted_sharp"]
    rescored = pd.read_parquet(sweep / "collect" / "median_k" / "results" / "planted_blur" / "pathorob_camelyon"
                               / "croma" / "bio_label" / "summary.parquet")
    assert int(rescored["k"].iloc[0]) == median_k(k_star) == min(k_star)
    row = table.set_index("Model").loc["planted_blur"]
    assert row["RI"] == pytest.approx(rescored["ri"].iloc[0]) and row["support"] == pytest.approx(
        rescored["support"].iloc[0])
    panel = json.loads((sweep / "collect" / "median_k" / "panel.json").read_text())
    assert panel["protocol"] == "median-k" and len(panel["benchmarks"]["pathorob_camelyon"]) == 2
    for fig in ("ridgeline", "pareto", "typed_distances"):
        assert (sweep / "figures" / f"pathorob_camelyon_{fig}.png").stat().st_size > 1000
    assert (sweep / "figures" / "croma_figure5_mean_ranks.png").stat().st_size > 1000  # Figure 5
    ranks = pd.read_csv(sweep / "figures" / "croma_figure5_mean_ranks.csv")
    assert sorted(ranks["encoder"]) == ["planted_blur", "planted_sharp"] and sorted(ranks["mean_croma_rank"]) == [1, 2]
    assert rescored["k_policy"].iloc[0] == f"k = {min(k_star)} (lower median of the k* of 2 encoders)"
    assert (sweep / "tables" / "croma_table8.md").is_file()
