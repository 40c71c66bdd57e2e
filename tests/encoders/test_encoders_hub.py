"""Hub encoder entries and the timm / open_clip / transformers loaders, fully offline.

No weights can be downloaded here, so every path is exercised with the libraries' real classes:
random-weight entries, the real architectures of the hub entries with random weights, tiny
checkpoints written to disk and read back through ``robustbench_fm.encoders.load`` (plain files,
folders, and a fake local Hugging Face cache), and the one-line errors for missing weights.
"""
from __future__ import annotations

import hashlib
import json
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before any hub library reads it

import pytest
import torch
from PIL import Image

import robustbench_fm.encoders as enc
from robustbench_fm.encoders import loaders

BIOMEDCLIP_CONFIG = {  # open_clip_config.json of microsoft/BiomedCLIP-PubMedBERT_256-vit_base_patch16_224
    "model_cfg": {
        "embed_dim": 512,
        "vision_cfg": {"timm_model_name": "vit_base_patch16_224", "timm_model_pretrained": False,
                       "timm_pool": "", "timm_proj": "linear", "image_size": 224},
        "text_cfg": {"hf_model_name": "microsoft/BiomedNLP-BiomedBERT-base-uncased-abstract",
                     "hf_tokenizer_name": "microsoft/BiomedNLP-BiomedBERT-base-uncased-abstract",
                     "hf_proj_type": "mlp", "hf_pooler_type": "cls_last_hidden_state_pooler",
                     "context_length": 256},
    },
    "preprocess_cfg": {"mean": [0.48145466, 0.4578275, 0.40821073],
                       "std": [0.26862954, 0.26130258, 0.27577711]},
}
RAD_DINO_PREPROCESSOR = {  # BitImageProcessor fields as in microsoft/rad-dino
    "image_processor_type": "BitImageProcessor", "do_resize": True, "size": {"shortest_edge": 518},
    "resample": 3, "do_center_crop": True, "crop_size": {"height": 518, "width": 518},
    "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
    "image_mean": [0.5307, 0.5307, 0.5307], "image_std": [0.2583, 0.2583, 0.2583], "do_convert_rgb": True,
}
CPU = "cpu"


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path_factory):
    """Offline, with an empty private HF cache, whatever ran before this module."""
    from huggingface_hub import constants
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path_factory.mktemp("hf_cache")))


def _sha16(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()[:16]


def _meta_params(build) -> float:
    with torch.device("meta"):
        m = build()
    return sum(p.numel() for p in m.parameters()) / 1e6


def _fake_hub_cache(repo_id: str, files: dict, commit: str = "0123456789abcdef0123456789abcdef01234567"):
    """Lay ``files`` (name -> source path) out as a Hugging Face cache snapshot of ``repo_id``."""
    from huggingface_hub import constants
    root = os.path.join(constants.HF_HUB_CACHE, "models--" + repo_id.replace("/", "--"))
    snap = os.path.join(root, "snapshots", commit)
    os.makedirs(snap)
    os.makedirs(os.path.join(root, "refs"))
    with open(os.path.join(root, "refs", "main"), "w") as f:
        f.write(commit)
    for name, src in files.items():
        os.link(src, os.path.join(snap, name))
    return commit


# ------------------------------------------------------------------ random baseline

def test_random_vit_s_offline_deterministic():
    rng_before = torch.get_rng_state()
    a = enc.load("random_vit_s", device=CPU)
    assert torch.equal(torch.get_rng_state(), rng_before), "loading must not touch the global RNG"
    b = enc.load("random_vit_s", device=CPU)
    assert a.weights_id == b.weights_id == "random:seed=0"
    imgs = [Image.new("RGB", (300, 260), (120, 30, 200)), Image.new("L", (240, 320), 77)]
    batch = torch.stack([a.transform(im) for im in imgs])
    assert batch.shape == (2, 3, 224, 224)
    fa, fb = a.embed(batch), b.embed(batch)
    assert fa.shape == (2, 384) and fa.dtype == torch.float32
    assert torch.equal(fa, fb)
    assert all(torch.equal(p, q) for p, q in zip(a.model.state_dict().values(), b.model.state_dict().values()))


# ------------------------------------------------------------------ real architectures, random weights

def test_dinov2_l_real_architecture():
    import timm
    spec = enc.get("dinov2_l")
    cfg = timm.models.get_pretrained_cfg(spec.hub_id)
    assert (cfg.input_size[-1] == spec.input_size and tuple(cfg.mean) == spec.mean
            and cfg.interpolation == spec.interpolation)
    # full size on the meta device: exact parameter count and output width, no compute
    assert (_meta_params(lambda: timm.create_model(spec.hub_id, pretrained=False, num_classes=0))
            == pytest.approx(spec.params_m, rel=2e-3))
    with torch.device("meta"):
        m = timm.create_model(spec.hub_id, pretrained=False, num_classes=0)
        assert m.forward_features(torch.empty(1, 3, 518, 518)).shape == (1, 1 + 37 * 37, spec.embed_dim)
    # real forward through the loader: same class and width, 2 blocks, small input (pos-embed interpolation)
    e = enc.load(spec.replace(pretrained=False, seed=0, model_kwargs={"depth": 2, "dynamic_img_size": True}),
                 device=CPU)
    assert type(e.model) is type(m) and e.model.patch_embed.patch_size == (14, 14)
    assert e.embed(torch.randn(1, 3, 56, 56)).shape == (1, spec.embed_dim)


def test_rad_dino_real_architecture():
    from transformers import Dinov2Config, Dinov2Model
    spec = enc.get("rad_dino")
    full = dict(model_type="dinov2", hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                patch_size=14, image_size=518, mlp_ratio=4)
    cfg = Dinov2Config(**{k: v for k, v in full.items() if k != "model_type"})
    assert _meta_params(lambda: Dinov2Model(cfg)) == pytest.approx(spec.params_m, rel=2e-3)
    e = enc.load(spec.replace(pretrained=False, seed=0, model_kwargs={"config": dict(full, num_hidden_layers=2)}),
                 device=CPU)
    assert type(e.model) is Dinov2Model and e.weights_id == "random:seed=0"
    x = torch.randn(1, 3, 56, 56)
    f = e.embed(x)
    assert f.shape == (1, spec.embed_dim)
    assert torch.allclose(f, e.model(pixel_values=x).pooler_output)  # CLS == pooler_output


def test_biomedclip_real_config_image_tower_roundtrip(tmp_path):
    """The real BiomedCLIP config offline: its BiomedBERT text config is not cached, so the loader
    builds the image tower alone and loads the checkpoint's ``visual.*`` keys strictly."""
    from open_clip.model import _build_vision_tower
    spec = enc.get("biomedclip")
    mc = BIOMEDCLIP_CONFIG["model_cfg"]
    with torch.device("meta"):
        visual = _build_vision_tower(mc["embed_dim"], mc["vision_cfg"])
    assert sum(p.numel() for p in visual.parameters()) / 1e6 == pytest.approx(spec.params_m, rel=2e-3)
    visual = visual.to_empty(device=CPU).eval()  # cheap random weights (a timm init of 86M params is slow here)
    gen = torch.Generator().manual_seed(0)
    for t in visual.state_dict().values():
        t.normal_(0, 0.02, generator=gen)
    (tmp_path / "open_clip_config.json").write_text(json.dumps(BIOMEDCLIP_CONFIG))
    torch.save({f"visual.{k}": v for k, v in visual.state_dict().items()}, tmp_path / "open_clip_pytorch_model.bin")
    e = enc.load("biomedclip", weights=tmp_path, device=CPU)
    assert e.weights_id.startswith("file:sha256:")
    im = Image.new("RGB", (256, 300), (10, 200, 30))
    x = e.transform(im).unsqueeze(0)
    assert x.shape == (1, 3, 224, 224)
    assert e.embed(x).shape == (1, spec.embed_dim)
    got, want = e.model.state_dict(), visual.state_dict()  # every weight round-tripped (one forward is enough)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


# ------------------------------------------------------------------ tiny checkpoint round trips

TIMM_TINY = dict(img_size=32, patch_size=16, embed_dim=32, depth=1, num_heads=2, reg_tokens=2)
TIMM_HF_CONFIG = {  # the layout of a timm hub repo's config.json (e.g. MahmoodLab/uni)
    "architecture": "vit_small_patch16_224", "num_classes": 0, "num_features": 32, "global_pool": "token",
    "model_args": TIMM_TINY,
    "pretrained_cfg": {"tag": "", "custom_load": False, "input_size": [3, 32, 32], "fixed_input_size": True,
                       "interpolation": "bicubic", "crop_pct": 1.0, "crop_mode": "center",
                       "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225], "num_classes": 0,
                       "pool_size": None, "first_conv": "patch_embed.proj", "classifier": "head"},
}


def test_timm_checkpoint_roundtrip(tmp_path):
    from safetensors.torch import save_file
    spec = enc.get("random_vit_s").replace(name="tiny_timm", pretrained=True, seed=None, input_size=32,
                                           model_kwargs=TIMM_TINY, embedding="cls_patch_mean", embed_dim=64)
    ref = enc.load(spec.replace(pretrained=False, seed=3), device=CPU)
    x = torch.randn(2, 3, 32, 32)
    want = ref.embed(x)
    tokens = ref.model.forward_features(x)  # 1 CLS + 2 registers + 4 patches
    assert tokens.shape[1] == 7
    assert torch.allclose(want, torch.cat([tokens[:, 0], tokens[:, 3:].mean(1)], -1))  # registers excluded
    sd = ref.model.state_dict()
    save_file(sd, tmp_path / "w.safetensors")
    torch.save({"state_dict": sd}, tmp_path / "w.pth")
    for f in ("w.safetensors", "w.pth"):
        e = enc.load(spec, weights=tmp_path / f, device=CPU)
        assert e.weights_id == f"file:sha256:{_sha16(tmp_path / f)}"
        assert torch.equal(e.embed(x), want)
    # an HF snapshot folder (timm config.json + model.safetensors) for an hf-hub: entry
    snap = tmp_path / "snap"
    snap.mkdir()
    (snap / "config.json").write_text(json.dumps(TIMM_HF_CONFIG))
    save_file(sd, snap / "model.safetensors")
    e = enc.load(spec.replace(hub_id="hf-hub:someone/tiny-vit", model_kwargs={}), weights=snap, device=CPU)
    assert e.weights_id.startswith("file:sha256:") and torch.equal(e.embed(x), want)
    # a checkpoint that does not fit fails instead of leaving layers random
    other = enc.load(spec.replace(pretrained=False, seed=3, model_kwargs=dict(TIMM_TINY, depth=2)), device=CPU)
    save_file(other.model.state_dict(), tmp_path / "bad.safetensors")
    with pytest.raises(RuntimeError, match="does not fit"):
        enc.load(spec, weights=tmp_path / "bad.safetensors", device=CPU)


def _tiny_dinov2(folder, registers: bool = False, **pre):
    from transformers import (
        Dinov2Config,
        Dinov2Model,
        Dinov2WithRegistersConfig,
        Dinov2WithRegistersModel,
    )
    kw = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, mlp_ratio=2, patch_size=14, image_size=28)
    with loaders.seeded(5):
        model = (Dinov2WithRegistersModel(Dinov2WithRegistersConfig(num_register_tokens=2, **kw)) if registers
                 else Dinov2Model(Dinov2Config(**kw))).eval()
    model.save_pretrained(folder)
    pp = dict(RAD_DINO_PREPROCESSOR, size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28}, **pre)
    (folder / "preprocessor_config.json").write_text(json.dumps(pp))
    return model


def test_transformers_checkpoint_roundtrip(tmp_path):
    spec = enc.get("rad_dino").replace(input_size=28, resize_size=28, embed_dim=32)
    model = _tiny_dinov2(tmp_path / "plain")
    x = torch.randn(2, 3, 28, 28)
    e = enc.load(spec, weights=tmp_path / "plain", device=CPU)
    digest = hashlib.sha256(b"model.safetensors" + bytes(1)
                            + open(tmp_path / "plain" / "model.safetensors", "rb").read()).hexdigest()[:16]
    assert e.weights_id == f"file:sha256:{digest}"
    with torch.inference_mode():
        assert torch.equal(e.embed(x), model(pixel_values=x).last_hidden_state[:, 0])
    # the checkpoint file alone (config.json beside it) gives the same features and the file's hash
    f = enc.load(spec, weights=tmp_path / "plain" / "model.safetensors", device=CPU)
    assert f.weights_id == f"file:sha256:{_sha16(tmp_path / 'plain' / 'model.safetensors')}"
    assert torch.equal(f.embed(x), e.embed(x))
    # registers are excluded from patch_mean
    reg = _tiny_dinov2(tmp_path / "reg", registers=True)
    r = enc.load(spec.replace(embedding="patch_mean"), weights=tmp_path / "reg", device=CPU)
    with torch.inference_mode():
        h = reg(pixel_values=x).last_hidden_state
        assert h.shape[1] == 1 + 2 + 4
        assert torch.allclose(r.embed(x), h[:, 3:].mean(1))
    # preprocessing that disagrees with the entry is refused
    _tiny_dinov2(tmp_path / "bad", image_mean=[0.5, 0.5, 0.5])
    with pytest.raises(ValueError, match="disagrees.*mean"):
        enc.load(spec, weights=tmp_path / "bad", device=CPU)


def _tiny_open_clip(folder, **pre):
    import open_clip
    from transformers import BertConfig
    bert = folder.parent / f"{folder.name}_bert"
    BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
               max_position_embeddings=32).save_pretrained(bert)
    folder.mkdir()
    cfg = {"model_cfg": {"embed_dim": 16,
                         "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "head_width": 16, "patch_size": 16},
                         "text_cfg": {"hf_model_name": str(bert), "hf_tokenizer_name": str(bert), "hf_proj_type": "mlp",
                                      "hf_pooler_type": "cls_last_hidden_state_pooler", "context_length": 16}},
           "preprocess_cfg": dict(BIOMEDCLIP_CONFIG["preprocess_cfg"], **pre)}
    (folder / "open_clip_config.json").write_text(json.dumps(cfg))
    with loaders.seeded(7):
        model = open_clip.create_model(f"local-dir:{folder}", load_weights=False, pretrained_text=False).eval()
    torch.save(model.state_dict(), folder / "open_clip_pytorch_model.bin")
    return model


def test_open_clip_checkpoint_roundtrip(tmp_path):
    spec = enc.get("biomedclip").replace(input_size=32, embed_dim=16)
    model = _tiny_open_clip(tmp_path / "oc")
    e = enc.load(spec, weights=tmp_path / "oc", device=CPU)
    assert type(e.model) is type(model)  # the full open_clip model: its text tower config is a local folder
    assert e.weights_id.startswith("file:sha256:")
    x = e.transform(Image.new("RGB", (40, 50), (1, 2, 3))).unsqueeze(0)
    assert x.shape == (1, 3, 32, 32)
    x = torch.cat([x, torch.randn(1, 3, 32, 32)])
    with torch.inference_mode():
        assert torch.equal(e.embed(x), model.encode_image(x))
    _tiny_open_clip(tmp_path / "bad", mean=[0.5, 0.5, 0.5])
    with pytest.raises(ValueError, match="disagrees.*mean"):
        enc.load(spec, weights=tmp_path / "bad", device=CPU)


def test_hub_entries_load_from_local_cache(tmp_path):
    """Offline with the weights in the HF cache: the hub path loads, weights_id pins the commit."""
    x = torch.randn(1, 3, 28, 28)
    model = _tiny_dinov2(tmp_path / "td")
    commit = _fake_hub_cache("someone/tiny-dinov2", {n: tmp_path / "td" / n for n in
                                                     ("config.json", "model.safetensors", "preprocessor_config.json")})
    spec = enc.get("rad_dino").replace(hub_id="someone/tiny-dinov2", input_size=28, resize_size=28, embed_dim=32)
    e = enc.load(spec, device=CPU)
    assert e.weights_id == f"hub:someone/tiny-dinov2@{commit}"
    with torch.inference_mode():
        assert torch.equal(e.embed(x), model(pixel_values=x).last_hidden_state[:, 0])
    with pytest.raises(ValueError, match="disagrees"):  # the cached preprocessor_config is checked too
        enc.load(spec.replace(mean=(0.5, 0.5, 0.5)), device=CPU)

    from safetensors.torch import save_file
    tiny = enc.get("random_vit_s").replace(name="tiny_timm", hub_id="hf-hub:someone/tiny-vit", pretrained=True,
                                           seed=None, input_size=32, embed_dim=32)
    ref = enc.load(tiny.replace(hub_id="vit_small_patch16_224", pretrained=False, seed=2, model_kwargs=TIMM_TINY),
                   device=CPU)
    (tmp_path / "config.json").write_text(json.dumps(TIMM_HF_CONFIG))
    save_file(ref.model.state_dict(), tmp_path / "model.safetensors")
    commit = _fake_hub_cache("someone/tiny-vit", {n: tmp_path / n for n in ("config.json", "model.safetensors")})
    e = enc.load(tiny, device=CPU)
    assert e.weights_id == f"hub:hf-hub:someone/tiny-vit@{commit}"
    x = torch.randn(1, 3, 32, 32)
    assert torch.equal(e.embed(x), ref.embed(x))

    oc = _tiny_open_clip(tmp_path / "oc")
    commit = _fake_hub_cache("someone/tiny-clip", {n: tmp_path / "oc" / n for n in
                                                   ("open_clip_config.json", "open_clip_pytorch_model.bin")})
    spec = enc.get("biomedclip").replace(hub_id="hf-hub:someone/tiny-clip", input_size=32, embed_dim=16)
    e = enc.load(spec, device=CPU)
    assert e.weights_id == f"hub:hf-hub:someone/tiny-clip@{commit}"
    x = torch.randn(1, 3, 32, 32)
    with torch.inference_mode():
        assert torch.equal(e.embed(x), oc.encode_image(x))


# ------------------------------------------------------------------ errors

@pytest.mark.parametrize("name", ["dinov2_l", "rad_dino", "biomedclip"])
def test_offline_missing_hub_weights_one_line_error(name):
    spec = enc.get(name)
    t0 = time.monotonic()
    with pytest.raises(loaders.WeightsUnavailableError) as err:
        enc.load(name, device=CPU)
    assert time.monotonic() - t0 < 5
    msg = str(err.value)
    assert "\n" not in msg and spec.hub_id in msg and "encoder.weights=<folder>" in msg and "gated" not in msg
    with pytest.raises(loaders.WeightsUnavailableError, match="gated"):
        enc.load(spec.replace(gated=True), device=CPU)


def test_remote_code_refused():
    spec = enc.get("rad_dino").replace(name="remote_dino", trust_remote_code=True)
    with pytest.raises(PermissionError, match="trust_remote_code"):
        enc.load(spec, device=CPU, allow_remote_code=False)
    with pytest.raises(PermissionError, match="trust_remote_code"):  # the loader itself refuses as well
        enc.registry.loader("transformers")(spec, None, torch.device(CPU), False)
