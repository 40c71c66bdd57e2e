"""Paper-layout rendering: from a synthetic collected table in each
paper table's layout, markdown, LaTeX and CSV carry exactly the paper's columns in printed order,
with the best value bold and the second underlined per block."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from report_fixtures import ISSUE_TABLES

from robustbench_fm.core.tables import PaperTable
from robustbench_fm.paper import published
from robustbench_fm.report.render import ranks, render, to_latex, to_markdown


def synthetic(paper: str, version: str, number: int, seed: int = 0) -> PaperTable:
    """A collected table in the paper's layout: the published rows and columns, random numbers."""
    frame = published.wide(paper, number, version)
    values = np.random.default_rng(seed).uniform(0, 1, (len(frame), frame.shape[1] - 2))
    frame.iloc[:, 2:] = values
    name = f"{paper}_{'v1_' if version == 'v1' else ''}table{number}"
    return PaperTable(name, frame, best={c: "max" for c in frame.columns[2:]}, group_by="section")


def md_header(text: str) -> list[str]:
    return [c.strip() for c in text.splitlines()[0].strip("|").split("|")]


@pytest.mark.parametrize("paper,version,number", ISSUE_TABLES)
def test_rendered_columns_are_the_papers(paper, version, number, tmp_path):
    table = synthetic(paper, version, number)
    expected = ["section", "row"] + published.columns(paper, number, version)
    md, tex, csv = render(table, tmp_path)
    assert md_header(md.read_text()) == expected
    assert list(pd.read_csv(csv).columns) == expected
    head = tex.read_text().splitlines()[2].removesuffix(r" \\").split(" & ")
    assert head == [c.replace("_", r"\_").replace("%", r"\%") for c in expected]
    assert pd.read_csv(csv).shape[0] == len(published.wide(paper, number, version))


def test_bold_best_and_underlined_second_per_block():
    frame = pd.DataFrame({"section": ["a", "a", "a", "b", "b"], "row": list("vwxyz"),
                          "D": [0.30, 0.10, 0.20, 0.50, 0.40], "AUROC": [0.7, 0.9, 0.8, 0.6, 0.6]})
    table = PaperTable("candor_table2", frame, best={"D": "min", "AUROC": "max"}, group_by="section")
    assert ranks(table)["D"].tolist() == [0, 1, 2, 2, 1]  # per block: the 2-row block has a second
    assert ranks(table)["AUROC"].tolist() == [0, 1, 2, 1, 1]  # a tie shares the mark
    md = to_markdown(table)
    assert "| a | w | **0.100** | **0.900** |" in md and "| a | x | <u>0.200</u> | <u>0.800</u> |" in md
    tex = to_latex(table)
    assert r"a & w & \textbf{0.100} & \textbf{0.900} \\" in tex
    assert tex.count(r"\midrule") == 2  # under the header and between the two blocks
    assert r"\begin{tabular}{llrr}" in tex
