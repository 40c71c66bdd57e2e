"""Test-wide settings (never touch the network) and shared fixtures.

The tests mirror the package (``tests/core``, ``tests/data``, ``tests/methods/candor``, ...);
helpers shared across folders live in ``tests/fixtures/`` (on ``sys.path`` here, imported by bare
name, e.g. ``from feature_fixtures import tiny_encoder``)."""
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

pytest_plugins = ["pathorob_roots"]  # PathoROB dataset roots (adapters, shortcut, CRoMa tests)


@pytest.fixture(scope="module")
def encoder():
    """The seeded tiny conv encoder of the extraction and cache tests (feature_fixtures.py)."""
    from feature_fixtures import tiny_encoder

    return tiny_encoder()


#: the longest test modules (measured: each a few minutes on 2 cores), started first so that the
#: two xdist workers (pyproject's ``-n 2 --dist loadscope``) do not end with one of them alone
LONGEST_FIRST = ("tests/methods/spar/test_spar_demo.py", "tests/e2e/test_readme.py", "tests/cli/test_panel_jobs.py")


def pytest_collection_modifyitems(config, items):
    """The :data:`LONGEST_FIRST` modules first, then the modules with slow tests, then the rest;
    collection order otherwise (a stable sort, the same in every worker)."""
    def key(item):
        path = item.nodeid.split("::")[0]
        if path in LONGEST_FIRST:
            return LONGEST_FIRST.index(path)
        return len(LONGEST_FIRST) + (0 if path in slow_modules else 1)

    slow_modules = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("slow")}
    items.sort(key=key)
