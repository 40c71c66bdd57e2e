"""The report of a run that scanned confounders shows "What the neighbourhoods follow": one sentence per
encoder naming the column its neighbourhoods follow most against the strongest finding, and the scan table
(one row per column, one column per encoder), in report.md and report.html."""
import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf
from report_fixtures import job_config

from robustbench_fm.methods.confounders import section
from robustbench_fm.methods.run import score_and_save
from robustbench_fm.report import html
from robustbench_fm.report.long_format import to_long


def _cohort(seed=0, n_patients=120):
    rng = np.random.default_rng(seed)
    n = 2 * n_patients
    patient = np.repeat(np.arange(n_patients), 2)
    site = rng.integers(0, 2, n_patients)[patient]
    effusion = rng.integers(0, 2, n).astype(float)
    d = rng.standard_normal((3, 24)) / np.sqrt(24)
    noise = rng.standard_normal((n, 24)) / np.sqrt(24)
    manifest = pd.DataFrame({"sample_id": [f"s{i:03d}" for i in range(n)], "patient_id": [f"p{v:03d}" for v in patient],
                             "site": np.array(["north", "south"])[site], "effusion": effusion})
    by_site = 3.0 * d[site] + 0.3 * d[2] * effusion[:, None] + noise  # follows the site
    by_finding = 0.3 * d[site] + 3.0 * d[2] * effusion[:, None] + noise  # follows the finding
    return manifest, {"site_enc": by_site.astype(np.float32), "finding_enc": by_finding.astype(np.float32)}


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("scan_run")
    manifest, features = _cohort()
    parts = [s for enc, x in features.items()
             for s in score_and_save("confounders", x, manifest, ["effusion"], {"n_boot": 200}, out, enc, "mine")]
    summary = pd.concat(parts, ignore_index=True)
    config = OmegaConf.to_yaml(OmegaConf.create(job_config("confounders", "mine", n_boot=200)))
    (out / "config.yaml").write_text(config)
    long = to_long(summary, "confounders", OmegaConf.create(config), out.name)
    rep = html.run_report(out, config, long, 1.0)
    return summary, rep, html.to_markdown(rep, out), html.to_html(rep)


def _shown(row) -> str:
    return f"`{row['column']}` ({row['score']:.2f} [{row['score_ci_low']:.2f}, {row['score_ci_high']:.2f}])"


def test_each_encoder_gets_a_sentence_on_what_its_neighbourhoods_follow(report):
    summary, rep, md, page = report

    def row(encoder, column):
        return summary[(summary["encoder"] == encoder) & (summary["column"] == column)].iloc[0]

    site_enc = (f"site_enc: its neighbourhoods follow {_shown(row('site_enc', 'site'))} more than "
                f"{_shown(row('site_enc', 'effusion'))}.")
    finding_enc = (f"finding_enc: its neighbourhoods follow {_shown(row('finding_enc', 'effusion'))} more "
                   f"than any other column (the strongest: {_shown(row('finding_enc', 'site'))}).")
    [(title, lines, table)] = rep.sections
    assert title == "What the neighbourhoods follow" and sorted(lines) == sorted([site_enc, finding_enc])
    assert f"## What the neighbourhoods follow\n\n{lines[0]}\n\n{lines[1]}\n\n| column | kind |" in md
    assert "<h2>What the neighbourhoods follow</h2>" in page
    assert "<p>site_enc: its neighbourhoods follow <code>site</code> (" in page


def test_the_scan_table_has_a_row_per_column_and_a_column_per_encoder(report):
    summary, rep, md, _ = report
    [(_, _, table)] = rep.sections
    assert table.columns.tolist() == ["column", "kind", "values", "chance", "finding_enc", "site_enc"] or \
        table.columns.tolist() == ["column", "kind", "values", "chance", "site_enc", "finding_enc"]
    assert table["column"].tolist() == ["site", "effusion"] or table["column"].tolist() == ["effusion", "site"]
    row = summary[(summary["encoder"] == "site_enc") & (summary["column"] == "site")].iloc[0]
    cell = f"{row['score']:.3f} [{row['score_ci_low']:.3f}, {row['score_ci_high']:.3f}]"
    assert table.set_index("column").loc["site", "site_enc"] == cell and f"| {cell} |" in md
    assert table.set_index("column").loc["effusion", "kind"] == "finding"


def test_a_sentence_without_intervals_says_it_compares_point_scores():
    rows = pd.DataFrame({"column": ["site", "marker"], "kind": ["metadata", "finding"], "score": [0.4, 0.1],
                         "score_ci_low": [np.nan, np.nan], "score_ci_high": [np.nan, np.nan]})
    assert section.sentence("e", rows) == ("e: its neighbourhoods follow `site` (0.40) more than `marker` (0.10) "
                                           "(no intervals: point scores).")
    overlap = rows.assign(score_ci_low=[0.05, 0.0], score_ci_high=[0.6, 0.3])
    assert section.sentence("e", overlap) == ("e: its neighbourhoods follow `site` (0.40 [0.05, 0.60]) about as "
                                              "much as `marker` (0.10 [0.00, 0.30]) (the 95% intervals overlap).")
