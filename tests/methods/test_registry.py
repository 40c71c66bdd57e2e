"""Methods register themselves: the shipped papers are found by discovery, and a method defined
in a module outside the package (tests/fixtures/toy_method.py) runs through ``evaluate`` once
imported, with no file of the package edited (docs/architecture.md, "Adding a method")."""
import sys

import numpy as np
import pandas as pd
import pytest

import robustbench_fm
from robustbench_fm import methods


def test_the_shipped_stages_are_discovered_from_their_packages():
    assert methods.names() == ["candor", "candor_box_verified", "candor_heads", "candor_lipschitz", "croma",
                               "error_detection", "linear_head", "logme", "mlp_head", "retention", "shortcut", "spar"]
    assert methods.method("candor").module == "robustbench_fm.methods.candor.stage"
    assert methods.method("retention").tables == "robustbench_fm.methods.candor.tables"
    assert [".".join(m.split(".")[2:]) for m in methods.table_modules()] == [
        "candor.controls", "candor.tables", "croma.tables", "heads.tables", "spar.tables"]


def test_an_unknown_stage_names_the_close_ones():
    with pytest.raises(KeyError, match="unknown stage 'candr'; did you mean candor"):
        methods.method("candr")


@pytest.fixture
def toy_plugin():
    """``toy_method`` loaded for one test, then taken out of the registry again, so no other test
    (whatever the order, e.g. under pytest-xdist) sees a stage the package does not ship."""
    methods.load_plugins(["toy_method"])
    yield
    methods.METHODS._entries.pop("toy_gap", None)
    sys.modules.pop("toy_method", None)


def test_a_method_from_outside_the_package_runs_through_evaluate(toy_plugin):
    rng = np.random.default_rng(0)
    feats = rng.normal(size=(40, 3)).astype(np.float32)
    manifest = pd.DataFrame({"sample_id": [f"s{i}" for i in range(40)], "f": [i % 2 for i in range(40)]})
    res = robustbench_fm.evaluate("toy_gap", feats, manifest, finding="f", scale=2.0)
    expected = 2.0 * (feats[1::2, 0].astype(np.float64).mean() - feats[0::2, 0].astype(np.float64).mean())
    assert res.summary["gap"].iloc[0] == pytest.approx(expected, rel=1e-12)
    assert res.summary["n"].iloc[0] == 40
    assert "toy_gap" in methods.names() and methods.method("toy_gap").console_columns[2] == "gap"


def test_a_plugin_that_cannot_be_imported_is_one_line():
    with pytest.raises(ValueError, match="plugins: cannot import 'no_such_plugin'"):
        methods.load_plugins(["no_such_plugin"])
