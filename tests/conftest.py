"""Test-wide settings (never touch the network) and shared fixtures.

The tests mirror the package (``tests/core``, ``tests/data``, ``tests/methods/candor``, ...);
helpers shared across folders live in ``tests/fixtures/`` (on ``sys.path`` here, imported by bare
name, e.g. ``from feature_fixtures import tiny_encoder``)."""
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

PYCACHE_ENV = "PYTHONPYCACHEPREFIX"


def pytest_configure(config):
    """One bytecode cache for the whole run when the environment writes none
    (``PYTHONDONTWRITEBYTECODE=1`` over a virtualenv without ``__pycache__``): otherwise every
    ``python -m robustbench_fm`` subprocess the suite starts compiles torch, sklearn, pandas, ...
    from source again (~10 s of CPU each, half a planted run's). The controller makes the folder and
    the workers and subprocesses inherit it (``PYTHONPYCACHEPREFIX``; Python validates each file
    against its source, so nothing stale is read); removed when the run ends."""
    if not sys.dont_write_bytecode and PYCACHE_ENV not in os.environ:
        return  # bytecode is written where it belongs (the usual case): nothing to do
    if PYCACHE_ENV not in os.environ:  # the controller (or a run without xdist)
        os.environ[PYCACHE_ENV] = tempfile.mkdtemp(prefix="robustbench_fm-pycache-")
        config._robustbench_pycache = os.environ[PYCACHE_ENV]
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.pycache_prefix = os.environ[PYCACHE_ENV]  # this process's later imports (torch, ...) fill it too
    sys.dont_write_bytecode = False


def pytest_unconfigure(config):
    folder = getattr(config, "_robustbench_pycache", None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


pytest_plugins = ["pathorob_roots"]  # PathoROB dataset roots (adapters, shortcut, CRoMa tests)


@pytest.fixture(scope="module")
def encoder():
    """The seeded tiny conv encoder of the extraction and cache tests (feature_fixtures.py)."""
    from feature_fixtures import tiny_encoder

    return tiny_encoder()
