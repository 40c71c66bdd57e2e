"""Ours beside the published values: matching by (table, section,
row label through the alias map, column header), the half-unit / 1.96-sd interval, and the flag
on a planted out-of-interval cell."""
from __future__ import annotations

import pandas as pd
import pytest
from report_fixtures import candor_summary, job_config, write_job

from robustbench_fm.core.tables import PaperTable, SweepResults
from robustbench_fm.methods.candor.tables import CHEST_FINDINGS
from robustbench_fm.methods.candor.tables import candor_table2 as build
from robustbench_fm.paper import published
from robustbench_fm.report import compare

REGISTRY = {"RAD-DINO": "rad_dino", "DenseNet-121": "densenet121_xrv", "Random ViT-L": "random_vit_l"}


def candor_table2(changes: dict | None = None) -> PaperTable:
    """Table 2 as a builder would write it, with registry names for three encoders."""
    wide = published.wide("candor", 2).drop(columns="section")
    wide["row"] = wide["row"].map(lambda r: REGISTRY.get(r, r))
    frame = wide.rename(columns={"row": "Encoder"}).assign(Objective="SSL")
    for (row, col), value in (changes or {}).items():
        frame.loc[frame["Encoder"] == row, col] = value
    return PaperTable("candor_table2", frame)


def test_exact_reproduction_has_no_flag_and_every_cell_is_matched():
    cmp = compare.compare_table(candor_table2())
    assert len(cmp) == 66 == len(published.table("candor", 2))  # every printed cell, aliases resolved
    assert not cmp["outside"].any() and (cmp["difference"] == 0).all()
    d = cmp.set_index(["row", "column"])
    assert d.loc[("RAD-DINO", "D"), "tolerance"] == pytest.approx(0.0005)
    assert d.loc[("RAD-DINO", "Params (M)"), "tolerance"] == pytest.approx(0.5)


def test_a_planted_out_of_interval_value_is_flagged():
    cmp = compare.compare_table(candor_table2({("rad_dino", "D"): 0.277 + 0.002,
                                               ("DINOv3-S", "D_all"): 0.882 + 0.0004}))
    flagged = cmp[cmp["outside"]]
    assert flagged[["row", "column"]].values.tolist() == [["RAD-DINO", "D"]]
    assert flagged["difference"].iloc[0] == pytest.approx(0.002)
    within = cmp.set_index(["row", "column"]).loc[("DINOv3-S", "D_all")]
    assert within["interval_low"] == pytest.approx(0.8815) and not within["outside"]
    text = compare.to_markdown(cmp)
    assert "66 cells compared, 1 outside the published interval." in text and text.count("**outside**") == 1


def test_printed_standard_deviation_widens_the_interval():
    wide = published.wide("spar", 2)
    model = wide[wide["row"] == "Qwen2-VL-7B-Instruct"].iloc[0]
    mean, sd = model["Macro"], model["Macro_sd"]
    rows = pd.DataFrame({"Model": ["Qwen2-VL-7B-Instruct"] * 2, "Run": ["a", "b"],
                         "Macro": [mean + 2.0 * sd, mean + 2.5 * sd]})
    cmp = compare.compare_table(PaperTable("spar_table2", rows))
    assert cmp["tolerance"].iloc[0] == pytest.approx(0.0005 + compare.Z95 * sd)  # 2.5 sd > 0.0005 + 1.96 sd
    assert cmp["outside"].tolist() == [False, True]


def test_sections_disambiguate_and_ambiguous_cells_are_left_out():
    t1 = published.wide("spar", 1)
    word = t1[t1["section"].str.startswith("WORD")]
    no_section = PaperTable("spar_table1", word.drop(columns="section"))
    assert compare.compare_table(no_section).empty  # every (row, column) is printed for both cohorts
    cohort = word.assign(section="WORD (in domain)")  # one " / " part of the printed section
    cmp = compare.compare_table(PaperTable("spar_table1_word", cohort, group_by="section"))
    assert len(cmp) == word.iloc[:, 2:].notna().sum().sum() and not cmp["outside"].any()
    assert cmp["section"].str.startswith("WORD (in domain)").all()


def test_tables_without_published_counterpart_are_not_compared(tmp_path):
    frame = pd.DataFrame({"Encoder": ["UNI"], "D": [0.1]})
    assert compare.compare_table(PaperTable("candor_calibration", frame)).empty
    cmp = compare.write_compare([PaperTable("candor_calibration", frame), candor_table2()], tmp_path)
    back = pd.read_csv(tmp_path / "compare.csv")
    assert len(back) == len(cmp) == 66 and back["ours"].dtype == float and back["outside"].dtype == bool


def test_the_candor_table2_builder_output_is_matched(tmp_path):
    """The real builder on a synthetic sweep (registry names in, paper names out): D and D_all
    of both encoders find their published cells; the planted RAD-DINO D is the flagged one."""
    for k, (encoder, d, d_all) in enumerate([("rad_dino", 0.290, 0.732), ("random_vit_l", 0.463, 0.927)]):
        rows = pd.concat([candor_summary(encoder, f, 100, d, d_all)
                          for f in CHEST_FINDINGS]).assign(dataset="mimic_cxr")
        write_job(tmp_path, f"{k}_{encoder}", job_config("candor", "mimic_cxr"), rows)
    cmp = compare.compare_table(build(SweepResults(tmp_path))[0]).set_index(["row", "column"])
    rates = cmp.loc[[(r, c) for r in ("RAD-DINO", "Random ViT-L") for c in ("D", "D_all")]]
    assert rates["outside"].tolist() == [True, False, False, False]
    assert rates.loc[("RAD-DINO", "D"), "difference"] == pytest.approx(0.013)
