"""Natural-image controls of CANDOR: birds within their family, aircraft within their maker.

candor.md "Scope": "Birds and aircraft are tested one class at a time, with the other classes of
the same family or manufacturer as negatives ... possible for the 167 of 200 species and the 87 of
100 variants that share their family or manufacturer with another class." So ``bio_label`` is the
class (species, variant) and ``acq_group`` the matched group (family, manufacturer); the testable
classes are :func:`classes_sharing_group`. Neither dataset has patients: ``patient_id`` is the image.
Layouts: catalog 1.3.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from .files import DatasetError, first_existing, require
from .registry import Adapter, register


def classes_sharing_group(manifest: pd.DataFrame) -> list[str]:
    """Sorted ``bio_label`` values whose ``acq_group`` holds at least one other ``bio_label``."""
    per_group = manifest.groupby("acq_group")["bio_label"].nunique()
    shared = manifest[manifest["acq_group"].map(per_group) >= 2]
    return sorted(shared["bio_label"].unique())


def cub_species(class_name: str) -> str:
    """``'001.Black_footed_Albatross'`` -> ``'Black_footed_Albatross'``."""
    return class_name.split(".", 1)[1] if class_name[:3].isdigit() and "." in class_name else class_name


def cub_family(class_name: str) -> str:
    """CANDOR's bird family: the last word of the class name (``'Albatross'``, ``'Warbler'``)."""
    return cub_species(class_name).rsplit("_", 1)[-1]


def _space_table(path: Path, names: list[str], dataset: str, split_once: bool = False) -> pd.DataFrame:
    """``<id> <value>`` lines; with ``split_once`` the value may contain spaces (FGVC labels)."""
    require(path, dataset, "set dataset.root to the unpacked official archive")
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    parts = [ln.strip().split(" ", 1) if split_once else ln.split() for ln in lines]
    bad = next((i for i, p in enumerate(parts) if len(p) != len(names)), None)
    if bad is not None:
        raise DatasetError(f"dataset '{dataset}': {path}, line {bad + 1}: expected {len(names)} fields "
                           f"({' '.join(names)}), got {lines[bad]!r}; use the official, unmodified file")
    return pd.DataFrame(parts, columns=names)


def build_cub(root: Path) -> pd.DataFrame:
    """CUB-200-2011 text files (``images.txt``, ``classes.txt``, ``image_class_labels.txt``,
    ``train_test_split.txt``) -> manifest; ``root`` is ``CUB_200_2011/`` or the folder above it."""
    base = first_existing(root, ("images.txt", "CUB_200_2011/images.txt"), "cub", "images.txt").parent
    prefix = "" if base == root else f"{base.name}/"
    images = _space_table(base / "images.txt", ["image_id", "relpath"], "cub")
    classes = _space_table(base / "classes.txt", ["class_id", "class_name"], "cub")
    labels = _space_table(base / "image_class_labels.txt", ["image_id", "class_id"], "cub")
    split = _space_table(base / "train_test_split.txt", ["image_id", "is_training_image"], "cub")
    table = images.merge(labels, on="image_id", how="left").merge(split, on="image_id", how="left")
    table = table.merge(classes, on="class_id", how="left")
    if table["class_name"].isna().any() or table["is_training_image"].isna().any():
        first = table["image_id"][table["class_name"].isna() | table["is_training_image"].isna()].iloc[0]
        raise DatasetError(f"dataset 'cub': image_id {first} of images.txt has no class or split in "
                           f"image_class_labels.txt / train_test_split.txt / classes.txt; re-extract CUB_200_2011.tgz")
    return pd.DataFrame({
        "sample_id": "cub_" + table["image_id"],
        "path": prefix + "images/" + table["relpath"],
        "patient_id": "cub_" + table["image_id"],
        "acq_group": table["class_name"].map(cub_family),
        "split": table["is_training_image"].map({"1": "train", "0": "test"}),
        "bio_label": table["class_name"].map(cub_species),
    })


FGVC_SPLITS = ("train", "val", "test")
#: Height of the copyright banner at the bottom of every FGVC-Aircraft image (catalog 1.3).
FGVC_BANNER_PX = 20


def build_fgvc_aircraft(root: Path) -> pd.DataFrame:
    """FGVC-Aircraft 2013b ``data/images_{variant,family,manufacturer}_<split>.txt`` -> manifest.

    ``root`` is ``fgvc-aircraft-2013b/``, the folder above it or its ``data/``. Labels are split
    on the first space only (they contain spaces, ``/`` and ``-``). Every row records
    ``crop_bottom = 20``: :func:`robustbench_fm.data.images.read_image` removes the banner.
    """
    base = first_existing(root, ("images_variant_test.txt", "data/images_variant_test.txt",
                                 "fgvc-aircraft-2013b/data/images_variant_test.txt"),
                          "fgvc_aircraft", "images_variant_test.txt").parent
    prefix = base.relative_to(root).as_posix()
    prefix = "" if prefix == "." else f"{prefix}/"
    frames = []
    for split in FGVC_SPLITS:
        parts = [_space_table(base / f"images_{level}_{split}.txt", ["image_id", level], "fgvc_aircraft",
                              split_once=True).set_index("image_id")
                 for level in ("variant", "family", "manufacturer")]
        table = parts[0].join(parts[1:], how="left")
        if table.isna().any().any():
            first = table.index[table.isna().any(axis=1)][0]
            raise DatasetError(f"dataset 'fgvc_aircraft': image {first} of images_variant_{split}.txt has no "
                               f"family or manufacturer in images_{{family,manufacturer}}_{split}.txt; "
                               "re-extract the archive")
        frames.append(table.reset_index().assign(split=split))
    table = pd.concat(frames, ignore_index=True)
    return pd.DataFrame({
        "sample_id": "fgvc_" + table["image_id"],
        "path": prefix + "images/" + table["image_id"] + ".jpg",
        "patient_id": "fgvc_" + table["image_id"],
        "acq_group": table["manufacturer"],
        "split": table["split"],
        "bio_label": table["variant"],
        "aircraft_family": table["family"],
        "crop_bottom": FGVC_BANNER_PX,
    })


CUB = register(Adapter(
    name="cub",
    build=build_cub,
    description="CUB-200-2011: 11,788 bird photographs of 200 species; one species vs its family "
                "(last word of the name).",
))

FGVC_AIRCRAFT = register(Adapter(
    name="fgvc_aircraft",
    build=build_fgvc_aircraft,
    description="FGVC-Aircraft 2013b: 10,000 aircraft photographs, 100 variants; one variant vs its manufacturer.",
))
