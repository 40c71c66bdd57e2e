"""Issue 56 items 3: the extraction settings are one typed object (robustbench_fm.features.options.
ExtractOptions), declared once: the config's keys, the public embed()'s keywords and the object's fields
are tied together here, every value is checked once when the object is made, and the plan's object
reaches the Embedder, the feature store and the engine unchanged."""
import dataclasses
import inspect
from pathlib import Path

import pytest
from feature_fixtures import tiny_encoder, write_images
from omegaconf import OmegaConf

import robustbench_fm
from robustbench_fm.core.errors import InvalidSetting
from robustbench_fm.features import engine, serve, slides
from robustbench_fm.features.embed import Embedder
from robustbench_fm.features.engine import panel
from robustbench_fm.features.options import CONFIG_KEYS, DEFAULTS, SWEEP_KEYS, ExtractOptions
from robustbench_fm.features.store import FeatureStore

PACKAGE = Path(robustbench_fm.__file__).parent
FIELDS = [f.name for f in dataclasses.fields(ExtractOptions)]


def test_the_options_fields_are_exactly_the_config_keys_the_plan_reads():
    """A field added to ExtractOptions without its config key (or a key added to configs/config.yaml's
    extract node without a field) fails here."""
    assert list(CONFIG_KEYS) == FIELDS
    shipped = OmegaConf.load(PACKAGE.parent / "configs" / "config.yaml")
    extract_keys = {f"extract.{k}" for k in shipped.extract}
    assert extract_keys == {k for k in CONFIG_KEYS.values() if k.startswith("extract.")} | set(SWEEP_KEYS)
    for key in CONFIG_KEYS.values():  # device, security.allow_remote_code, cache.on_version_change too
        assert OmegaConf.select(shipped, key, default="absent") != "absent", key
    from robustbench_fm.pipeline import plan

    assert plan.ExtractOptions is ExtractOptions  # the plan's options are the features' (one class)


def test_embed_takes_its_extraction_keywords_from_the_options_with_their_defaults():
    from robustbench_fm.api import EMBED_FIXED, embed

    own = {"manifest", "encoder", "root", "model", "pretrained", "weights", "embedding", "cache_dir"}
    keywords = {n: p.default for n, p in inspect.signature(embed).parameters.items() if n not in own}
    assert set(keywords) | set(EMBED_FIXED) == set(FIELDS) and not set(keywords) & set(EMBED_FIXED)
    assert keywords == {n: getattr(DEFAULTS, n) for n in keywords}


@pytest.mark.parametrize("fn", [Embedder, FeatureStore.__init__, engine.extract_panel, engine.extract, engine.backend,
                                serve.extract_panel, serve.extract, slides.extract_slides])
def test_no_other_signature_declares_an_extraction_setting(fn):
    """The Embedder, store and engine take the object, not a list of its fields; ``batch_size`` is an
    encoder's own size and the engine's ``decode`` the recipe's the store hands with each entry."""
    declared = set(inspect.signature(fn).parameters)
    assert declared & set(FIELDS) <= {"batch_size", "decode"}
    if fn is not engine.extract_panel and fn is not engine.extract:
        assert "decode" not in declared


def test_every_value_is_checked_once_by_the_options_one_line_naming_the_setting():
    with pytest.raises(InvalidSetting) as err:
        ExtractOptions(on_bad_image="ignore")
    assert str(err.value) == ("on_bad_image='ignore': use error or skip (stop at an unreadable image, or leave it out "
                              "and list it in skipped.csv)")
    for settings, text in [({"batch_size": 0}, "extract.batch_size=0: use a whole number >= 1"),
                           ({"num_workers": "two"}, "extract.num_workers='two': use a whole number >= 0"),
                           ({"on_version_change": "x"}, "cache.on_version_change='x': use reuse, warn, recompute"),
                           ({"duplicates": "x"}, "extract.duplicates='x': use refuse"),
                           ({"decode": "x"}, "extract.decode='x': use scaled")]:
        with pytest.raises(InvalidSetting) as err:
            ExtractOptions.named(CONFIG_KEYS.__getitem__, **settings)
        assert str(err.value).startswith(text)
    assert ExtractOptions(batch_size="8", num_workers="auto").batch_size == 8  # a config's digits, as before
    # the policy check and the duplicate sample_id check each have one home in the package
    sources = {p: p.read_text() for p in PACKAGE.rglob("*.py")}
    assert [p.name for p, s in sources.items() if "not in BAD_IMAGE_POLICIES" in s] == ["options.py"]
    assert [p.name for p, s in sources.items() if "duplicate sample_id" in s] == ["store.py"]


def test_a_repeated_sample_id_is_refused_once_before_any_image_is_read(tmp_path):
    manifest = write_images(tmp_path, 3)[["sample_id", "path"]].assign(sample_id=["s0", "s1", "s1"])
    from robustbench_fm.features import extract

    for call in (lambda: Embedder(tmp_path / "a", ExtractOptions(device="cpu")).embed(manifest, tmp_path,
                                                                                       tiny_encoder()),
                 lambda: extract(tiny_encoder(), manifest, tmp_path, tmp_path / "b", progress=False)):
        with pytest.raises(InvalidSetting) as err:
            call()
        assert str(err.value) == "manifest row 2: duplicate sample_id 's1'; one row per image"
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()  # nothing hashed or written


class _Seen(Exception):
    pass


def test_the_embedders_options_reach_the_store_and_the_engine_unchanged(tmp_path, monkeypatch):
    manifest = write_images(tmp_path, 4)[["sample_id", "path"]]
    options = ExtractOptions(device="cpu", batch_size=2, shard_size=3, num_shards=2, shard=1, on_bad_image="skip")
    service = Embedder(tmp_path / "cache", options)
    assert service.store().options is options
    seen = []

    def spy(encoder, rows, root, cache_root, got, **kw):
        seen.append(got)
        raise _Seen

    monkeypatch.setattr(panel, "extract", spy)
    with pytest.raises(_Seen):
        service.embed_panel(manifest, tmp_path, [tiny_encoder()], sharded=True)
    assert seen[0] is options  # the run's part of each entry: the plan's object itself
    with pytest.raises(_Seen):
        service.embed(manifest, tmp_path, tiny_encoder())  # a stage's own images: every part
    assert seen[1] == dataclasses.replace(options, num_shards=1, shard=0) == options.whole()
