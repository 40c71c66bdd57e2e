"""The shipped published values: every file parses, every value is
a number in its unit's range, the row counts are the README's, and the papers' internal
identities hold on the parsed numbers."""
from __future__ import annotations

import re
from importlib import resources

import numpy as np
import pandas as pd
import pytest
from report_fixtures import ISSUE_TABLES

from robustbench_fm.paper import published


def readme_counts() -> dict[str, int]:
    text = (resources.files("robustbench_fm.paper") / "published" / "README.md").read_text()
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^\| `([^`]+\.csv)` \| (\d+) \|", text, re.M)}


def test_every_file_parses_and_every_value_is_in_range():
    assert published.validate() == []
    cells, text = published.tables(), published.text_numbers()
    counts = pd.concat([cells, text])["file"].value_counts().to_dict()
    assert counts == readme_counts() and len(counts) == 30
    numeric = cells.dropna(subset=["value"])
    assert len(cells) - len(numeric) == 5  # CRoMa Table 2's n/d and n/a cells
    assert numeric["value"].dtype == float and np.isfinite(numeric["value"]).all()
    for unit in ("fraction_from_percent", "cosine", "rho"):
        v = numeric.loc[numeric["unit"] == unit, "value"]
        assert len(v) and v.between(-1, 1).all()


def test_printed_precision_and_percent_conversion():
    assert [published.decimals(v) for v in ("0.20", "86", "0.314", "1.000")] == [2, 0, 3, 3]
    t2 = published.table("candor", 2).set_index(["row", "column"])
    assert t2.loc[("RAD-DINO", "D"), "value"] == 0.277 and t2.loc[("RAD-DINO", "D"), "decimals"] == 3
    v1 = published.table("candor", 2, "v1").set_index(["row", "column"])  # printed as percent
    assert v1.loc[("RAD-DINO", "CANDOR Collapse"), "value"] == pytest.approx(0.277)


@pytest.mark.parametrize("paper,version,number", ISSUE_TABLES)
def test_every_issue_table_has_a_layout(paper, version, number):
    wide = published.wide(paper, number, version)
    cells = published.table(paper, number, version)
    assert list(wide.columns[:2]) == ["section", "row"]
    assert list(wide.columns[2:]) == list(dict.fromkeys(cells["column"]))
    assert wide.iloc[:, 2:].notna().sum().sum() == cells["value"].notna().sum()


def test_internal_identities_of_the_papers():
    for number in (3, 4, 5, 13):  # CRoMa: Δ = MaRI − RI to the printed precision
        w = published.wide("croma", number)
        assert (w["MaRI"] - w["RI"] - w["Δ"]).abs().max() <= 0.0011
    t1 = published.wide("spar", 1)  # SPAR: Table 5 repeats Table 1's TotalSegmentator columns
    zero_shot = t1[t1["section"].str.startswith("TotalSegmentator")].set_index("row")
    zero_shot.index = zero_shot.index.str.replace("ViT-Combined", "ViT-Comb")  # printed so in Table 5
    t5 = published.wide("spar", 5).set_index("row")
    for col in ("RelPos", "Orient", "Symm"):
        pd.testing.assert_series_equal(zero_shot[col], t5.loc[zero_shot.index, col], check_names=False)


def test_table_names_map_to_published_tables():
    assert published.parse_table_name("candor_table2") == ("candor", "v4", 2)
    assert published.parse_table_name("candor_v1_table4") == ("candor", "v1", 4)
    assert published.parse_table_name("croma_table3_camelyon") == ("croma", "", 3)
    assert published.parse_table_name("candor_calibration") is None
    with pytest.raises(KeyError, match="no published table"):
        published.table("croma", 99)
