"""The report: report.md links the figures, report.html is one
file that opens offline (every image inlined, no external URL), with the config, the tables, the
comparison, the runtime and the feature-cache hits."""
from __future__ import annotations

import base64
import re
from pathlib import Path

import pandas as pd
import pytest

from robustbench_fm.cli import main as cli
from robustbench_fm.core.tables import PaperTable
from robustbench_fm.paper import published
from robustbench_fm.pipeline.job import record_entries
from robustbench_fm.pipeline.plan import Plan
from robustbench_fm.report import html

EXTERNAL = re.compile(r"(?:src|href|url)\s*[=(]\s*['\"]?(?!data:)[a-z]+:", re.I)


@pytest.mark.slow  # end to end: collect() on a synthetic sweep
def test_sweep_report_is_one_offline_file(collected, capsys):
    sweep, combined, _ = collected
    assert cli.compare(str(sweep)) == 2  # the demo experiment lists no paper tables
    assert "lists no paper tables; set report.tables" in capsys.readouterr().err
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == [  # only job folders: figures are files
        "0_planted_blur-planted-candor", "1_planted_sharp-planted-candor", "2_random_vit_s-planted-candor"]
    page = (sweep / "report.html").read_text()
    images = re.findall(r"<img [^>]*src='data:image/png;base64,([^']+)'", page)
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", (sweep / "report.md").read_text())
    assert links == ["figure_candor_positives.png", "figure_candor_collapse.png"]
    assert [base64.b64decode(i) for i in images] == [(sweep / link).read_bytes() for link in links]
    assert not EXTERNAL.search(page) and "http" not in page and "<script" not in page and "<link" not in page
    pooled = html._metrics(pd.read_parquet(sweep / "results_long.parquet"), "candor")  # what the figures plot
    assert len(pooled) == 6 and set(pooled["task"]) == {"marker", "effusion", "edema"}
    assert sorted(pooled["n"].unique()) == [40, 120, 400]
    assert "2_random_vit_s-planted-candor: failed (boom)" in page and "<pre>" in page  # missing run, config
    # the summary table: one matched group per task, so its pooled copy is not repeated
    assert page.count("<tr>") == 1 + len(combined[combined["acq_group"] != "__pooled__"])


def test_report_with_tables_comparison_and_cache(tmp_path):
    frame = published.wide("candor", 2).drop(columns="section").rename(columns={"row": "Encoder"})
    frame.loc[0, "D"] = 0.5  # RAD-DINO off its published 0.277
    table = PaperTable("candor_table2", frame, best={"D": "min"})
    job = Plan("planted", Path("/d"), ["planted_blur"], "candor", ["marker"], None)
    record_entries(tmp_path, job, [("planted_blur", Path("/cache/e1"), [])],
                   {"planted_blur": {"images": 40, "embedded": 0, "cached": 40, "hit": True, "seconds": 0.1}})
    report = html.Report("Run x", config_yaml="seed: 42\n", tables=[table],
                         compare=html.cmp_mod.compare_tables([table]), runtime_s=12.5,
                         cache=html.cache_hits([tmp_path]))
    md_path, page_path = html.write_report(report, tmp_path)
    page, md = page_path.read_text(), md_path.read_text()
    assert "Runtime: 12.5 s" in page and "Runtime: 12.5 s" in md
    best, second = sorted(frame["D"])[:2]
    assert f"<td><b>{best:.3f}</b></td>" in page and f"<td><u>{second:.3f}</u></td>" in page
    assert "66 cells compared, <span class='outside'>1</span> outside" in page
    assert "66 cells compared, 1 outside the published interval." in md
    assert report.cache.to_dict("records") == [{"job": tmp_path.name, "encoder": "planted_blur", "images": 40,
                                                "embedded": 0, "cached": 40, "hit": True, "seconds": 0.1}]
    assert "## Feature cache" in md and "seed: 42" in page
