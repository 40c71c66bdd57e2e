"""Issue 41 item 2: a volume without pixel spacing gets distance labels in the 224 frame (as
docs/methods/spar.md says), and the run's notes (notes.txt, the report's Notes) name it."""
from types import SimpleNamespace

import numpy as np
import pandas as pd

from robustbench_fm.core.results import read_notes, write_notes
from robustbench_fm.methods.spar.stage import spacing_notes
from robustbench_fm.report.html import run_report


def _samples(spacings: dict) -> SimpleNamespace:
    rows = [{"subject_id": s, "z": z, "spacing_x": sp, "spacing_y": sp} for s, sp in spacings.items() for z in (3, 4)]
    return SimpleNamespace(slice_table=pd.DataFrame(rows))


def test_each_volume_without_spacing_is_named_once_per_cohort(tmp_path):
    notes = spacing_notes({"word": _samples({"word_0001": 0.7, "word_0002": np.nan, "word_0003": np.nan}),
                           "transfer totalsegmentator": _samples({"s0001": 1.5})})
    assert notes == ["SPAR word: 2 volumes without pixel spacing in the NIfTI header (word_0002, word_0003): their "
                     "distance labels are in the 224 frame, not mm"]
    write_notes(tmp_path, notes)
    write_notes(tmp_path, notes + ["another"])  # a note is kept once
    assert read_notes(tmp_path) == [*notes, "another"]
    assert run_report(tmp_path, "", pd.DataFrame(), 0.0).notes == [*notes, "another"]
    assert spacing_notes({"word": _samples({"a": 0.7})}) == [] and read_notes(tmp_path / "none") == []


def _rows(cohort_probes: dict) -> pd.DataFrame:
    rows = []
    for cohort, probes in cohort_probes.items():
        for seed in (42, 123):
            rows += [{"head": "mlp", "mode": "frozen", "seed": seed, "eval_dataset": cohort, "finding": p,
                      "accuracy": 0.5} for p in [*probes, "macro"]]
            rows.append({"head": "mlp", "mode": "frozen", "seed": seed, "eval_dataset": cohort,
                         "finding": "localization", "accuracy": np.nan})
    return pd.DataFrame(rows)


def test_a_probe_no_slice_of_a_cohort_can_ask_marks_the_macro_partial_and_names_it():
    """Issue 41 item 4: an organ missing from every slice of a cohort dropped its probe silently
    and the Level 3 macro averaged fewer probes."""
    from robustbench_fm.methods.spar.stage import partial_macro

    five = ["relative_position", "orientation", "kidney_symmetry", "liver_size", "distance_compare"]
    no_kidneys = [p for p in five if p != "kidney_symmetry"]
    cohorts = {"word": SimpleNamespace(questions=pd.DataFrame({"probe": [*five, "tumour_count"]})),
               "totalsegmentator": SimpleNamespace(questions=pd.DataFrame({"probe": no_kidneys}))}
    rows, notes = partial_macro(_rows({"word": [*five, "tumour_count"], "totalsegmentator": no_kidneys}), cohorts)
    macro = rows[rows["finding"] == "macro"].set_index(["eval_dataset", "seed"])["macro_probes"]
    expected = "4 of 5 probes; dropped: kidney_symmetry (no slice of the cohort holds both kidneys)"
    assert macro[("totalsegmentator", 42)] == macro[("totalsegmentator", 123)] == expected
    assert macro[("word", 42)] == "" and macro[("word", 123)] == ""  # all six in domain, counting included
    assert notes == [f"SPAR totalsegmentator: the Level 3 macro average is partial, over {expected}"]
    complete, none = partial_macro(_rows({"word": five}), {"word": SimpleNamespace(questions=pd.DataFrame(
        {"probe": five}))})
    assert none == [] and "macro_probes" not in complete.columns  # no counting asked: five of five
