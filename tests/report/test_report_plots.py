"""CANDOR and SPAR figures: PNG and PDF are written and non-empty, and what
they draw is the data (Spearman in the legend against scipy, chance lines at 1/k, seed means)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy.stats import spearmanr

from robustbench_fm.methods.candor import plots as candor_plots
from robustbench_fm.methods.spar import plots as spar_plots


def check_files(paths):
    png, pdf = paths
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert pdf.read_bytes()[:5] == b"%PDF-" and pdf.stat().st_size > 1000


def test_candor_figures(tmp_path):
    rng = np.random.default_rng(1)
    n = np.array([40, 120, 400, 900, 3000, 40, 120, 400, 900, 3000])
    df = pd.DataFrame({"encoder": ["a"] * 5 + ["b"] * 5, "task": ["t1", "t2", "t3", "t4", "t5"] * 2, "n": n,
                       "d": rng.uniform(0.3, 0.5, 10), "d_all": 1 - n / 4000, "retention": rng.uniform(0.6, 1, 10)})
    legend = [t.get_text() for t in candor_plots.positives_figure(df).axes[0].get_legend().get_texts()]
    assert legend[0].endswith("ρ = -1.000")  # D_all falls strictly with the positives
    assert legend[1].endswith(f"ρ = {spearmanr(df['n'], df['d']).statistic:.3f}")
    ax = candor_plots.collapse_figure(df).axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["t1", "t2", "t3", "t4", "t5"]
    assert len(ax.collections) == 2  # one marker set per encoder
    check_files(candor_plots.plot_positives(df, tmp_path / "fig2"))
    check_files(candor_plots.plot_collapse(df, tmp_path / "fig2b"))
    check_files(candor_plots.plot_retention(df, tmp_path / "fig3"))
    with pytest.raises(ValueError, match="columns d_all missing"):
        candor_plots.positives_figure(df.drop(columns="d_all"))


def spar_summary() -> pd.DataFrame:
    """The spar stage's summary layout: per seed, per cohort, Level 3 probes plus macro and a Level 1 row."""
    rows = []
    for label in ("CNN-MLP", "RadDINO-Trans"):
        for cohort in ("word", "totalsegmentator"):
            for seed in (1, 2):
                for probe, acc, chance in (("relative_position", 0.9 + seed / 100, 0.5), ("orientation", 0.5, 0.25),
                                           ("macro", 0.7, 0.375)):
                    rows.append({"dataset": "word", "label": label, "finding": probe, "organ": "all", "seed": seed,
                                 "eval_dataset": cohort, "accuracy": acc - (cohort != "word") * 0.3,
                                 "chance": chance, "majority": chance,
                                 "prior": 0.8 if probe == "relative_position" else chance})
                rows.append({"dataset": "word", "label": label, "finding": "localization", "organ": "all",
                             "seed": seed, "eval_dataset": cohort, "accuracy": np.nan, "chance": np.nan})
    return pd.DataFrame(rows)


def test_spar_figures(tmp_path):
    table = spar_plots.probe_table(spar_summary())
    assert len(table) == 2 * 2 * 2  # configurations x probes x cohorts; macro and Level 1 left out
    word = table[(table["cohort"] == "word") & (table["probe"] == "relative_position")]
    assert word["accuracy"].tolist() == pytest.approx([0.915, 0.915]) and word["in_domain"].all()
    assert not table.loc[table["cohort"] == "totalsegmentator", "in_domain"].any()
    ax = spar_plots.probe_bars_figure(table[table["cohort"] == "word"]).axes[0]
    lines = [("" if c.get_label().startswith("_") else c.get_label(),
              sorted({float(y) for seg in c.get_segments() for y in seg[:, 1]})) for c in ax.collections]
    # per probe: chance, majority class, and the prior only where it is above both (relative position)
    assert lines == [("chance", [0.5]), ("majority class", [0.5]), ("question-only prior", [0.8]),
                     ("", [0.25]), ("", [0.25])]
    assert len(ax.patches) == 4  # 2 probes x 2 configurations
    check_files(spar_plots.plot_probe_bars(table[table["cohort"] == "word"], tmp_path / "bars"))
    check_files(spar_plots.plot_domain(table, tmp_path / "domain", in_domain="word", zero_shot="totalsegmentator"))
    with pytest.raises(ValueError, match="no rows of cohort 'amos'"):
        spar_plots.domain_figure(table, "word", "amos")
