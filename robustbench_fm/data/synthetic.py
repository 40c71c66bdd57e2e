"""Synthetic datasets in the real on-disk formats (PNG images + a CSV of labels).

``planted`` is the calibration set of CANDOR (candor.md, "200 images that differ only by a
small local marker"): every image is an independent draw of the same background (a smooth
random field of large amplitude plus fine pixel noise); half of them also carry a small bright
disk at a uniformly random position. The marker is the only difference between the classes, so
an encoder that cannot see it has the chance level D = 1/2 and one that sees it has D = 0.

``site`` is the demo's acquisition confounder, for the confounder scan (issue 55): two sites whose
scanners' tone curves differ, so that ``site_b``'s images have the more right-skewed grey-level
histograms. It is read off the drawn backgrounds (the half of the images whose background, before any
marker, has the largest skewness is ``site_b``) rather than painted on, so the pixels, and with them
CANDOR's calibration, are those of version 1; it is independent of the marker, which is drawn after
the background and placed by a separate label draw.

Layout under ``root``::

    images/img_0000.png ...   8-bit grayscale PNG, size x size
    generator.json            the parameters the files were generated with
    labels.csv                image,marker,site  (file name, 1 = marker planted, 0 = none, site_a / site_b)

``labels.csv`` is written last (temp file + rename), so its presence with a matching
``generator.json`` means a complete dataset; a killed generation is simply redone.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image

from ..core.atomic import write_atomic, write_text_atomic
from .files import DatasetError, DatasetFileMissing, UnknownOption
from .registry import Adapter, register

#: Bumped whenever the drawing procedure or labels.csv changes, so old folders are regenerated
#: (2: the ``site`` column; the pixels are version 1's).
PLANTED_VERSION = 2
#: the ``site`` values: ``SITES[1]`` for the half of the images with the most skewed backgrounds
SITES = ("site_a", "site_b")

# Background and marker, in intensity units of [0, 1] (stored as 8-bit).
_BG_MEAN = 0.40        # mean grey level
_BG_FIELD_STD = 0.10   # amplitude of the smooth random field (large: dominates coarse features)
_BG_FIELD_SIGMA = 12.0  # its correlation length (Gaussian filter sigma, px at size 224)
_BG_NOISE_STD = 0.02   # fine i.i.d. pixel noise
_MARKER_RADIUS = 3.0   # disk radius in px: a 7 px bright disk
_MARKER_AMPLITUDE = 0.30
_MARKER_MARGIN = 12    # keep the disk this far from the border


def _params(n: int, size: int, seed: int, marker_fraction: float) -> dict:
    return {"dataset": "planted", "version": PLANTED_VERSION, "n": int(n), "size": int(size),
            "seed": int(seed), "marker_fraction": float(marker_fraction),
            "bg_mean": _BG_MEAN, "bg_field_std": _BG_FIELD_STD, "bg_field_sigma": _BG_FIELD_SIGMA,
            "bg_noise_std": _BG_NOISE_STD, "marker_radius": _MARKER_RADIUS,
            "marker_amplitude": _MARKER_AMPLITUDE}


def _smooth_field(rng: np.random.Generator, size: int, sigma: float) -> np.ndarray:
    """Unit-variance stationary Gaussian field: white noise low-passed by a Gaussian (FFT)."""
    white = rng.standard_normal((size, size))
    fy, fx = np.fft.fftfreq(size), np.fft.rfftfreq(size)
    gain = np.exp(-2.0 * (np.pi * sigma) ** 2 * (fy[:, None] ** 2 + fx[None, :] ** 2))
    field = np.fft.irfft2(np.fft.rfft2(white) * gain, s=(size, size))
    return (field - field.mean()) / field.std()


def _draw_image(rng: np.random.Generator, size: int, marker: bool) -> np.ndarray:
    """One 8-bit image (:func:`_draw_image_and_skewness` without the skewness)."""
    return _draw_image_and_skewness(rng, size, marker)[0]


def _draw_image_and_skewness(rng: np.random.Generator, size: int, marker: bool) -> tuple[np.ndarray, float]:
    """One 8-bit image and its background's skewness (before any marker: what ``site`` is read off).
    The background draws come first and do not depend on ``marker``."""
    from scipy import stats  # lazy: importing the adapters stays light

    scale = size / 224.0
    img = (_BG_MEAN + _BG_FIELD_STD * _smooth_field(rng, size, _BG_FIELD_SIGMA * scale)
           + _BG_NOISE_STD * rng.standard_normal((size, size)))
    margin = int(round(_MARKER_MARGIN * scale))
    cy, cx = rng.integers(margin, size - margin, size=2)  # drawn for every image
    skew = float(stats.skew(img, axis=None))  # m3 / m2 ** 1.5 of the background's values
    if marker:
        yy, xx = np.ogrid[:size, :size]
        disk = (yy - cy) ** 2 + (xx - cx) ** 2 <= (_MARKER_RADIUS * max(scale, 1.0)) ** 2
        img[disk] += _MARKER_AMPLITUDE
    return np.clip(np.rint(img * 255.0), 0, 255).astype(np.uint8), skew


def _is_complete(root: Path, params: dict) -> bool:
    meta, labels = root / "generator.json", root / "labels.csv"
    if not (meta.is_file() and labels.is_file()):
        return False
    try:
        return json.loads(meta.read_text()) == params
    except (OSError, ValueError):
        return False


def generate_planted(root: str | Path, n: int = 200, size: int = 224, seed: int = 0,
                     marker_fraction: float = 0.5) -> Path:
    """Write the planted-marker set under ``root`` and return ``root``.

    Exactly ``round(n * marker_fraction)`` images carry the marker. Image ``i`` is drawn from
    its own child of ``SeedSequence(seed)``, so its background does not depend on the labels,
    and the labels come from a separate child. The ``n // 2`` images whose backgrounds are the
    most skewed are ``site_b``, the others ``site_a`` (module doc). Idempotent: a complete folder generated with the
    same parameters is left untouched.
    """
    if n < 2 or size < 4 * _MARKER_MARGIN:
        raise DatasetError(f"planted: need n >= 2 and size >= {4 * _MARKER_MARGIN} (got n={n}, size={size}); "
                           "fix dataset.options.n / dataset.options.size")
    if not 0.0 <= marker_fraction <= 1.0:
        raise DatasetError(f"planted: marker_fraction must be in [0, 1], got {marker_fraction}; "
                           "fix dataset.options.marker_fraction")
    root = Path(root)
    params = _params(n, size, seed, marker_fraction)
    if _is_complete(root, params):
        return root
    images = root / "images"
    images.mkdir(parents=True, exist_ok=True)
    (root / "labels.csv").unlink(missing_ok=True)  # the folder is incomplete until rewritten

    label_ss, *image_ss = np.random.SeedSequence(seed).spawn(n + 1)
    n_pos = int(round(n * marker_fraction))
    labels = np.zeros(n, dtype=int)
    labels[np.random.default_rng(label_ss).permutation(n)[:n_pos]] = 1
    width = max(4, len(str(n - 1)))
    names = [f"img_{i:0{width}d}.png" for i in range(n)]
    skews = np.empty(n)
    for i, (name, ss, lab) in enumerate(zip(names, image_ss, labels)):
        arr, skews[i] = _draw_image_and_skewness(np.random.default_rng(ss), size, bool(lab))
        write_atomic(images / name, lambda f: Image.fromarray(arr).save(f, format="PNG"))
    keep = set(names)
    for stale in images.glob("img_*.png"):
        if stale.name not in keep:
            stale.unlink()

    write_text_atomic(root / "generator.json", json.dumps(params, indent=1, sort_keys=True) + "\n")
    site = np.full(n, SITES[0], dtype=object)
    site[np.argsort(-skews, kind="stable")[:n // 2]] = SITES[1]
    table = pd.DataFrame({"image": names, "marker": labels, "site": site})
    write_text_atomic(root / "labels.csv", table.to_csv(index=False))
    return root


def build_planted(root: str | Path, **expected) -> pd.DataFrame:
    """Read ``root/labels.csv`` into the canonical manifest.

    Keyword options (``n``, ``size``, ``seed``, ``marker_fraction``) are optional checks
    against the recorded ``generator.json``; a mismatch fails instead of silently using a
    folder generated with other parameters.
    """
    root = Path(root)
    labels = root / "labels.csv"
    if not labels.is_file():
        raise DatasetFileMissing(f"dataset 'planted': '{labels}' not found; generate it first with "
                                 "robustbench_fm.data.synthetic.generate_planted(root)")
    if expected:
        unknown = sorted(set(expected) - {"n", "size", "seed", "marker_fraction"})
        if unknown:
            raise UnknownOption(f"dataset 'planted': unknown option(s) {unknown}; "
                                "use n, size, seed, marker_fraction")
        meta = root / "generator.json"
        recorded = json.loads(meta.read_text()) if meta.is_file() else {}
        for key, value in expected.items():
            if recorded.get(key) != value:
                raise DatasetError(f"dataset 'planted': {root} was generated with {key}="
                                   f"{recorded.get(key)!r}, expected {value!r}; regenerate it into another folder")
    table = pd.read_csv(labels, dtype={"image": str})
    for col in ("image", "marker"):
        if col not in table.columns:
            raise DatasetError(f"{labels}: column '{col}' missing; regenerate the dataset")
    stems = table["image"].map(lambda s: Path(s).stem)
    return pd.DataFrame({
        "sample_id": stems,
        "path": "images/" + table["image"],
        "patient_id": stems,
        "site": table["site"].astype(str) if "site" in table.columns else "synthetic",
        "view": "frontal",
        "acq_group": "planted",
        "split": "test",
        "marker": table["marker"].astype(float),
    })


PLANTED = register(Adapter(
    name="planted",
    build=build_planted,
    findings=("marker",),
    generate=generate_planted,
    description="CANDOR calibration set: grayscale images of one background distribution (smooth "
                "random field + pixel noise); half carry a 7 px bright disk at a random position.",
))
