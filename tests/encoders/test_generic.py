"""Generic encoder entries: ``encoder=timm|hf|open_clip`` take a model id and read
the preprocessing from the library that owns the model; ``weights=random`` builds the architecture
offline. Each entry's features are compared with the library called directly (an independent
reference), and the cache keys of the three kinds and of a registry entry all differ."""
import math

import pandas as pd
import pytest
import torch

import robustbench_fm.encoders as enc
from robustbench_fm.core.errors import InvalidSetting, MissingInput, UnknownName, UserError
from robustbench_fm.encoders import generic
from robustbench_fm.features.key import cache_key, cache_key_fields


@pytest.fixture(scope="module")
def tiny_vit_folder(tmp_path_factory):
    """A small transformers ViT saved with its image processor (what a user's checkpoint folder holds)."""
    from transformers import ViTConfig, ViTImageProcessor, ViTModel

    folder = tmp_path_factory.mktemp("hf") / "tiny-vit"
    config = ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                       image_size=32, patch_size=8)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        ViTModel(config).save_pretrained(folder)
    ViTImageProcessor(size={"height": 40, "width": 40}, do_center_crop=True, crop_size={"height": 32, "width": 32},
                      image_mean=[0.4, 0.5, 0.6], image_std=[0.2, 0.25, 0.3], resample=2).save_pretrained(folder)
    return folder


def _batch(spec, n=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, spec.channels, spec.input_size, spec.input_size, generator=g)


def test_timm_reads_timms_preprocessing_and_random_weights_match_timm():
    import timm

    spec, path = generic.resolve("timm", "vit_tiny_patch16_224", weights="random")
    assert path is None and spec.name == "timm-vit_tiny_patch16_224" and not spec.pretrained
    cfg = timm.get_pretrained_cfg("vit_tiny_patch16_224")
    assert (spec.input_size, spec.mean, spec.std, spec.interpolation) == (224, cfg.mean, cfg.std, cfg.interpolation)
    assert spec.resize_size == math.floor(224 / cfg.crop_pct) == 248  # timm's eval transform
    assert (spec.embedding, spec.embed_dim) == ("pooled", 192)
    encoder = enc.load(spec, device="cpu")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(generic.SEED)
        ref = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0).eval()
    x = _batch(spec)
    with torch.inference_mode():
        torch.testing.assert_close(encoder.embed(x), ref.forward_head(ref.forward_features(x), pre_logits=True))
        patch = generic.load("timm", "vit_tiny_patch16_224", weights="random", embedding="patch_mean", device="cpu")
        torch.testing.assert_close(patch.embed(x), ref.forward_features(x)[:, 1:].mean(1))


def test_hf_folder_reads_its_image_processor_and_matches_automodel(tiny_vit_folder):
    from transformers import AutoModel

    spec, path = generic.resolve("hf", str(tiny_vit_folder))
    assert path == str(tiny_vit_folder)  # a saved folder is its own weights
    assert (spec.input_size, spec.resize, spec.resize_size) == (32, "shorter_center_crop", 40)
    assert spec.mean == (0.4, 0.5, 0.6) and spec.std == (0.2, 0.25, 0.3) and spec.interpolation == "bilinear"
    assert (spec.embedding, spec.embed_dim) == ("cls", 32)
    encoder = enc.load(spec, weights=path, device="cpu")
    assert encoder.weights_id.startswith("file:sha256:")
    ref = AutoModel.from_pretrained(tiny_vit_folder).eval()
    x = _batch(spec)
    with torch.inference_mode():
        torch.testing.assert_close(encoder.embed(x), ref(pixel_values=x).last_hidden_state[:, 0])
        pooled = generic.load("hf", str(tiny_vit_folder), embedding="pooled", device="cpu")
        torch.testing.assert_close(pooled.embed(x), ref(pixel_values=x).pooler_output)
    rand = generic.load("hf", str(tiny_vit_folder), weights="random", device="cpu")
    assert rand.weights_id == "random:seed=0" and not torch.allclose(rand.embed(x), encoder.embed(x))


def test_open_clip_random_image_tower_of_a_real_architecture():
    import open_clip

    spec, _ = generic.resolve("open_clip", "ViT-S-32", weights="random")
    cfg = open_clip.get_model_config("ViT-S-32")
    assert (spec.embed_dim, spec.input_size) == (cfg["embed_dim"], cfg["vision_cfg"]["image_size"])
    assert spec.mean == open_clip.OPENAI_DATASET_MEAN and spec.std == open_clip.OPENAI_DATASET_STD
    encoder = enc.load(spec, device="cpu")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(generic.SEED)
        ref = open_clip.create_model("ViT-S-32", pretrained=None).visual.eval()
    x = _batch(spec)
    with torch.inference_mode():
        torch.testing.assert_close(encoder.embed(x), ref(x))


def test_cache_keys_differ_between_kinds_and_from_registry_entries(tiny_vit_folder):
    manifest = pd.DataFrame({"sample_id": ["a", "b"], "path": ["a.png", "b.png"]})
    loaded = {"timm": generic.load("timm", "vit_small_patch16_224", weights="random", device="cpu"),
              "hf": generic.load("hf", str(tiny_vit_folder), weights="random", device="cpu"),
              "open_clip": generic.load("open_clip", "ViT-S-32", weights="random", device="cpu"),
              "registry": enc.load("random_vit_s", device="cpu")}
    keys = {k: cache_key(cache_key_fields(e, manifest, "/data")) for k, e in loaded.items()}
    assert len(set(keys.values())) == 4, keys
    # same architecture and seed source as the registry's random ViT-S, still its own entry
    assert loaded["timm"].spec.name != "random_vit_s" and loaded["registry"].spec.architecture in (
        "vit_small_patch16_224", None)
    assert enc.get("timm-vit_small_patch16_224") is loaded["timm"].spec  # found by name in this process
    assert "timm-vit_small_patch16_224" not in enc.names()  # the registry lists entries only


@pytest.mark.parametrize("kind, model, kwargs, error, message", [
    ("timm", None, {}, InvalidSetting, "encoder=timm needs encoder.model="),
    ("timm", "vit_tiny_patch16_224", {"embedding": "mean"}, InvalidSetting, "encoder.embedding=mean is not one of"),
    ("timm", "no_such_net_xyz", {"weights": "random"}, UnknownName, "timm knows no model 'no_such_net_xyz'"),
    ("timm", "resnet18", {"weights": "random", "embedding": "cls"}, InvalidSetting, "does not fit this model"),
    ("timm", "resnet18", {"pretrained": "x"}, InvalidSetting, "encoder.pretrained is for open_clip tags"),
    ("open_clip", "ViT-S-32", {"embedding": "cls", "weights": "random"}, InvalidSetting, "projected image embedding"),
    ("open_clip", "ViT-S-32", {}, InvalidSetting, "name the weights: encoder.pretrained=<tag>"),
    ("open_clip", "ViT-S-32", {"pretrained": "no_tag"}, UnknownName, "no pretrained tag 'no_tag' for 'ViT-S-32'"),
    ("hf", "/no/such/folder", {"weights": "/no/such/file.bin"}, MissingInput,
     "encoder.weights '/no/such/file.bin' not found"),
    ("clip", "x", {}, UnknownName, "'clip' is no generic encoder; one of timm, hf, open_clip"),
])
def test_bad_options_are_one_line(kind, model, kwargs, error, message):
    """Each is the user's: a UserError subclass (the CLI's one-line error, exit 2) that is also
    the built-in type code catching ValueError / KeyError / FileNotFoundError expects."""
    with pytest.raises(error) as err:
        generic.resolve(kind, model, **kwargs)
    builtin = {InvalidSetting: ValueError, UnknownName: KeyError, MissingInput: FileNotFoundError}[error]
    assert isinstance(err.value, UserError) and isinstance(err.value, builtin)
    text = str(err.value)
    assert message in text and "\n" not in text and text == err.value.args[0]  # no KeyError quotes


def test_derived_names_are_folder_safe(tmp_path):
    folder = tmp_path / "my model v2"
    folder.mkdir()
    assert generic.derived_name("hf", str(folder)) == "hf-my_model_v2"
    assert generic.derived_name("timm", "hf-hub:MahmoodLab/UNI") == "timm-MahmoodLab_UNI"
    assert generic.derived_name("open_clip", "ViT-B-32", "laion2b_s34b_b79k") == "open_clip-ViT-B-32-laion2b_s34b_b79k"


def test_doctor_diagnoses_generic_entries(tiny_vit_folder, monkeypatch, tmp_path):
    from huggingface_hub import constants

    from robustbench_fm.cli.doctor import report
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty_cache"))
    names = ["timm:vit_tiny_patch16_224", f"hf:{tiny_vit_folder}", "open_clip:ViT-B-32@openai", "open_clip:ViT-S-32"]
    text = report(names)
    rows = dict(zip(names, text.splitlines()[1:5]))
    assert [rows[n].split()[1] for n in names] == ["no", "yes", "no", "no"]
    assert "not in HF cache (timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k)" in rows[names[0]]  # timm's default tag
    assert "local folder tiny-vit" in rows[names[1]]
    assert "not in HF cache (timm/vit_base_patch32_clip_224.openai)" in rows[names[2]]  # open_clip's tag table
    assert "encoder.pretrained=<tag> or encoder.weights=PATH needed" in rows[names[3]]
    assert "1 of 4 encoders can run offline now" in text
    with pytest.raises(KeyError, match="doctor timm:<model>"):
        report(["timm"])


def test_timm_hub_model_from_a_downloaded_folder(tmp_path):
    """``encoder.model=hf-hub:<repo> encoder.weights=<folder>``: the folder's timm config.json (architecture,
    model_args, pretrained_cfg) sets the model and preprocessing offline; its weights load strictly."""
    import json

    import timm
    from safetensors.torch import save_file

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(5)
        ref = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0, img_size=64).eval()
    save_file(ref.state_dict(), tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps({
        "architecture": "vit_tiny_patch16_224", "model_args": {"img_size": 64},
        "pretrained_cfg": {"input_size": [3, 64, 64], "mean": [0.3, 0.3, 0.3], "std": [0.2, 0.2, 0.2],
                           "crop_pct": 1.0, "interpolation": "bilinear"}}))
    encoder = generic.load("timm", "hf-hub:someone/tiny-vit", weights=tmp_path, embedding="cls", device="cpu")
    spec = encoder.spec
    assert (spec.input_size, spec.resize_size, spec.mean, spec.interpolation) == (64, 64, (0.3,) * 3, "bilinear")
    assert spec.name == "timm-someone_tiny-vit" and encoder.weights_id.startswith("file:sha256:")
    x = _batch(spec)
    with torch.inference_mode():
        torch.testing.assert_close(encoder.embed(x), ref.forward_features(x)[:, 0])
