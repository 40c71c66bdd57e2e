"""Miniature CUB-200-2011 and FGVC-Aircraft 2013b in their official layouts (catalog 1.3)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

CUB_CLASSES = ("001.Black_footed_Albatross", "002.Laysan_Albatross", "004.Groove_billed_Ani",
               "020.Yellow_breasted_Chat", "158.Bay_breasted_Warbler", "159.Black_and_white_Warbler",
               "160.Black_throated_Blue_Warbler")

#: (image_id, variant, family, manufacturer, split) of the FGVC fixture; labels with spaces, / and -.
FGVC_ROWS = (
    ("0034309", "737-700", "Boeing 737", "Boeing", "train"),
    ("0034958", "737-800", "Boeing 737", "Boeing", "train"),
    ("0037511", "747-400", "Boeing 747", "Boeing", "val"),
    ("0041135", "F-16A/B", "F-16", "Lockheed Martin", "test"),
    ("0056978", "C-130", "C-130", "Lockheed Martin", "test"),
    ("0062781", "Cessna 172", "Cessna 172", "Cessna", "val"),
    ("1514522", "Spitfire", "Spitfire", "Supermarine", "test"),
)
FGVC_SIZE = (12, 50)  # width, height; the bottom 20 rows are the banner (value 255), the rest 40


def _jpeg(path: Path, value: int, size=(8, 6)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((size[1], size[0], 3), value, np.uint8)).save(path, quality=95)


def write_cub(root: Path, class_names=CUB_CLASSES, per_class: int = 2, images: bool = True) -> Path:
    """``<root>/CUB_200_2011/{images/, images.txt, classes.txt, image_class_labels.txt,
    train_test_split.txt}``; the first image of each class is a training image."""
    base = root / "CUB_200_2011"
    base.mkdir(parents=True, exist_ok=True)
    image_lines, label_lines, split_lines = [], [], []
    image_id = 0
    for class_id, name in enumerate(class_names, start=1):
        species = name.split(".", 1)[1]
        for k in range(per_class):
            image_id += 1
            rel = f"{name}/{species}_{k:04d}_{image_id}.jpg"
            image_lines.append(f"{image_id} {rel}")
            label_lines.append(f"{image_id} {class_id}")
            split_lines.append(f"{image_id} {int(k == 0)}")
            if images:
                _jpeg(base / "images" / rel, 10 * class_id)
    (base / "images.txt").write_text("\n".join(image_lines) + "\n")
    (base / "classes.txt").write_text("\n".join(f"{i} {n}" for i, n in enumerate(class_names, 1)) + "\n")
    (base / "image_class_labels.txt").write_text("\n".join(label_lines) + "\n")
    (base / "train_test_split.txt").write_text("\n".join(split_lines) + "\n")
    (base / "bounding_boxes.txt").write_text("".join(f"{i} 1.0 1.0 4.0 3.0\n" for i in range(1, image_id + 1)))
    return root


def write_fgvc(root: Path, rows=FGVC_ROWS) -> Path:
    """``<root>/fgvc-aircraft-2013b/data/{images/<id>.jpg, images_<split>.txt,
    images_{variant,family,manufacturer}_<split>.txt, variants.txt, families.txt, manufacturers.txt}``.
    Each image is grey 40 with a white 20-px banner at the bottom."""
    data = root / "fgvc-aircraft-2013b" / "data"
    width, height = FGVC_SIZE
    for image_id, *_ in rows:
        arr = np.full((height, width), 40, np.uint8)
        arr[-20:] = 255
        (data / "images").mkdir(parents=True, exist_ok=True)
        Image.fromarray(arr).convert("RGB").save(data / "images" / f"{image_id}.jpg", quality=100)
    for split in ("train", "val", "test", "trainval"):
        chosen = [r for r in rows if r[4] == split or (split == "trainval" and r[4] in ("train", "val"))]
        (data / f"images_{split}.txt").write_text("".join(f"{r[0]}\n" for r in chosen))
        for col, level in ((1, "variant"), (2, "family"), (3, "manufacturer")):
            (data / f"images_{level}_{split}.txt").write_text("".join(f"{r[0]} {r[col]}\n" for r in chosen))
    for col, name in ((1, "variants"), (2, "families"), (3, "manufacturers")):
        (data / f"{name}.txt").write_text("".join(f"{v}\n" for v in sorted({r[col] for r in rows})))
    return root
