"""Methods register themselves: the shipped papers are found by discovery, and a method defined
in a module outside the package (tests/fixtures/toy_method.py) runs through ``evaluate`` once
imported, with no file of the package edited (docs/architecture.md, "Adding a method"). Each
stage's ``Method(...)`` is its one declaration, filled by every registered stage."""
import string
import sys

import numpy as np
import pandas as pd
import pytest

import robustbench_fm
from robustbench_fm import methods
from robustbench_fm.core.errors import InvalidSetting


def test_the_shipped_stages_are_discovered_from_their_packages():
    assert methods.names() == ["candor", "candor_box_verified", "candor_heads", "candor_lipschitz", "confounders",
                               "croma", "error_detection", "linear_head", "logme", "mlp_head", "retention", "shortcut",
                               "spar"]
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


def test_every_registered_method_fills_its_declaration(toy_plugin):
    """Display name, headline metrics with a direction and "How to read this" are declared by every
    stage (the shipped ones and the plugin), in its ``Method(...)``: a report reads nothing else."""
    assert "toy_gap" in methods.names()
    for name in methods.names():
        m = methods.method(name)
        assert m.display_name and m.title == m.display_name, name
        assert m.headline and all(h.better in methods.BETTER for h in m.headline), name
        headline = [h.name for h in m.headline]
        assert len(set(headline)) == len(headline), name
        # a headline metric is a metric: not a group, setting or count column, and on the console
        assert not set(headline) & {*m.group_columns, *m.param_columns, m.count_column}, name
        assert not m.console_columns or set(headline) <= set(m.console_columns), name
        text = m.guide and m.how_to_read()
        assert text and "\n\n" not in text and all(p == " ".join(p.split()) for p in text.split("\n")), name
        # every {field} of the guide is one of the stage's parameters
        fields = {f for _, f, _, _ in string.Formatter().parse(text) if f is not None}
        assert fields <= set(m.params.names() if m.params else ()), (name, fields)


def test_a_declaration_with_only_the_required_fields_gets_defaults():
    bare = methods.Method("bare", "a bare plugin", "bare_module")
    assert (bare.title, bare.headline, bare.how_to_read(), bare.count_column, bare.multi_finding) == (
        "bare", (), "", "n", False)
    one = methods.Method("one", "x", "m", headline=[("gap", "higher"), methods.Metric("err", "lower")],
                         guide="first line\n  goes on\n\n second paragraph\n")
    assert one.headline == (methods.Metric("gap", "higher"), methods.Metric("err", "lower"))
    assert one.how_to_read() == "first line goes on\nsecond paragraph"
    assert methods.Method("two", "x", "m", headline=[("gap", "higher")]).how_to_read() == \
        "Headline: gap (higher is better)."


@pytest.mark.parametrize("field, value, message", [
    ("headline", [("d", "smaller")], "method bad: headline metric 'd' has better='smaller'; use 'higher' or 'lower'"),
    ("headline", "auroc", "method bad: headline entry 'auroc' must be a Metric or a pair"),
    ("group_columns", "acq_group", "method bad: group_columns='acq_group' must be a tuple of column names"),
])
def test_a_bad_declaration_is_one_line(field, value, message):
    with pytest.raises(InvalidSetting) as err:
        methods.Method("bad", "x", "m", **{field: value})
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_a_guide_that_cannot_be_loaded_names_it():
    m = methods.Method("lost", "x", "m", guide="no_such_module_here:TEXT")
    with pytest.raises(InvalidSetting, match="method lost: guide 'no_such_module_here:TEXT' cannot be loaded"):
        m.how_to_read()


def test_the_long_format_reads_the_declaration_not_the_stage_module(monkeypatch):
    """The group, setting and count columns come from ``Method(...)``: no stage module (they import
    torch) is imported to read them."""
    from robustbench_fm.report.long_format import stage_conventions

    def no_import(name):
        raise AssertionError(f"stage module of {name} imported")

    monkeypatch.setattr(methods, "get", no_import)
    assert stage_conventions("candor") == (["acq_group", "target"], ["bank_size", "k"], "n_queries")
    assert stage_conventions("shortcut") == (["test_set"], ["chance", "n_splits", "iterations"], "n_test")
    assert stage_conventions("no_such_stage") == ([], [], "n")
    for name in methods.names():
        m = methods.method(name)
        assert stage_conventions(name) == (list(m.group_columns), list(m.param_columns), m.count_column)
