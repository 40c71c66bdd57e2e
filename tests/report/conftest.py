"""One collected synthetic CANDOR sweep shared by the collector and report tests."""
from __future__ import annotations

import contextlib
import io

import pytest
from report_fixtures import candor_sweep

from robustbench_fm.cli.sweeps import collect


@pytest.fixture(scope="session")
def collected(tmp_path_factory):
    """``(sweep folder, combined table, console output)`` of :func:`collect` on :func:`candor_sweep`."""
    sweep = candor_sweep(tmp_path_factory.mktemp("report") / "sweep")
    console = io.StringIO()
    with contextlib.redirect_stdout(console):
        combined = collect(sweep)
    return sweep, combined, console.getvalue()
