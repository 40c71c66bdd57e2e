"""Tables and reports through kept libraries: markdown through pandas
``DataFrame.to_markdown`` (tabulate) with one helper for every table, LaTeX through
``Styler.to_latex``, report.md and report.html through jinja2 templates shipped as package data.
Closed forms of each output, the markdown read back by an independent GFM parser, the page
checked to be well formed and escaped."""
from __future__ import annotations

import fnmatch
import tomllib
from html.parser import HTMLParser
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd
from markdown_it import MarkdownIt

from robustbench_fm.core.results import cell_text, to_markdown
from robustbench_fm.core.tables import PaperTable
from robustbench_fm.report import html
from robustbench_fm.report.render import to_latex
from robustbench_fm.report.render import to_markdown as table_markdown

REPO = Path(__file__).resolve().parents[2]


def mixed_frame() -> pd.DataFrame:
    return pd.DataFrame({"name": ["a b", " c", None], "x": [0.12345, np.nan, 2.0],
                         "n": pd.array([1, None, 30], dtype="Int64"), "flag": [True, False, True],
                         "f32": np.array([0.5, 0.25, 1.0], dtype=np.float32), "obj": [1, "s", pd.NA]})


def test_cell_text_closed_forms():
    assert [cell_text(v) for v in (0.5, np.float32(0.25), np.nan, None, pd.NA, 3, "x", True)] == [
        "0.500", "0.250", "", "", "", "3", "x", "True"]
    assert cell_text(1234.5, ".4g") == "1234" and cell_text(np.nan, na_rep="—") == "—"


def test_markdown_table_closed_form():
    expected = ("| name | x | n | flag | f32 | obj |\n"
                "|---|---|---|---|---|---|\n"
                "| a b | 0.123 | 1 | True | 0.500 | 1 |\n"
                "|  c |  |  | False | 0.250 | s |\n"
                "|  | 2.000 | 30 | True | 1.000 |  |\n")
    assert to_markdown(mixed_frame()) == expected
    marks = pd.DataFrame(0, index=range(3), columns=mixed_frame().columns)
    marks.loc[0, "x"], marks.loc[2, "x"], marks.loc[1, "f32"] = 2, 1, 1
    marked = to_markdown(mixed_frame(), ".2f", na_rep="-", marks=marks).splitlines()
    assert marked[2:] == ["| a b | <u>0.12</u> | 1 | True | 0.50 | 1 |",
                          "|  c | - | - | False | **0.25** | s |",
                          "| - | **2.00** | 30 | True | 1.00 | - |"]
    assert to_markdown(pd.DataFrame({"a": [], "b": []})) == "| a | b |\n|---|---|\n"


def test_markdown_table_reads_back_through_an_independent_gfm_parser():
    frame = pd.DataFrame({"encoder": ["rad_dino", "uni"], "D": [0.277, 0.31], "D_all": [0.9, np.nan]})
    marks = pd.DataFrame({"encoder": [0, 0], "D": [1, 2], "D_all": [1, 0]})
    tokens = MarkdownIt("commonmark", {"html": True}).enable("table").parse(
        to_markdown(frame, marks=marks))
    assert [t.type for t in tokens][:2] == ["table_open", "thead_open"]  # a GFM table, not a paragraph
    cells = [t for t in tokens if t.type == "inline"]
    assert [c.content for c in cells] == ["encoder", "D", "D_all", "rad_dino", "**0.277**", "**0.900**",
                                          "uni", "<u>0.310</u>", ""]
    bold = [c.content for c in cells if any(k.type == "strong_open" for k in c.children or [])]
    assert bold == ["**0.277**", "**0.900**"]


def test_paper_table_markdown_has_its_caption_and_marks():
    frame = pd.DataFrame({"Encoder": ["a", "b", "c"], "AUROC": [0.7, 0.9, np.nan]})
    table = PaperTable("t", frame, caption="Table 9: x", best={"AUROC": "max"}, decimals=2, na_rep="—")
    assert table_markdown(table) == ("**Table 9: x**\n\n| Encoder | AUROC |\n|---|---|\n"
                                     "| a | <u>0.70</u> |\n| b | **0.90** |\n| c | — |\n")


def test_latex_closed_form_with_blocks_marks_and_missing_cells():
    frame = pd.DataFrame({"section": ["s1", "s1", "s2", "s2", "s3"], "Model": ["m_1", "m2", "m3", "m4", "m5"],
                          "D": [0.2, 0.1, np.nan, 0.4, 0.5], "n": [10, 20, 30, 40, 50]})
    table = PaperTable("candor_table9", frame, caption="Table 9: 50% of D", best={"D": "min"},
                       group_by="section", decimals=2, na_rep="--")
    assert to_latex(table) == "\n".join([
        r"% Table 9: 50% of D",
        r"\begin{tabular}{llrr}",
        r"\toprule",
        r"section & Model & D & n \\",
        r"\midrule",
        r"s1 & m\_1 & \underline{0.20} & 10 \\",
        r"s1 & m2 & \textbf{0.10} & 20 \\",
        r"\midrule",
        r"s2 & m3 & -- & 30 \\",
        r"s2 & m4 & \textbf{0.40} & 40 \\",
        r"\midrule",
        r"s3 & m5 & \textbf{0.50} & 50 \\",
        r"\bottomrule",
        r"\end{tabular}", ""])


def test_latex_escapes_every_special_character():
    frame = pd.DataFrame({"a & b_c": ["50% $x$ #1 {y}", "~z ^w \\v"], "v": [1.0, 2.0]})
    lines = to_latex(PaperTable("x", frame)).splitlines()
    assert lines[2] == r"a \& b\_c & v \\"
    assert lines[4] == r"50\% \$x\$ \#1 \{y\} & 1.000 \\"
    assert lines[5] == r"\textasciitilde z \textasciicircum w \textbackslash v & 2.000 \\"


class _Tags(HTMLParser):
    """Open/close tags of a page, checked to nest properly; the text of each table cell."""

    VOID = {"meta", "br", "img"}

    def __init__(self):
        super().__init__()
        self.stack, self.cells, self.text = [], [], None

    def handle_starttag(self, tag, attrs):
        if tag not in self.VOID:
            self.stack.append(tag)
        if tag in ("td", "th"):
            self.text = ""

    def handle_endtag(self, tag):
        assert self.stack and self.stack.pop() == tag, f"</{tag}> closes {self.stack[-1:]}"
        if tag in ("td", "th"):
            self.cells.append(self.text)
            self.text = None

    def handle_data(self, data):
        if self.text is not None:
            self.text += data


def small_report(tmp_path: Path) -> html.Report:
    png = tmp_path / "figure_x.png"
    png.write_bytes(b"\x89PNG fake")
    return html.Report(
        "demo: <CANDOR> & 'co'", config_yaml="seed: 42\n", runtime_s=1.25, runtime_note="this run",
        summary=pd.DataFrame({"encoder": ["e<1>"], "d": [0.5], "n": [100.0]}), figures=[("fig: x", png)],
        cache=pd.DataFrame({"encoder": ["e<1>"], "images": [4.0]}), missing=["job 2: failed"],
        notes=["not drawn"], overview=["Encoders (1): e<1>", "Folder: /x"],
        guide=[("CANDOR", "first\nsecond")], not_scored=["e, t: why"], experiment_notes=["A note."])


def test_report_markdown_closed_form(tmp_path):
    report = small_report(tmp_path)
    assert html.to_markdown(report, tmp_path) == "\n".join([
        "# demo: <CANDOR> & 'co'", "",
        "Encoders (1): e<1>  ", "Folder: /x  ", "",
        "Runtime: 1.2 s (this run)", "",
        "## Failed or missing runs", "", "- job 2: failed", "",
        "## How to read this", "", "**CANDOR.** first", "", "second", "",
        "## Results", "", "| encoder | d | n |", "|---|---|---|", "| e<1> | 0.500 | 100.000 |", "",
        "## Not scored", "", "- e, t: why", "",
        "## Notes", "", "A note.", "",
        "![fig: x](figure_x.png)", "", "*fig: x*", "",
        "- not drawn", "",
        "## Feature cache", "", "| encoder | images |", "|---|---|", "| e<1> | 4 |", "",
        "## Resolved config", "", html.CONFIG_NOTE, "", "```yaml", "seed: 42", "```", ""])


def test_report_page_closed_form_escaped_and_well_formed(tmp_path):
    report = small_report(tmp_path)
    page = html.to_html(report)
    body = page[page.index("<body>") + len("<body>"):page.index("</body>")]
    assert body.strip("\n").split("\n") == [
        "<h1>demo: &lt;CANDOR&gt; &amp; &#39;co&#39;</h1>",
        "<p class='overview'>Encoders (1): e&lt;1&gt;<br>Folder: /x</p>",
        "<p>Runtime: 1.2 s (this run)</p>",
        "<h2>Failed or missing runs</h2><ul>", "<li>job 2: failed</li>", "</ul>",
        "<h2>How to read this</h2><div class='guide'>", "<p><b>CANDOR.</b> first</p><p>second</p>", "</div>",
        "<h2>Results</h2>",
        "<table><tr><th>encoder</th><th>d</th><th>n</th></tr><tr><td>e&lt;1&gt;</td><td>0.500</td><td>100</td></tr>"
        "</table>",
        "<h2>Not scored</h2><ul>", "<li>e, t: why</li>", "</ul>",
        "<h2>Notes</h2>", "<p>A note.</p>",
        "<figure><img alt='fig: x' src='data:image/png;base64,iVBORyBmYWtl'><figcaption>fig: x</figcaption></figure>",
        "<ul>", "<li>not drawn</li>", "</ul>",
        "<h2>Feature cache</h2>",
        "<table><tr><th>encoder</th><th>images</th></tr><tr><td>e&lt;1&gt;</td><td>4</td></tr></table>",
        "<h2>Resolved config</h2>", f"<p>{html.CONFIG_NOTE.replace(chr(39), '&#39;')}</p>", "<pre>seed: 42", "</pre>"]
    assert page.startswith("<!DOCTYPE html><html><head><meta charset='utf-8'><title>demo: &lt;CANDOR&gt;")
    tags = _Tags()
    tags.feed(page)
    assert tags.stack == [] and tags.cells == ["encoder", "d", "n", "e<1>", "0.500", "100", "encoder", "images",
                                               "e<1>", "4"]


def test_paper_table_cells_in_the_page_carry_the_marks(tmp_path):
    frame = pd.DataFrame({"Encoder": ["a", "b", "c"], "D": [0.3, 0.1, 0.2]})
    report = html.Report("t", tables=[PaperTable("candor_table2", frame, caption="T2", best={"D": "min"})])
    page = html.to_html(report)
    assert ("<table><tr><th>Encoder</th><th>D</th></tr><tr><td>a</td><td>0.300</td></tr>"
            "<tr><td>b</td><td><b>0.100</b></td></tr><tr><td>c</td><td><u>0.200</u></td></tr></table>") in page
    assert "<p>No cell of these tables has a published counterpart.</p>" in page
    tags = _Tags()
    tags.feed(page)
    assert tags.stack == [] and tags.cells == ["Encoder", "D", "a", "0.300", "b", "0.100", "c", "0.200"]


def test_templates_ship_as_package_data():
    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    folder = resources.files("robustbench_fm.report") / "templates"
    names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".j2"))
    assert names == ["anchors.html.j2", "anchors.md.j2", "neighbours.html.j2", "neighbours.md.j2", "report.html.j2",
                     "report.md.j2"]
    assert all(any(fnmatch.fnmatch(f"report/templates/{n}", g) for g in globs["robustbench_fm"]) for n in names)
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert {d.split(">")[0].split("=")[0] for d in deps} >= {"tabulate", "jinja2"}
