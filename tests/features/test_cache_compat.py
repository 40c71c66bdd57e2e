"""An existing feature cache is still hit after the package's modules moved: the cache keys of a
fixed manifest and image root equal the keys computed by the code before the renovation
(commit 9769547, keys below), with the package and library versions pinned (they are part of the
key on purpose: a new release re-embeds)."""
import pandas as pd
import pytest

from robustbench_fm import encoders
from robustbench_fm.features import key as feature_key

#: cache keys computed on 9769547 (before core/, methods/ and cli/ existed) with the same inputs
BEFORE = {"planted_sharp": "74f451045f0df7d5", "random_vit_s": "b325f018fac27642"}


@pytest.mark.parametrize("name", sorted(BEFORE))
def test_cache_keys_survive_the_renovation(name, monkeypatch):
    monkeypatch.setattr(feature_key, "package_version", lambda: "PINNED")
    monkeypatch.setattr(feature_key, "library_versions", lambda: {"torch": "PINNED"})
    manifest = pd.DataFrame({"sample_id": ["a", "b", "c"], "path": ["a.png", "b.png", "c.png"],
                             "pneumothorax": [0, 1, 0]})
    enc = encoders.load(name, device="cpu")
    # exact decoding (the pixels before issue 44) keeps the old key; scaled decoding is keyed apart
    exact = feature_key.cache_key_fields(enc, manifest, "/data/images", decode="exact")
    assert feature_key.cache_key(exact) == BEFORE[name]
    scaled = feature_key.cache_key_fields(enc, manifest, "/data/images", decode="scaled")
    assert scaled == {**exact, "decode": "scaled"} and feature_key.cache_key(scaled) != BEFORE[name]
