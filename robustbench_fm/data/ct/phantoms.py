"""Synthetic abdominal CT phantoms in the real WORD, TotalSegmentator and LiTS layouts.

Each subject is a body ellipse (fat, a vertebra) holding WORD's 16 organs as ellipsoids at
plausible positions (patient right on the image left, anterior up), with per-subject jitter of
position and size. The left kidney sits higher than the right one and a third of the subjects
each have equal kidneys, a slightly larger left or a slightly larger right kidney, so the
per-slice area ratio, and the kidney-symmetry class, varies within and across subjects. LiTS
subjects label only the liver (1) and ``(i + 1) mod 4`` disjoint spherical tumours (2) inside
its inter-quartile slices (subject ``i``; 1, 2, 3, 0, ...: every count occurs and the first
three volumes, one per split, have tumours). Volumes are ``SHAPE`` voxels (x, y, z) of
``SPACING`` mm, int16 HU; TotalSegmentator files are stored x-flipped (LAS) and LiTS files
y-flipped (RPS) so that readers must reorient to RAS. ``generator.json`` is written last and
makes a second call with the same parameters a no-op.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from ...core.atomic import write_text_atomic
from ..files import DatasetError
from .layouts import ORGANS, TOTALSEG_CLASSES, WORD_SPLIT_DIRS

PHANTOM_VERSION = 3
SHAPE = (96, 96, 40)              # x, y, z voxels
SPACING = (4.0, 4.0, 8.0)         # mm
LAYOUTS = ("word", "totalsegmentator", "lits")

# organ: [(x, y, z0, z1, rx, ry), ...] in the display frame normalised to [0, 1] (x to the image
# right = patient left, y down = posterior, z up = superior), and its HU value.
_ORGAN_SHAPES: dict[str, list[tuple[float, ...]]] = {
    "colon": [(0.50, 0.30, 0.20, 0.72, 0.25, 0.06)],
    "intestine": [(0.50, 0.45, 0.15, 0.68, 0.14, 0.10)],
    "liver": [(0.30, 0.42, 0.38, 0.95, 0.25, 0.22)],
    "spleen": [(0.76, 0.55, 0.45, 0.85, 0.08, 0.10)],
    "stomach": [(0.62, 0.36, 0.45, 0.88, 0.11, 0.09)],
    "left_kidney": [(0.67, 0.68, 0.34, 0.78, 0.065, 0.075)],  # higher than the right one, as usual
    "right_kidney": [(0.33, 0.68, 0.24, 0.68, 0.065, 0.075)],
    "gallbladder": [(0.36, 0.52, 0.44, 0.70, 0.04, 0.04)],
    "pancreas": [(0.55, 0.55, 0.44, 0.72, 0.12, 0.035)],
    "duodenum": [(0.43, 0.58, 0.38, 0.68, 0.04, 0.05)],
    "esophagus": [(0.53, 0.60, 0.60, 1.00, 0.03, 0.03)],
    "adrenal": [(0.40, 0.61, 0.52, 0.80, 0.025, 0.03), (0.60, 0.61, 0.52, 0.80, 0.025, 0.03)],
    "rectum": [(0.50, 0.70, 0.00, 0.18, 0.04, 0.04)],
    "bladder": [(0.50, 0.50, 0.00, 0.15, 0.08, 0.07)],
    "head_of_femur_left": [(0.78, 0.62, 0.00, 0.12, 0.05, 0.05)],
    "head_of_femur_right": [(0.22, 0.62, 0.00, 0.12, 0.05, 0.05)],
}
_HU = {"liver": 60, "spleen": 50, "left_kidney": 160, "right_kidney": 160, "stomach": 20, "gallbladder": 10,
       "esophagus": 40, "pancreas": 45, "duodenum": 30, "colon": -30, "intestine": 25, "adrenal": 35,
       "rectum": 15, "bladder": 5, "head_of_femur_left": 700, "head_of_femur_right": 700}
_SCALE_RANGE = {"liver": (0.7, 1.2)}  # per-subject size factor (default 0.85-1.15): all liver-size classes occur
_TUMOUR_HU, _BODY_HU, _BONE_HU, _AIR_HU, _NOISE_HU = 15, -60, 500, -1000, 12.0


def _grid():
    z, y, x = (((np.arange(n) + 0.5) / n) for n in SHAPE[::-1])
    return z[:, None, None], y[None, :, None], x[None, None, :]


def _ellipsoid(x, y, z0, z1, rx, ry):
    zz, yy, xx = _grid()
    zc, hz = (z0 + z1) / 2, (z1 - z0) / 2
    return ((xx - x) / rx) ** 2 + ((yy - y) / ry) ** 2 + ((zz - zc) / hz) ** 2 <= 1.0


def _subject(rng: np.random.Generator, n_tumours: int = 0):
    """(HU, organ labels, tumour mask) of one subject in the display frame (z, y, x)."""
    zz, yy, xx = _grid()
    hu = np.full(SHAPE[::-1], _AIR_HU, np.float32)
    hu[np.broadcast_to(((xx - 0.5) / 0.46) ** 2 + ((yy - 0.5) / 0.36) ** 2 <= 1, hu.shape)] = _BODY_HU
    hu[np.broadcast_to(((xx - 0.5) / 0.05) ** 2 + ((yy - 0.76) / 0.05) ** 2 <= 1, hu.shape)] = _BONE_HU
    labels = np.zeros(hu.shape, np.uint8)
    body_scale, shift = rng.uniform(0.9, 1.1), rng.uniform(-0.03, 0.03, size=3)
    kidney_case = rng.integers(3)  # 0 equal, 1 larger left, 2 larger right
    big, small = rng.uniform(1.0, 1.08), rng.uniform(0.92, 1.0)
    kidney_scale = {"left_kidney": (1.0, big, small)[kidney_case], "right_kidney": (1.0, small, big)[kidney_case]}
    for organ, parts in _ORGAN_SHAPES.items():
        own = rng.uniform(-0.02, 0.02, size=3) if organ not in kidney_scale else np.zeros(3)
        scale = body_scale * kidney_scale.get(organ, rng.uniform(*_SCALE_RANGE.get(organ, (0.85, 1.15))))
        for x, y, z0, z1, rx, ry in parts:
            dz = shift[2] + own[2]
            mask = _ellipsoid(x + shift[0] + own[0], y + shift[1] + own[1], z0 + dz, z1 + dz, rx * scale, ry * scale)
            labels[mask] = ORGANS.index(organ) + 1
            hu[mask] = _HU[organ]
    tumour = np.zeros(hu.shape, bool)
    liver = labels == ORGANS.index("liver") + 1
    zs, ys, xs = np.nonzero(liver)
    z_lo, z_hi = np.percentile(zs, [25, 75])  # tumours centred in the liver's inter-quartile slices
    zs, ys, xs = (a[(zs >= z_lo) & (zs <= z_hi)] for a in (zs, ys, xs))
    centres: list[np.ndarray] = []
    for _ in range(200):
        if len(centres) == n_tumours:
            break
        k = rng.integers(len(zs))
        c = np.array([zs[k], ys[k], xs[k]], float)
        r = rng.uniform(2.0, 4.0)  # in-plane radius, voxels; z radius r / 2
        if all(np.linalg.norm((c - o[:3]) * [2, 1, 1]) > r + o[3] + 2 for o in centres):
            centres.append(np.append(c, r))
    for cz, cy, cx, r in centres:
        zi, yi, xi = np.ogrid[: hu.shape[0], : hu.shape[1], : hu.shape[2]]
        tumour |= ((zi - cz) * 2) ** 2 + (yi - cy) ** 2 + (xi - cx) ** 2 <= r * r
    tumour &= liver
    hu[tumour] = _TUMOUR_HU
    hu += rng.normal(0.0, _NOISE_HU, hu.shape).astype(np.float32)
    return np.rint(hu).astype(np.int16), labels, tumour


def save_nifti(path: Path, display: np.ndarray, flip_axes: tuple[int, ...] = ()) -> None:
    """Write a display-frame (z, y, x) array as NIfTI whose RAS reorientation gives it back.

    ``flip_axes`` stores those RAS array axes reversed, with the affine saying so.
    """
    import nibabel as nib  # imported on use: it is slow to import

    ras = display.transpose(2, 1, 0)[::-1, ::-1, :]
    affine = np.diag([*SPACING, 1.0])
    for axis in flip_axes:
        ras = np.flip(ras, axis)
        affine[axis, axis] = -SPACING[axis]
        affine[axis, 3] = (SHAPE[axis] - 1) * SPACING[axis]
    path.parent.mkdir(parents=True, exist_ok=True)
    nib.save(nib.Nifti1Image(np.ascontiguousarray(ras), affine), str(path))


def _splits(n: int) -> list[str]:
    """WORD's 100/20/30 proportions over ``n`` subjects, at least one val and test from n >= 3."""
    n_val = max(1, round(n * 20 / 150)) if n >= 3 else 0
    n_test = max(1, round(n * 30 / 150)) if n >= 3 else 0
    return ["train"] * (n - n_val - n_test) + ["val"] * n_val + ["test"] * n_test


def write_phantoms(root: str | Path, layout: str = "word", n_subjects: int = 6, seed: int = 0,
                   extra_test: int = 0) -> Path:
    """Write ``n_subjects`` phantoms under ``root`` in ``layout`` ('word' | 'totalsegmentator' | 'lits').

    Subject ``i`` is drawn from child ``i`` of ``SeedSequence(seed)``; LiTS subjects have 0-3 tumours.
    The ``n_subjects`` are split in WORD's proportions (:func:`_splits`); ``extra_test`` more subjects
    (WORD and TotalSegmentator layouts), drawn after them, all go to the test split: a larger test
    set for the probes whose items are rare per volume (kidney symmetry: about one symmetric slice
    per subject) while the training and validation subjects, and so every trained head, stay the
    same. LiTS volumes take their split from the volume number (``layouts.lits_split``), so a
    larger LiTS test set needs more volumes.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"unknown phantom layout {layout!r}; use one of {', '.join(LAYOUTS)}")
    if n_subjects < 1:
        raise DatasetError(f"write_phantoms: n_subjects must be >= 1, got {n_subjects}; "
                           "set dataset.options.n_subjects (or n_lits) to 1 or more")
    if extra_test < 0 or (extra_test and layout == "lits"):
        raise DatasetError(f"write_phantoms: extra_test must be >= 0 (and 0 for LiTS, split by volume number), got "
                           f"{extra_test}; set dataset.options.extra_test to 0 or more")
    root = Path(root)
    params = {"version": PHANTOM_VERSION, "layout": layout, "n_subjects": int(n_subjects), "seed": int(seed)}
    if extra_test:  # absent at 0, so phantom sets written before the option stay valid
        params["extra_test"] = int(extra_test)
    meta = root / "generator.json"
    if meta.is_file() and json.loads(meta.read_text()) == params:
        return root
    meta.unlink(missing_ok=True)
    splits = _splits(n_subjects) + ["test"] * int(extra_test)
    rows = []
    for i, ss in enumerate(np.random.SeedSequence(seed).spawn(len(splits))):
        rng = np.random.default_rng(ss)
        hu, labels, tumour = _subject(rng, n_tumours=(i + 1) % 4 if layout == "lits" else 0)
        if layout == "word":
            name, suffix = f"word_{i + 1:04d}.nii.gz", WORD_SPLIT_DIRS[splits[i]]
            save_nifti(root / f"images{suffix}" / name, hu)
            save_nifti(root / f"labels{suffix}" / name, labels)
        elif layout == "lits":
            seg = (labels == ORGANS.index("liver") + 1).astype(np.uint8) + tumour.astype(np.uint8)
            save_nifti(root / f"volume-{i}.nii.gz", hu, flip_axes=(1,))
            save_nifti(root / f"segmentation-{i}.nii.gz", seg, flip_axes=(1,))
        else:
            sid = f"s{i:04d}"
            save_nifti(root / sid / "ct.nii.gz", hu, flip_axes=(0,))
            masks = {name: labels == ORGANS.index(organ) + 1
                     for organ, names in TOTALSEG_CLASSES.items() for name in names}
            masks["colon"] = masks["colon"] | (labels == ORGANS.index("rectum") + 1)  # TS colon holds the rectum
            left = np.arange(SHAPE[0])[None, None, :] >= SHAPE[0] // 2  # image right = patient left
            adrenal = labels == ORGANS.index("adrenal") + 1
            masks["adrenal_gland_left"], masks["adrenal_gland_right"] = adrenal & left, adrenal & ~left
            masks["aorta"] = np.zeros_like(adrenal)  # a class WORD lacks: present and ignored
            for name, mask in masks.items():
                save_nifti(root / sid / "segmentations" / f"{name}.nii.gz", mask.astype(np.uint8), flip_axes=(0,))
            rows.append({"image_id": sid, "age": 60, "gender": "f", "institute": "A", "study_type": "ct abdomen",
                         "split": splits[i], "manufacturer": "phantom", "scanner_model": "phantom", "kvp": 120,
                         "pathology": "no_pathology", "pathology_location": ""})
    if rows:
        write_text_atomic(root / "meta.csv", "\ufeff" + pd.DataFrame(rows).to_csv(sep=";", index=False))
    write_text_atomic(meta, json.dumps(params, indent=1, sort_keys=True) + "\n")
    return root
