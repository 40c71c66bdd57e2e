"""robustbench_fm.paper.figures: the helpers every paper's figures share."""
import pandas as pd
import pytest
from matplotlib.figure import Figure
from PIL import Image

from robustbench_fm.paper.figures import require_columns, save_figure


def test_a_missing_column_is_one_line_naming_it_and_what_the_table_holds():
    table = pd.DataFrame({"encoder": ["a"], "d": [0.5]})
    require_columns(table, ("encoder", "d"), "retention vs D")  # every column there: no error
    with pytest.raises(ValueError) as err:
        require_columns(table, ["encoder", "d", "retention"], "retention vs D")
    assert str(err.value) == ("retention vs D: columns retention missing (present: encoder, d); "
                              "pass a table with encoder, d, retention")
    with pytest.raises(ValueError) as err:
        require_columns(table.iloc[:0], ("encoder",), "pareto")
    assert str(err.value) == "pareto: the table is empty; nothing to plot"


def test_a_figure_is_written_as_png_at_150_dpi_and_pdf_beside_its_stem(tmp_path):
    fig = Figure(figsize=(2, 1))
    fig.add_subplot().plot([0, 1], [1, 0])
    paths = save_figure(fig, tmp_path / "figure_3.v2")  # the stem's own dots stay: not with_suffix
    assert paths == [tmp_path / "figure_3.v2.png", tmp_path / "figure_3.v2.pdf"]
    with Image.open(paths[0]) as png:
        assert png.format == "PNG" and png.info["dpi"] == pytest.approx((150, 150), abs=0.05)  # pHYs: 5906 px/m
    assert paths[1].read_bytes().startswith(b"%PDF-")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["figure_3.v2.pdf", "figure_3.v2.png"]  # no temp file left
