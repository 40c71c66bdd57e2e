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
