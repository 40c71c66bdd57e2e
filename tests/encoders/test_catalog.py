"""One source per model (encoders/catalog/): every timm and open_clip entry either takes its
preprocessing from the config its library publishes (checked here field by field against the
installed timm / open_clip, offline) or says why not: a stated reason per differing field, or the
card or paper its values come from where the library publishes nothing for those weights."""
from __future__ import annotations

import pytest

from robustbench_fm import encoders as enc
from robustbench_fm.encoders import generic
from robustbench_fm.encoders.catalog.library import LIBRARY, from_library
from robustbench_fm.encoders.spec import PREPROCESSING_FIELDS, EncoderSpec

LIBRARY_KINDS = ("timm:", "open_clip:")
ENTRIES = [n for n in enc.names() if enc.get(n).library in ("timm", "open_clip")]
CHECKED = [n for n in ENTRIES if (enc.get(n).preprocessing_from or "").startswith(LIBRARY_KINDS)]


def _preprocessing(fields: dict) -> dict:
    """``EncoderSpec.preprocessing()`` of these fields: the form the feature cache keys on."""
    return EncoderSpec(name="probe", library="timm", hub_id="probe", embedding="cls", embed_dim=1, params_m=0,
                       **fields).preprocessing()


def _drift(spec: EncoderSpec) -> list[str]:
    """What is wrong between an entry and its library config: a field that differs with no stated
    reason, or a reason stated for a field that does not differ (empty: the entry is right)."""
    ours, theirs = spec.preprocessing(), _preprocessing(generic.library_preprocessing(spec.preprocessing_from))
    differ = {f for f in PREPROCESSING_FIELDS if ours[f] != theirs[f]}
    problems = [f"{f}: {ours[f]!r} but {spec.preprocessing_from} says {theirs[f]!r}, and the entry states no reason"
                for f in sorted(differ - set(spec.preprocessing_differs))]
    problems += [f"{f}: a reason is stated but the entry equals {spec.preprocessing_from} ({ours[f]!r})"
                 for f in sorted(set(spec.preprocessing_differs) - differ)]
    problems += [f"{f}: the reason is empty" for f, why in spec.preprocessing_differs.items() if not str(why).strip()]
    return problems


@pytest.mark.parametrize("source", sorted(LIBRARY))
def test_library_table_is_what_the_library_publishes(source):
    """The torch-free table the entries derive from equals the installed library's config."""
    fresh = generic.library_preprocessing(source)
    assert _preprocessing(LIBRARY[source]) == _preprocessing(fresh), f"LIBRARY[{source!r}] is now {fresh}"
    assert set(LIBRARY[source]) == set(fresh) == set(PREPROCESSING_FIELDS)


def test_every_library_config_is_used():
    assert {enc.get(n).preprocessing_from for n in CHECKED} == set(LIBRARY)


@pytest.mark.parametrize("name", CHECKED)
def test_entry_equals_its_library_config_or_says_why(name):
    assert _drift(enc.get(name)) == []


@pytest.mark.parametrize("name", ENTRIES)
def test_every_entry_names_its_source(name):
    """An entry the library publishes a config for is checked against it; the others name the card
    or paper their values come from (no offline library config exists for those weights)."""
    import open_clip
    import timm

    spec = enc.get(name)
    source = spec.preprocessing_from or ""
    kind, _, model = source.partition(":")
    repo = spec.hub_id.split(":", 1)[1] if spec.hub_id.startswith(("hf-hub:", "hf_hub:")) else None
    published = []  # the library configs that describe exactly these weights
    if spec.library == "timm" and repo is None and timm.get_pretrained_cfg(spec.hub_id) is not None:
        published.append(f"timm:{spec.hub_id}")  # a timm name with or without its tag
        if kind == "timm" and timm.get_pretrained_cfg(model) == timm.get_pretrained_cfg(spec.hub_id):
            published.append(source)  # the same config by its full name (the default tag)
    if spec.library == "open_clip" and repo is not None:
        published += [f"open_clip:{m}/{t}" for m, t in open_clip.list_pretrained()
                      if m == spec.architecture and (open_clip.get_pretrained_cfg(m, t).get("hf_hub") or "").strip("/")
                      == repo]
    if source.startswith(LIBRARY_KINDS):
        assert kind == spec.library
        assert published == [] or source in published, f"{name}: {source} is not the config of its weights"
        if kind == "timm":  # the named config is of the architecture the entry builds
            assert model.split(".")[0] == (spec.architecture or spec.hub_id).split(".")[0]
        else:
            assert model.split("/")[0] == spec.architecture
    else:
        assert published == [], f"{name}: the library publishes {published}; derive from it (from_library)"
        assert source.startswith(("card: ", "paper: ")) and len(source) > 20, (
            f"{name}: say where the preprocessing comes from (preprocessing_from='card: ...' or 'paper: ...')")
        assert spec.preprocessing_differs == {}


def test_drift_is_caught():
    """A value changed by hand without a reason fails; so does a reason for a value that equals the library."""
    spec = enc.get("resnet50_in1k")
    assert _drift(spec) == []
    assert _drift(spec.replace(interpolation="bicubic")) == [
        "interpolation: 'bicubic' but timm:resnet50.tv_in1k says 'bilinear', and the entry states no reason"]
    assert _drift(spec.replace(mean=(0.5, 0.5, 0.5), preprocessing_differs={"mean": "the paper's recipe"})) == []
    assert _drift(spec.replace(preprocessing_differs={"std": "stale"})) == [
        "std: a reason is stated but the entry equals timm:resnet50.tv_in1k ([0.229, 0.224, 0.225])"]
    with pytest.raises(ValueError, match="preprocessing_differs names"):
        spec.replace(preprocessing_differs={"crop": "x"})


def test_from_library_keeps_the_reasons():
    kw = from_library("timm:vit_base_patch14_dinov2.lvd142m", input_size=(224, "CRoMa's size"))
    assert kw["input_size"] == 224 and kw["resize_size"] == 518 and kw["mean"] == (0.485, 0.456, 0.406)
    assert kw["preprocessing_from"] == "timm:vit_base_patch14_dinov2.lvd142m"
    assert kw["preprocessing_differs"] == {"input_size": "CRoMa's size"}


@pytest.mark.parametrize("name", ["resnet50_in1k", "vit_b32_in1k", "siglip2_l_512"])
def test_generic_entry_of_the_same_model_has_the_same_preprocessing(name):
    """encoder=timm|open_clip of the same weights (the model built on the meta device) preprocesses
    exactly as the catalog entry: one reader of the library's config, two ways in."""
    spec = enc.get(name)
    kind, _, model = spec.preprocessing_from.partition(":")
    model, _, tag = model.partition("/") if kind == "open_clip" else (model, "", "")
    resolved, _ = generic.resolve(kind, model, pretrained=tag or None, weights="random")
    assert resolved.preprocessing() == spec.preprocessing()
