"""A report reads what it says of a stage from the stage's ``Method(...)`` declaration alone
(display name, headline metrics, "How to read this", group / setting / count columns): a plugin
method gets a full report without editing the package, and report/ names no stage itself."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf
from report_fixtures import job_config, write_job

from robustbench_fm import methods
from robustbench_fm.core.errors import InvalidSetting
from robustbench_fm.report import html
from robustbench_fm.report.long_format import to_long

REPORT = Path(html.__file__).parent


@pytest.fixture
def toy_plugin():
    """``toy_method`` (tests/fixtures) registered for one test only."""
    methods.load_plugins(["toy_method"])
    yield
    methods.METHODS._entries.pop("toy_gap", None)
    sys.modules.pop("toy_method", None)


def test_a_plugin_method_gets_a_full_report(toy_plugin, tmp_path):
    """Two encoders × 21 findings of the toy stage (42 rows, so the per-encoder summary comes
    first): the title and the guide name it by its display name, the guide fills ``{scale}`` from
    the run, and the per-encoder table holds its headline metric alone (not ``pos_mean``)."""
    rng = np.random.default_rng(3)
    findings = [f"f{i:02d}" for i in range(21)]
    long, gaps = [], {}
    for k, encoder in enumerate(["enc_a", "enc_b"]):
        summary = pd.DataFrame({"encoder": encoder, "dataset": "ds", "finding": findings,
                                "gap": rng.normal(size=21).round(4), "pos_mean": rng.normal(size=21), "n": 30,
                                "reason": ""})
        cfg = job_config("toy_gap", "ds", scale=2.5)
        job = write_job(tmp_path, f"{k}_{encoder}-ds-toy_gap", cfg, summary)
        long.append(to_long(summary, "toy_gap", OmegaConf.create(cfg), job.name))
        gaps[encoder] = float(np.median(summary["gap"]))
    report = html.sweep_report(tmp_path, pd.concat(long, ignore_index=True), [], [], 0.5)
    md = html.to_markdown(report, tmp_path)
    assert report.title == "sweep: toy gap on ds (2 encoders, 2 jobs)"
    assert md.startswith("# sweep: toy gap on ds (2 encoders, 2 jobs)\n")
    assert ("**toy gap.** gap is the mean of the first feature, times scale = 2.5, over a finding's positives "
            "minus its mean over the negatives (0 for features blind to the finding, higher is better).\n\n"
            "pos_mean is the positives' mean alone.\n") in md
    assert list(report.by_encoder.columns) == ["encoder", "tasks", "median gap"]
    assert report.by_encoder["median gap"].tolist() == [gaps["enc_a"], gaps["enc_b"]]
    table = md[md.index("## Per encoder (median over tasks)"):]
    assert f"| enc_a | 21 | {gaps['enc_a']:.3f} |" in table and f"| enc_b | 21 | {gaps['enc_b']:.3f} |" in table
    page = html.to_html(report)
    assert "<h1>sweep: toy gap on ds (2 encoders, 2 jobs)</h1>" in page and "<p><b>toy gap.</b> gap is the mean" in page


def test_every_stage_has_a_guide_under_its_display_name():
    names = methods.names()
    guide = html.how_to_read(names)
    assert [title for title, _ in guide] == [methods.method(n).display_name for n in names]
    assert all(text and "{" not in text and "}" not in text for _, text in guide)
    assert html.how_to_read(["no_such_stage"]) == [] and html.report_title(None, ["no_such_stage"], [], []) == \
        "no_such_stage (0 encoders)"


def test_a_guide_is_filled_with_the_parameters_of_the_run_that_ran_the_stage():
    ran = OmegaConf.create({"stage": {"name": "candor", "params": {"k": 7, "n_boot": 2500}}})
    other = OmegaConf.create({"stage": {"name": "croma", "params": {"k": 7, "n_boot": 2500}}})
    [(_, text)] = html.how_to_read(["candor"], ran)
    assert "whose k = 7 nearest positives" in text and "interval of 2,500 bootstrap resamples" in text
    for cfg in (None, other):  # the defaults of CandorParams
        [(_, text)] = html.how_to_read(["candor"], cfg)
        assert "whose k = 5 nearest positives" in text and "interval of 1,000 bootstrap resamples" in text


def test_a_guide_naming_no_parameter_is_one_line(toy_plugin):
    lost = methods.Method("lost_field", "x", "toy_method", guide="uses {nope}", params=methods.method("toy_gap").params)
    methods.register(lost)
    try:
        with pytest.raises(InvalidSetting, match=r"method lost_field: its guide names \{nope\}, which is not one of "
                                                 r"its parameters \(scale\)"):
            html.how_to_read(["lost_field"])
    finally:
        methods.METHODS._entries.pop("lost_field")


def test_the_lipschitz_sweep_keeps_one_row_per_level_and_head():
    """candor_lipschitz declares its rows' keys (separation, head): every (level, head) row is a
    row of the report, with n_pairs as its count (without the declaration, 4 rows read as 1)."""
    summary = pd.DataFrame({"encoder": "synthetic", "dataset": "ds", "finding": "class_overlap",
                            "level": [0, 0, 1, 1], "separation": [2.0, 2.0, 0.5, 0.5],
                            "head": ["linear", "shallow"] * 2, "d": [0.1, 0.1, 0.4, 0.4],
                            "error": [0.0, 0.0, 0.2, 0.25], "violations": [0, 0, 0, 0], "n_pairs": 500})
    table = html.summary_table(to_long(summary, "candor_lipschitz"))
    assert table["group"].tolist() == ["2.0 / linear", "2.0 / shallow", "0.5 / linear", "0.5 / shallow"]
    assert table["error"].tolist() == [0.0, 0.0, 0.2, 0.25] and (table["n_pairs"] == 500).all()
    assert "level" not in table.columns and str(table["violations"].dtype) == "Int64"


def test_report_code_names_no_stage():
    """What is said of a stage lives in its declaration: no module or template of report/ spells a
    registered stage's name (published.py keys the papers' published numbers by paper)."""
    names = "|".join(re.escape(n) for n in methods.names())
    pattern = re.compile(rf"""["']({names})["']""")
    files = [p for p in [*REPORT.glob("*.py"), *REPORT.glob("templates/*")] if p.name != "published.py"]
    assert len(files) >= 7
    hits = [f"{p.name}: {m.group(0)}" for p in files for m in pattern.finditer(p.read_text())]
    assert hits == []
