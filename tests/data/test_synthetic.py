"""The planted-marker dataset and the two synthetic reference encoders (CANDOR calibration).

The calibration targets follow candor.md (200 images differing only by a small local marker):
the marker-blind ``planted_blur`` is at the chance level D = 1/2 and the marker-sensitive
``planted_sharp`` has D = 0. CANDOR is recomputed here by brute force in numpy, independently of
the package's stage, with k = 5 and the banks "all other positives" / "all negatives" (100 each).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image
from scipy import stats

from robustbench_fm import encoders
from robustbench_fm.data import build_manifest
from robustbench_fm.data import get as get_dataset
from robustbench_fm.data import manifest as mf
from robustbench_fm.data.synthetic import _draw_image_and_skewness, generate_planted

K = 5
CALIBRATION_SEEDS = (0, 1, 2, 3, 4)


# --------------------------------------------------------------------------- helpers
def candor_margins(z: np.ndarray, y: np.ndarray, k: int = K) -> np.ndarray:
    """DM = c- - c+ for every positive query (R+ = other positives, R- = all negatives)."""
    z = np.asarray(z, dtype=np.float64)
    z = z / np.linalg.norm(z, axis=1, keepdims=True)
    sim = z @ z.T
    pos, neg = np.flatnonzero(y == 1), np.flatnonzero(y == 0)
    dm = []
    for q in pos:
        c_pos = np.sort(sim[q, pos[pos != q]])[::-1][:k].mean()
        c_neg = np.sort(sim[q, neg])[::-1][:k].mean()
        dm.append(c_neg - c_pos)
    return np.asarray(dm)


def bootstrap_ci(flags: np.ndarray, n_boot: int = 1000, seed: int = 42) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    means = flags[rng.integers(0, len(flags), size=(n_boot, len(flags)))].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(lo), float(hi)


def transform_all(spec, root, paths) -> torch.Tensor:
    """The images as the encoder sees them: build_transform(spec) on each PIL image."""
    transform = encoders.build_transform(spec)
    images = []
    for p in paths:
        with Image.open(root / p) as im:
            images.append(transform(im))
    return torch.stack(images)


def embed(enc, batch: torch.Tensor, batch_size: int = 50) -> np.ndarray:
    return np.concatenate([enc.embed(batch[i:i + batch_size]).cpu().numpy()
                           for i in range(0, len(batch), batch_size)])


def file_bytes(root) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# --------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Per-image transforms are tiny ops: with 2 intra-op threads on a busy 2-core machine they
    spin-wait and run ~20x slower, so this module runs single-threaded (restored afterwards)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """seed -> (root, manifest) for the 200-image calibration sets."""
    base = tmp_path_factory.mktemp("planted")
    out = {}
    for seed in CALIBRATION_SEEDS:
        root = generate_planted(base / f"seed{seed}", n=200, seed=seed)
        out[seed] = (root, build_manifest("planted", root))
    return out


@pytest.fixture(scope="module")
def margins(planted):
    """(encoder, seed) -> DM of the 100 positive queries (computed lazily, once).

    Both entries share one preprocessing, so each set is transformed once per preprocessing.
    """
    inputs: dict = {}
    cache: dict = {}

    def get(name: str, seed: int) -> np.ndarray:
        if (name, seed) not in cache:
            root, df = planted[seed]
            enc = encoders.load(name, device="cpu")
            key = (seed, json.dumps(enc.spec.preprocessing(), sort_keys=True))
            if key not in inputs:
                inputs[key] = transform_all(enc.spec, root, list(df["path"]))
            cache[name, seed] = candor_margins(embed(enc, inputs[key]), df["marker"].to_numpy())
        return cache[name, seed]
    return get


# --------------------------------------------------------------------------- generator
def test_generator_is_deterministic(tmp_path):
    a = file_bytes(generate_planted(tmp_path / "a", n=12, size=96, seed=3))
    b = file_bytes(generate_planted(tmp_path / "b", n=12, size=96, seed=3))
    c = file_bytes(generate_planted(tmp_path / "c", n=12, size=96, seed=4))
    assert a == b
    assert a.keys() == c.keys()
    images = [k for k in a if k.endswith(".png")]
    assert len(images) == 12
    assert all(a[k] != c[k] for k in images)


def test_files_are_real_pngs_and_csv(planted):
    root, _ = planted[0]
    labels = pd.read_csv(root / "labels.csv")
    assert list(labels.columns) == ["image", "marker", "site"]
    assert len(labels) == 200 and labels["image"].is_unique
    assert set(labels["marker"]) == {0, 1}
    assert int(labels["marker"].sum()) == 100
    assert labels["site"].value_counts().to_dict() == {"site_a": 100, "site_b": 100}
    assert sorted(p.name for p in (root / "images").iterdir()) == sorted(labels["image"])
    for name in labels["image"].iloc[:5]:
        with Image.open(root / "images" / name) as im:
            assert im.format == "PNG" and im.mode == "L" and im.size == (224, 224)
            arr = np.asarray(im)
        assert arr.dtype == np.uint8 and arr.std() > 10  # a textured background, not a flat image
    assert json.loads((root / "generator.json").read_text())["seed"] == 0


@pytest.mark.parametrize("n, fraction, expected", [(11, 0.5, 6), (10, 0.3, 3), (9, 0.0, 0)])
def test_exact_number_of_positives(tmp_path, n, fraction, expected):
    root = generate_planted(tmp_path, n=n, size=64, seed=1, marker_fraction=fraction)
    assert int(pd.read_csv(root / "labels.csv")["marker"].sum()) == expected


def test_marker_is_the_only_difference():
    """Same draws with and without the marker differ only inside one small disk."""
    seq = np.random.SeedSequence(7)
    with_marker, skew_with = _draw_image_and_skewness(np.random.default_rng(seq), 224, marker=True)
    without, skew_without = _draw_image_and_skewness(np.random.default_rng(seq), 224, marker=False)
    with_marker, without = with_marker.astype(int), without.astype(int)
    assert skew_with == skew_without  # the site is read off the background, before the marker
    diff = np.argwhere(with_marker != without)
    assert 20 <= len(diff) <= 49  # a ~7 px disk
    assert np.ptp(diff, axis=0).max() <= 7
    assert (with_marker >= without).all()


def test_adapter_builds_a_valid_manifest(planted):
    root, df = planted[0]
    assert get_dataset("planted").findings == ("marker",)
    assert mf.validate(df, findings=("marker",)).equals(df)
    assert len(df) == 200 and df["sample_id"].is_unique
    assert df["sample_id"].iloc[0] == "img_0000" and df["path"].iloc[0] == "images/img_0000.png"
    assert (df["patient_id"] == df["sample_id"]).all()
    assert set(df["site"]) == {"site_a", "site_b"} and set(df["view"]) == {"frontal"}
    assert set(df["acq_group"]) == {"planted"} and set(df["split"]) == {"test"}
    assert df["marker"].dtype == float and df["marker"].sum() == 100
    assert all((root / p).is_file() for p in df["path"])
    with pytest.raises(ValueError, match="seed"):
        build_manifest("planted", root, seed=1)


def test_generation_is_idempotent_and_resumable(tmp_path):
    root = generate_planted(tmp_path, n=6, size=64, seed=0)
    stamps = {p: p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}
    assert generate_planted(tmp_path, n=6, size=64, seed=0) == root
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()} == stamps

    before = file_bytes(root)
    (root / "labels.csv").unlink()            # a killed run never got to write labels.csv
    (root / "images" / "img_0003.png").write_bytes(b"truncated")
    generate_planted(tmp_path, n=6, size=64, seed=0)
    assert file_bytes(root) == before

    generate_planted(tmp_path, n=4, size=64, seed=2)  # other parameters: regenerated in place
    assert sorted(p.name for p in (root / "images").iterdir()) == [f"img_{i:04d}.png" for i in range(4)]
    assert json.loads((root / "generator.json").read_text())["seed"] == 2
    assert not [p for p in root.rglob("*") if ".tmp" in p.name]


def test_build_without_labels_names_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="generate_planted"):
        build_manifest("planted", tmp_path)


# --------------------------------------------------------------------------- encoders
def test_encoder_entries_share_one_projection():
    assert {"planted_blur", "planted_sharp"} <= set(encoders.names())
    blur, sharp = encoders.load("planted_blur", device="cpu"), encoders.load("planted_sharp", device="cpu")
    for enc in (blur, sharp):
        spec = enc.spec
        assert spec.library == "synthetic" and not spec.pretrained and spec.channels == 1
        assert enc.weights_id == f"synthetic:{spec.hub_id}:seed={spec.seed}"
        assert isinstance(enc.model, torch.nn.Module)
        assert enc.embed(torch.randn(3, 1, 224, 224)).shape == (3, spec.embed_dim)
    assert torch.equal(blur.model.projection, sharp.model.projection)
    assert blur.weights_id != sharp.weights_id
    x = torch.randn(2, 1, 224, 224)
    assert torch.equal(blur.embed(x), encoders.load("planted_blur", device="cpu").embed(x))


def test_encoders_are_translation_invariant():
    """Moving the content by whole cells only permutes the cells; sorting removes that."""
    x = torch.zeros(1, 1, 224, 224)
    yy, xx = torch.meshgrid(torch.arange(224), torch.arange(224), indexing="ij")
    x[0, 0][(yy - 100) ** 2 + (xx - 100) ** 2 <= 9] = 1.0
    shifted = torch.roll(x, shifts=(28, -42), dims=(2, 3))
    for name in ("planted_blur", "planted_sharp"):
        enc = encoders.load(name, device="cpu")
        torch.testing.assert_close(enc.embed(x), enc.embed(shifted), rtol=1e-5, atol=1e-5)


def test_local_weights_file(tmp_path):
    enc = encoders.load("planted_sharp", device="cpu")
    path = tmp_path / "sharp.pt"
    torch.save(enc.model.state_dict(), path)
    again = encoders.load("planted_sharp", weights=path, device="cpu")
    assert again.weights_id.startswith("file:sha256:")
    x = torch.randn(2, 1, 224, 224)
    assert torch.equal(enc.embed(x), again.embed(x))
    from_folder = encoders.load("planted_sharp", weights=tmp_path, device="cpu")
    assert from_folder.weights_id == again.weights_id


# --------------------------------------------------------------------------- calibration
def test_sharp_encoder_has_no_discordant_positive(margins):
    for seed in CALIBRATION_SEEDS:
        dm = margins("planted_sharp", seed)
        assert len(dm) == 100
        d, min_margin = float((dm > 0).mean()), float(-dm.max())
        print(f"planted_sharp seed={seed}: D={d:.3f}, min(c+ - c-)={min_margin:.4f}, "
              f"median={float(np.median(-dm)):.4f}")
        assert d == 0.0
        assert min_margin > 1e-3  # every positive concordant with a clear margin


def test_blur_encoder_is_at_chance(margins):
    flags = (margins("planted_blur", 0) > 0).astype(float)
    d = float(flags.mean())
    lo, hi = bootstrap_ci(flags)
    print(f"planted_blur seed=0: D={d:.3f}, 95% CI [{lo:.3f}, {hi:.3f}]")
    assert abs(d - 0.5) <= 0.1
    assert lo <= 0.5 <= hi


def test_blur_chance_level_over_seeds(margins):
    ds = [float((margins("planted_blur", s) > 0).mean()) for s in CALIBRATION_SEEDS]
    print(f"planted_blur D over seeds {CALIBRATION_SEEDS}: {ds}, mean={np.mean(ds):.3f}")
    assert abs(np.mean(ds) - 0.5) <= 0.08


def test_shipped_demo_manifest_is_what_the_adapter_builds(tmp_path):
    """data_manifests/demo/planted.csv round-trips exactly through the generator + adapter."""
    shipped = mf.read(Path(__file__).resolve().parents[2] / "data_manifests" / "demo" / "planted.csv",
                      findings=["marker"])
    root = generate_planted(tmp_path / "planted")
    pd.testing.assert_frame_equal(build_manifest("planted", root), shipped)


def test_bad_options_are_user_errors_naming_the_option(tmp_path):
    """An option the dataset does not take stays a TypeError (and a ValueError-free UserError); a
    value out of range names the dataset.options key that sets it."""
    from robustbench_fm.core.errors import UserError
    from robustbench_fm.data.files import DatasetError, UnknownOption

    root = generate_planted(tmp_path, n=4, size=64, seed=0)
    with pytest.raises(UnknownOption) as err:
        build_manifest("planted", root, sed=1)
    assert isinstance(err.value, (UserError, TypeError))
    assert str(err.value) == "dataset 'planted': unknown option(s) ['sed']; use n, size, seed, marker_fraction"
    with pytest.raises(DatasetError) as err:
        generate_planted(tmp_path / "x", n=1, size=64)
    assert isinstance(err.value, ValueError) and "(got n=1, size=64); fix dataset.options.n" in str(err.value)


def test_site_is_the_most_skewed_half_and_the_pixels_are_version_1s(planted):
    """``site_b`` is the half of the images whose backgrounds are the most right-skewed (module doc),
    recomputed here from the stored pixels of the negatives (no marker: their stored image is the
    background, up to 8-bit rounding); the pixels are those version 1 drew (its digest, seed 0)."""
    root, df = planted[0]
    pixels = {s: np.asarray(Image.open(root / p), dtype=float) for s, p in zip(df["sample_id"], df["path"])}
    digest = hashlib.sha256(b"".join(pixels[s].astype(np.uint8).tobytes() for s in sorted(pixels)))
    assert digest.hexdigest() == "492fc8157a73e522a2981e0ca3560a03b71278e531be7df0aa4379b3f6c95dd3"
    neg = df[df["marker"] == 0]
    skew = np.array([stats.skew(pixels[s].ravel()) for s in neg["sample_id"]])
    site_b = (neg["site"] == "site_b").to_numpy()
    assert skew[site_b].min() > skew[~site_b].max() - 0.01  # one threshold splits them (rounding aside)
    assert 35 <= site_b.sum() <= 65  # the marker's own draw does not decide the site
