"""Test-wide settings (never touch the network) and shared fixtures."""
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


@pytest.fixture(scope="module")
def encoder():
    """The seeded tiny conv encoder of the extraction and cache tests (feature_fixtures.py)."""
    from feature_fixtures import tiny_encoder

    return tiny_encoder()
