"""CT dataset layouts of SPAR-Bench (catalog 1.7): WORD, LiTS and TotalSegmentator.

``list_volumes(dataset, root)`` finds the volumes of a distribution as it is laid out on disk and
``load_labels(volume)`` returns its organ label map in WORD's label ids (RAS, like the image):

- **WORD**: ``[WORD-V0.1.0/]{imagesTr,imagesVal,imagesTs}/word_XXXX.nii.gz`` with the label map of
  the same name in ``labelsTr/labelsVal/labelsTs``; the folders give the split (100/20/30).
- **LiTS**: the original ``volume-<N>.nii[.gz]`` + ``segmentation-<N>.nii[.gz]`` anywhere under
  the root, or the MSD ``[Task03_Liver/]imagesTr/liver_<N>.nii.gz`` + ``labelsTr`` layout (``._*``
  AppleDouble files skipped). Labels 1 liver, 2 tumour; the liver is {1, 2}. Split by volume
  number, ``LITS_SPLIT_CYCLE[N mod 15]`` (10 train, 2 val, 3 test: WORD's 100:20:30 ratio, with
  volumes 0-2 in train/val/test), so it does not depend on which volumes a configuration uses.
- **TotalSegmentator**: ``<image_id>/ct.nii.gz`` + ``<image_id>/segmentations/<class>.nii.gz``
  and a ``;``-separated ``meta.csv`` (UTF-8 BOM) whose ``split`` column is used; subjects listed
  there without a folder are skipped. Classes map to WORD's organs by ``TOTALSEG_CLASSES``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..files import DatasetError, DatasetFileMissing, UnknownOption
from .volumes import affine, check_same_space, load_ras

#: WORD's 16 organs in the fixed slot order; slot i holds label id i + 1 (catalog 1.7).
ORGANS: tuple[str, ...] = (
    "liver", "spleen", "left_kidney", "right_kidney", "stomach", "gallbladder", "esophagus", "pancreas",
    "duodenum", "colon", "intestine", "adrenal", "rectum", "bladder", "head_of_femur_left", "head_of_femur_right",
)
#: TotalSegmentator (v1/v2) class files making up each WORD organ (catalog 1.7); no rectum class.
TOTALSEG_CLASSES: dict[str, tuple[str, ...]] = {
    "liver": ("liver",), "spleen": ("spleen",), "left_kidney": ("kidney_left",), "right_kidney": ("kidney_right",),
    "stomach": ("stomach",), "gallbladder": ("gallbladder",), "esophagus": ("esophagus",),
    "pancreas": ("pancreas",), "duodenum": ("duodenum",), "colon": ("colon",), "intestine": ("small_bowel",),
    "adrenal": ("adrenal_gland_left", "adrenal_gland_right"), "rectum": (), "bladder": ("urinary_bladder",),
    "head_of_femur_left": ("femur_left",), "head_of_femur_right": ("femur_right",),
}
WORD_SPLIT_DIRS = {"train": "Tr", "val": "Val", "test": "Ts"}
LITS_TUMOUR = 2
LAYOUTS = ("word", "lits", "totalsegmentator")


@dataclass(frozen=True)
class CTVolume:
    """One CT volume: ``image`` and ``labels`` (a label map, or TotalSegmentator's segmentations folder)."""

    dataset: str
    subject_id: str
    split: str
    image: Path
    labels: Path

    def label_files(self) -> list[Path]:
        """The files ``load_labels`` reads."""
        if self.dataset != "totalsegmentator":
            return [self.labels]
        return [self.labels / f"{name}.nii.gz" for names in TOTALSEG_CLASSES.values() for name in names]


def _word_base(root: Path) -> Path:
    for base in (root, root / "WORD-V0.1.0"):
        if any((base / f"images{s}").is_dir() for s in WORD_SPLIT_DIRS.values()):
            return base
    raise DatasetFileMissing(f"WORD: no imagesTr/imagesVal/imagesTs under '{root}'; set dataset.root to the "
                             "unzipped WORD-V0.1.0 folder")


def _word(root: Path) -> list[CTVolume]:
    base, out = _word_base(root), []
    for split, suffix in WORD_SPLIT_DIRS.items():
        for image in sorted((base / f"images{suffix}").glob("*.nii.gz")):
            if image.name.startswith("._"):
                continue
            labels = base / f"labels{suffix}" / image.name
            if not labels.is_file():
                raise DatasetFileMissing(f"WORD: label map '{labels}' missing for '{image.name}'; unzip the "
                                         f"labels{suffix} archive (WORD_V0.1.0_labelsTs.zip for the test set) "
                                         f"into '{base}'")
            out.append(CTVolume("word", image.name.removesuffix(".nii.gz"), split, image, labels))
    return out


LITS_SPLIT_CYCLE = ("train", "val", "test", "train", "train", "train", "test", "train", "train", "val",
                    "train", "train", "test", "train", "train")


def lits_split(number: int) -> str:
    """LiTS split from the volume number (train 10, val 2, test 3 of every 15)."""
    return LITS_SPLIT_CYCLE[number % len(LITS_SPLIT_CYCLE)]


def _lits(root: Path) -> list[CTVolume]:
    found: dict[int, tuple[Path, Path]] = {}
    for image in root.rglob("volume-*.nii*"):
        m = re.fullmatch(r"volume-(\d+)\.nii(\.gz)?", image.name)
        if m:
            segs = [image.with_name(f"segmentation-{m[1]}{ext}") for ext in (".nii", ".nii.gz")]
            seg = next((s for s in segs if s.is_file()), None)
            if seg is not None:  # test-volume-<N> files have no labels and do not match
                found[int(m[1])] = (image, seg)
    for base in (root, root / "Task03_Liver"):
        for image in (base / "imagesTr").glob("liver_*.nii.gz"):
            m = re.fullmatch(r"liver_(\d+)\.nii\.gz", image.name)
            seg = base / "labelsTr" / image.name
            if m and seg.is_file():
                found.setdefault(int(m[1]), (image, seg))
    return [CTVolume("lits", f"lits_{n:03d}", lits_split(n), *found[n]) for n in sorted(found)]


def read_totalseg_meta(root: Path) -> pd.DataFrame:
    """``meta.csv`` of TotalSegmentator: ';'-separated with a UTF-8 BOM; needs image_id and split."""
    meta = root / "meta.csv"
    if not meta.is_file():
        raise DatasetFileMissing(f"TotalSegmentator: '{meta}' not found; set dataset.root to the folder holding "
                                 "meta.csv and the s0000/ subject folders")
    table = pd.read_csv(meta, sep=";", encoding="utf-8-sig", dtype=str)
    for col in ("image_id", "split"):
        if col not in table.columns:
            raise DatasetError(f"{meta}: column '{col}' missing (found {', '.join(table.columns[:6])}); "
                               "use the meta.csv of the Zenodo release")
    bad = ~table["split"].isin(["train", "val", "test"])
    if bad.any():
        raise DatasetError(f"{meta}: split {table['split'][bad].iloc[0]!r} of {table['image_id'][bad].iloc[0]} "
                           "is not train/val/test")
    return table


def _totalseg(root: Path) -> list[CTVolume]:
    table = read_totalseg_meta(root)
    return [CTVolume("totalsegmentator", sid, split, root / sid / "ct.nii.gz", root / sid / "segmentations")
            for sid, split in zip(table["image_id"], table["split"]) if (root / sid / "ct.nii.gz").is_file()]


def list_volumes(dataset: str, root: str | Path) -> list[CTVolume]:
    """The labelled volumes of layout ``dataset`` ('word' | 'lits' | 'totalsegmentator') under ``root``."""
    root = Path(root)
    if dataset not in LAYOUTS:
        raise ValueError(f"unknown CT layout {dataset!r}; use one of {', '.join(LAYOUTS)}")
    if not root.is_dir():
        raise DatasetFileMissing(f"{dataset}: root '{root}' does not exist; set dataset.root")
    vols = {"word": _word, "lits": _lits, "totalsegmentator": _totalseg}[dataset](root)
    if not vols:
        raise DatasetFileMissing(f"{dataset}: no labelled volumes found under '{root}'; check the layout "
                                 "(robustbench_fm/data/ct/layouts.py describes it)")
    return vols


def load_labels(volume: CTVolume) -> tuple[np.ndarray, np.ndarray | None]:
    """(organ label map uint8 in WORD ids, tumour mask bool or None), both RAS like ``load_ras(image)``."""
    if volume.dataset in ("word", "lits"):
        check_same_space(volume.image, volume.labels)  # a mirrored header would cut organs from the wrong side
    if volume.dataset == "word":
        labels = load_ras(volume.labels, np.int16)
        if labels.min() < 0 or labels.max() > len(ORGANS):
            raise DatasetError(f"'{volume.labels}': label ids {labels.min()}..{labels.max()} outside WORD's 0..16")
        return labels.astype(np.uint8), None
    if volume.dataset == "lits":
        seg = load_ras(volume.labels, np.int16)
        return (seg > 0).astype(np.uint8) * (ORGANS.index("liver") + 1), seg == LITS_TUMOUR
    labels, image_affine = None, affine(volume.image)
    for organ_id, (organ, names) in enumerate(TOTALSEG_CLASSES.items(), start=1):
        for name in names:
            path = volume.labels / f"{name}.nii.gz"
            if path.is_file():
                check_same_space(volume.image, path, image_affine)
            mask = load_ras(path, np.uint8) > 0
            labels = np.zeros(mask.shape, np.uint8) if labels is None else labels
            if mask.shape != labels.shape:
                raise DatasetError(f"'{path}' has shape {mask.shape}, other classes {labels.shape}; "
                                   "re-extract the subject")
            labels[mask] = organ_id
    return labels, None


#: Registry name -> CT layout of the volumes (phantom datasets hold their LiTS set in root/lits).
DATASET_LAYOUTS = {"word": "word", "lits": "lits", "totalsegmentator": "totalsegmentator",
                   "spar_phantom_word": "word", "spar_phantom_totalsegmentator": "totalsegmentator"}
#: Options of build_samples, and the phantom-generation options it accepts and ignores (they
#: arrive with the dataset config's ``options`` that ``generate`` also receives).
#: ``distance_rule``: ``varying`` (spar.md 3.1's distance control: only pairs of organ pairs whose order
#: changes across slices), the paper's; the demo's phantoms ask ``random`` (configs/dataset/spar_phantom_word.yaml)
SAMPLE_OPTIONS = {"lits_root": None, "n_lits": 20, "min_organs": 5, "size": 224, "distance_questions": 1,
                  "distance_rule": "varying"}
GENERATOR_OPTIONS = ("n_subjects", "phantom_seed", "extra_test")
#: the lowest value each numeric sample option accepts
_MINIMA = {"min_organs": 1, "size": 8, "n_lits": 0, "distance_questions": 1}
#: the values each choice option accepts (``distance_rule``: methods.spar.probes.make_questions)
_CHOICES = {"distance_rule": ("random", "varying")}


def sample_options(dataset: str, options: dict) -> dict:
    """``SAMPLE_OPTIONS`` updated by ``options``; unknown keys fail naming the accepted ones."""
    unknown = sorted(set(options) - set(SAMPLE_OPTIONS) - set(GENERATOR_OPTIONS))
    if unknown:
        raise UnknownOption(f"dataset '{dataset}': unknown option(s) {unknown}; accepted: "
                            f"{', '.join([*SAMPLE_OPTIONS, *GENERATOR_OPTIONS])}")
    out = {**SAMPLE_OPTIONS, **{k: v for k, v in options.items() if k in SAMPLE_OPTIONS}}
    bad = [f"dataset.options.{k}={out[k]} is out of range (need >= {low})"
           for k, low in _MINIMA.items() if int(out[k]) < low]
    bad += [f"dataset.options.{k}={out[k]} is not one of {', '.join(ok)}"
            for k, ok in _CHOICES.items() if out[k] not in ok]
    if bad:
        raise DatasetError(f"dataset '{dataset}': {'; '.join(bad)}")
    return out
