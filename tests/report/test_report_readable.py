"""Reports a newcomer can read. Blank rows say
why; the run report's title names the experiment, its top the panel that ran and how to read D;
intervals and integer counts; no pooled copy of a single matched group; figures with labelled
points and whole 0-1 axes; the sweep report with paper tables and a per-encoder summary first,
the long table last and collapsed, and the sweep's wall time; the demo's note on random_vit_s."""
from __future__ import annotations

import json
import re
from pathlib import Path

import cli_process
import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from report_fixtures import job_config, write_job

from robustbench_fm.api import evaluate
from robustbench_fm.cli import app
from robustbench_fm.core import results
from robustbench_fm.core.stats import spearman
from robustbench_fm.core.tables import PaperTable, SweepResults
from robustbench_fm.methods.candor import plots as candor_plots
from robustbench_fm.pipeline.job import MAX_REASONS, console_table
from robustbench_fm.report import html
from robustbench_fm.report.long_format import to_long

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"
DEMO = {"planted_blur": (0.46, 0.366, 0.56), "planted_sharp": (0.0, 0.0, 0.0), "random_vit_s": (0.71, 0.626, 0.796)}
REASON = "fewer than k+1=6 positives or negatives (3 positives, 40 negatives)"


def candor_rows(encoder: str, d: float, lo: float, hi: float, groups=("planted",), finding="marker",
                n: int = 100) -> list[dict]:
    """The candor stage's summary rows of one task: one row per matched group and the pool."""
    base = {"encoder": encoder, "dataset": "planted", "finding": finding, "target": finding, "n_queries": n,
            "n_pos": n, "n_neg": n, "bank_size": n, "k": 5, "d": d, "d_sd": 0.044, "d_ci_low": lo,
            "d_ci_high": hi, "d_all": d, "d_all_sd": 0.044, "d_all_ci_low": lo, "d_all_ci_high": hi,
            "margin_auroc": 0.52, "margin_auroc_sd": 0.04, "margin_auroc_ci_low": 0.445,
            "margin_auroc_ci_high": 0.595, "reason": ""}
    return [{**base, "acq_group": g} for g in groups] + [{**base, "acq_group": "__pooled__"}]


def blank_row(encoder: str, group: str, finding="marker") -> dict:
    """A matched group the stage could not score: NaN metrics and its reason."""
    row = candor_rows(encoder, np.nan, np.nan, np.nan, groups=(group,), finding=finding, n=0)[0]
    return {**row, "reason": REASON, "n_pos": 3, "n_neg": 40, "bank_size": pd.NA}


def run_folder(tmp_path: Path, summary: pd.DataFrame, cfg: dict | None = None) -> tuple[Path, pd.DataFrame, str]:
    """A finished run folder in the app's layout; returns (folder, long format, config yaml)."""
    cfg = cfg or job_config("candor", "planted", k=5, n_boot=1000)
    out = write_job(tmp_path, "13-38-26", cfg, summary)
    return out, to_long(summary, "candor", OmegaConf.create(cfg), out.name), OmegaConf.to_yaml(OmegaConf.create(cfg))


def demo_summary(extra: list[dict] = ()) -> pd.DataFrame:
    rows = [r for enc, (d, lo, hi) in DEMO.items() for r in candor_rows(enc, d, lo, hi)]
    return pd.DataFrame(rows + list(extra))


# --- item 8: blank results say why --------------------------------------------------------------

def test_not_scored_names_the_row_and_its_reason():
    summary = demo_summary([blank_row("planted_blur", "AP", finding="edema")])
    assert results.not_scored(summary) == [f"planted_blur, planted, edema, group AP: {REASON}"]
    assert results.not_scored(demo_summary()) == [] and results.not_scored(pd.DataFrame({"d": [0.5]})) == []


def test_console_table_lists_the_reasons_under_the_table():
    summary = demo_summary([blank_row("planted_blur", "AP", finding="edema")])
    table = console_table(summary, "candor")
    head, _, tail = table.partition("Not scored (1 row, blank above):")
    assert head.startswith("| encoder | finding | acq_group |") and "random_vit_s" in head
    assert tail.strip() == f"- planted_blur, planted, edema, group AP: {REASON}"
    assert "Not scored" not in console_table(demo_summary(), "candor")
    many = demo_summary([blank_row("planted_blur", f"G{i}", finding="edema") for i in range(MAX_REASONS + 3)])
    assert "... and 3 more" in console_table(many, "candor")


def test_run_report_lists_the_blank_rows_with_their_reason(tmp_path):
    out, long, yaml = run_folder(tmp_path, demo_summary([blank_row("planted_blur", "AP", finding="edema")]))
    md, page = (p.read_text() for p in html.write_report(html.run_report(out, yaml, long, 1.0), out))
    line = f"planted_blur, planted, edema, group AP: {REASON}"
    assert f"## Not scored\n\n- {line}" in md
    assert f"<h2>Not scored</h2><ul>\n<li>{line}</li>" in page.replace("&#x27;", "'")


@pytest.mark.slow  # the CLI on 10 planted images: 5 positives, too few for k = 5
def test_cli_prints_why_a_group_is_blank(tmp_path):
    """One matched group too small for k = 5 (3 positives), one scorable: the blank row's reason
    is printed under the console table and written to report.md and report.html."""

    import numpy as np

    rng = np.random.default_rng(0)
    groups = ["big"] * 40 + ["small"] * 6
    marker = [1, 0] * 20 + [1, 0] * 3
    manifest = pd.DataFrame({"sample_id": [f"s{i}" for i in range(46)], "path": [f"s{i}.png" for i in range(46)],
                             "patient_id": [f"p{i}" for i in range(46)], "acq_group": groups, "marker": marker})
    manifest.to_csv(tmp_path / "manifest.csv", index=False)
    emb = rng.normal(size=(46, 8)) + 2.0 * np.array(marker)[:, None]
    pd.DataFrame({"sample_id": manifest["sample_id"], "embedding": list(emb)}).to_parquet(tmp_path / "f.parquet")
    proc = cli_process.run(["-m", "robustbench_fm", f"paths.output_root={tmp_path}",
                           "experiment=from_features", f"features_file={tmp_path / 'f.parquet'}",
                           f"manifest_file={tmp_path / 'manifest.csv'}", "stage.findings=[marker]",
                           "stage.params.n_boot=20", "hydra.run.dir=" + str(tmp_path / "run")],
                           timeout=600, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr[-3000:]
    reason = "fewer than k+1=6 positives or negatives (3 positives, 3 negatives)"
    assert f"- f, manifest, marker, group small: {reason}" in proc.stdout
    assert "Not scored (1 row, blank above):" in proc.stdout
    assert reason in (tmp_path / "run" / "report.md").read_text()
    assert reason in (tmp_path / "run" / "report.html").read_text()


# --- item 12: the run report --------------------------------------------------------------------

def test_run_report_top_names_the_experiment_the_panel_and_how_to_read_it(tmp_path):
    out, long, yaml = run_folder(tmp_path, demo_summary())
    report = html.run_report(out, yaml, long, 11.1, experiment="demo")
    assert report.title == "demo: CANDOR on planted (3 encoders)"
    md, page = (p.read_text() for p in html.write_report(report, out))
    assert "<title>demo: CANDOR on planted (3 encoders)</title>" in page
    assert "<h1>demo: CANDOR on planted (3 encoders)</h1>" in page and md.startswith("# demo: CANDOR on planted")
    top = page[:page.index("<h2>Results</h2>")]  # what comes before the table
    assert "Encoders (3): planted_blur, planted_sharp, random_vit_s" in top
    assert "<h2>How to read this</h2>" in top and "D = 0.5 (chance) by construction" in top
    assert "lower is better" in top and "95% interval of 1,000 bootstrap resamples clustered by patient" in top
    assert "k = 5 nearest positives" in top and "D_all takes every positive and negative" in top
    assert html.run_report(out, yaml, long, 1.0).title == "CANDOR on planted (3 encoders)"  # no experiment


def test_run_report_shows_intervals_integer_counts_and_no_pooled_copy(tmp_path):
    out, long, yaml = run_folder(tmp_path, demo_summary())
    md, page = (p.read_text() for p in html.write_report(html.run_report(out, yaml, long, 1.0), out))
    results = page[page.index("<h2>Results</h2>"):page.index("</table>", page.index("<h2>Results</h2>"))]
    assert "<td>0.710 [0.626, 0.796]</td>" in results and "<th>d [95% CI]</th>" in results
    assert "<td>100</td>" in results and "100.000" not in page and "100.000" not in md
    assert "__pooled__" not in results and results.count("<tr>") == 1 + 3  # one matched group: no pooled copy
    assert "| planted_blur | marker | planted | 100 | 100 | 100 | 0.460 [0.366, 0.560] |" in md


def test_pooled_row_is_shown_when_there_are_several_groups():
    summary = pd.DataFrame(candor_rows("planted_blur", 0.4, 0.3, 0.5, groups=("AP", "PA")))
    table = html.summary_table(to_long(summary, "candor"))
    assert table["group"].tolist() == ["AP", "PA", "pooled"]
    one = html.summary_table(to_long(pd.DataFrame(candor_rows("planted_blur", 0.4, 0.3, 0.5, groups=("AP",))),
                                     "candor"))
    assert one["group"].tolist() == ["AP"] and one["n_queries"].tolist() == [100]
    chest = candor_rows("planted_blur", 0.45, 0.4, 0.5, groups=(), finding="__chest__")  # a pool across tasks
    both = html.summary_table(to_long(pd.DataFrame(candor_rows("planted_blur", 0.4, 0.3, 0.5, groups=("AP",))
                                                   + chest), "candor"))
    assert both[["task", "group"]].values.tolist() == [["marker", "AP"], ["__chest__", "pooled"]]


def test_positives_figure_labels_points_and_shows_the_whole_rate_axis():
    df = pd.DataFrame({"encoder": list(DEMO), "task": "marker", "n": 100.0,
                       "d": [v[0] for v in DEMO.values()], "d_all": [v[0] for v in DEMO.values()]})
    fig = candor_plots.positives_figure(df)
    ax = fig.axes[0]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["$D_{all}$ (all candidates)", "$D$ (equal sets)"]  # one value of n: no ρ, no "nan"
    assert not any("nan" in t for leg in fig.legends for t in [x.get_text() for x in leg.get_texts()])
    low, high = ax.get_ylim()
    assert low < 0 < 1 < high  # D = 0 is drawn whole
    assert [line.get_ydata()[0] for line in ax.lines] == [0.5] and ax.lines[0].get_linestyle() == "--"
    d_all, d = (c.get_offsets() for c in ax.collections)
    assert (d_all[:, 0] > d[:, 0]).all() and np.allclose(d_all[:, 1], d[:, 1])  # D_all beside D, not under it
    # each point names its encoder; the chance line says what it is
    assert sorted(t.get_text() for t in ax.texts) == sorted([*DEMO, "chance 1/2"])
    assert [t.get_text() for t in fig.legends[0].get_texts()] == list(DEMO)


def test_spearman_needs_three_distinct_points():
    # the CANDOR figures' rho is core.stats.spearman (one NaN policy for every table and figure)
    assert candor_plots.spearman is spearman
    assert np.isnan(spearman([100, 100, 200, 200], [0.5, 0.5, 0.4, 0.4]))  # 2 distinct points
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)


def test_collapse_figure_puts_tasks_on_x_and_is_left_out_with_one_task(tmp_path):
    df = pd.DataFrame({"encoder": ["a", "b", "c"] * 2, "task": ["t1"] * 3 + ["t2"] * 3, "d": 0.4})
    ax = candor_plots.collapse_figure(df).axes[0]
    assert ax.get_xlim() == (-0.5, 1.5) and [t.get_text() for t in ax.get_xticklabels()] == ["t1", "t2"]
    for coll in ax.collections:  # one marker set per encoder, beside its task
        assert np.all(np.abs(coll.get_offsets()[:, 0] - np.array([0, 1])) <= 0.3)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["a", "b", "c"]
    out, long, _ = run_folder(tmp_path, demo_summary())
    figs, notes = html.figures(SweepResults(out), long, out)
    assert [c.split(":")[0] for c, _ in figs] == ["candor_positives"] and notes == []


# --- item 13: the sweep report ------------------------------------------------------------------

def chest_like_sweep(sweep: Path, findings: int = 15) -> pd.DataFrame:
    """Two encoder jobs x ``findings`` findings x two matched groups, each with its start and end."""
    longs = []
    for k, enc in enumerate(["planted_blur", "planted_sharp"]):
        rows = [r for f in range(findings) for r in candor_rows(enc, 0.3 + 0.01 * f, 0.2, 0.6, groups=("AP", "PA"),
                                                                  finding=f"f{f:02d}")]
        cfg = job_config("candor", "planted")
        job = write_job(sweep, f"{k}_{enc}-planted-candor", cfg, pd.DataFrame(rows))
        (job / "status.json").write_text(json.dumps({"status": "done", "error": "", "start": 1000.0 + 10 * k,
                                                     "end": 1012.5 + 10 * k}))
        longs.append(to_long(pd.DataFrame(rows), "candor", OmegaConf.create(cfg), job.name))
    (sweep / "multirun.yaml").write_text("hydra:\n  runtime:\n    choices:\n      experiment: chest_candor\n")
    return pd.concat(longs, ignore_index=True)


def test_sweep_report_puts_tables_and_per_encoder_summary_first_and_the_long_table_last(tmp_path):
    long = chest_like_sweep(tmp_path / "sweep")
    table = PaperTable("candor_table2", pd.DataFrame({"Encoder": ["planted_blur"], "D": [0.37]}), caption="T2")
    report = html.sweep_report(tmp_path / "sweep", long, [table], [], seconds=8.6)
    assert report.title == "chest_candor sweep: CANDOR on planted (2 encoders, 2 jobs)"
    md, page = (p.read_text() for p in html.write_report(report, tmp_path / "sweep"))
    order = [page.index(h) for h in ("How to read this", "<h2>candor_table2</h2>", "<h2>Per encoder",
                                     "<h2>All results</h2>\n<details>", "<h2>Resolved config")]
    assert order == sorted(order) and "<h2>Results</h2>" not in page
    assert "90 rows (also in results_long.csv" in page  # 2 x 15 x (2 groups + pooled)
    assert page.index("<td>0.300 [0.200, 0.600]</td>") > page.index("<details>")
    per_encoder = report.by_encoder.set_index("encoder")
    assert per_encoder["tasks"].tolist() == [15, 15]  # the pooled rows, one per task
    assert per_encoder.loc["planted_blur", "median d"] == pytest.approx(0.37)
    assert "<details><summary>90 rows (also in [results_long.csv](results_long.csv))</summary>" in md
    assert md.index("## Per encoder") < md.index("## All results")


def test_sweep_runtime_is_the_wall_clock_of_the_jobs(tmp_path):
    long = chest_like_sweep(tmp_path / "sweep")
    report = html.sweep_report(tmp_path / "sweep", long, [], [], seconds=8.6)
    assert report.runtime_s == pytest.approx(22.5)  # earliest start 1000, last end 1022.5
    page = html.to_html(report)
    assert "Runtime: 22.5 s (wall clock from the earliest job start to the last job end" in page
    assert "the collect step took 8.6 s more" in page
    for job in (tmp_path / "sweep").glob("*/status.json"):
        job.write_text(json.dumps({"status": "done", "error": ""}))  # a job from before start/end were recorded
    assert html.sweep_report(tmp_path / "sweep", long, [], [], seconds=8.6).runtime_note.startswith(
        "the collect step only")


def test_each_job_records_its_start_and_end_even_when_it_fails(tmp_path, monkeypatch):
    def fails(*args):
        raise ValueError("boom")

    monkeypatch.setattr(app, "plan", lambda cfg, overrides, **kw: None)
    monkeypatch.setattr(app, "_run", fails)
    with pytest.raises(ValueError, match="boom"):
        app.run(None, tmp_path, None)
    rec = json.loads((tmp_path / "status.json").read_text())
    assert {"start", "end"} <= set(rec) and rec["start"] <= rec["end"] and rec["status"] == "failed"
    monkeypatch.setattr(app, "_run", lambda *a: pd.DataFrame({"x": [1]}))
    (tmp_path / "ok").mkdir()
    assert app.run(None, tmp_path / "ok", None)["x"].tolist() == [1]
    rec = json.loads((tmp_path / "ok" / "status.json").read_text())
    assert {"start", "end"} <= set(rec) and rec["status"] == "done"


# --- item 14: the demo's note on random_vit_s ---------------------------------------------------

def demo_config(tmp_path: Path):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose("config", overrides=[f"paths.root={tmp_path}", "experiment=demo"])


def test_demo_report_explains_why_random_vit_s_is_above_chance(tmp_path):
    cfg = demo_config(tmp_path)
    out, long, _ = run_folder(tmp_path, demo_summary())
    yaml = OmegaConf.to_yaml(cfg, resolve=True)
    md, page = (p.read_text() for p in html.write_report(html.run_report(out, yaml, long, 1.0, "demo"), out))
    notes = md[md.index("## Notes"):]
    assert "Why random_vit_s sits above 0.5" in notes and "positives spread apart" in notes
    assert "nearest positives end up less similar than their nearest negatives" in notes
    assert re.search(r"<h2>Notes</h2><p>Why random_vit_s sits above 0.5", page.replace("\n", ""))
    without = long[long["encoder"] != "random_vit_s"]  # e.g. the two-encoder multirun: no note
    assert html.run_report(out, yaml, without, 1.0, "demo").experiment_notes == []


def test_random_per_positive_shifts_raise_d_above_chance_and_a_shared_one_lowers_it():
    """The mechanism the demo's note states, on features with no label information: small
    random shifts of the positives (each its own direction) spread them apart, D > 0.5; the same
    size of shift in one shared direction pulls them together, D < 0.5."""
    rng = np.random.default_rng(0)
    base = rng.normal(size=(400, 64)) + 8.0  # one tight cloud, as a random ViT's embeddings (cosine ~ 0.99)
    labels = np.r_[np.ones(200), np.zeros(200)]
    manifest = pd.DataFrame({"sample_id": [f"s{i}" for i in range(400)], "path": "x", "patient_id":
                             [f"p{i}" for i in range(400)], "acq_group": "g", "marker": labels})

    def d(features):
        return evaluate("candor", features, manifest, finding="marker", n_boot=10).summary.iloc[-1]["d"]

    shift = 0.8 * rng.normal(size=(200, 64))
    own = base.copy()
    own[:200] += shift  # each positive its own direction
    direction = rng.normal(size=64)
    shared = base.copy()
    shared[:200] += np.linalg.norm(shift, axis=1).mean() * direction / np.linalg.norm(direction)  # one for all
    assert 0.4 < d(base) < 0.6
    assert d(own) > 0.6 and d(shared) < 0.3
