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
