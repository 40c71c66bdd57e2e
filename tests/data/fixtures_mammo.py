"""Miniature VinDr-Mammo: DICOM images and the two annotation CSVs in the official layout (catalog 1.6)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from fixtures_images import write_dicom

MAMMO_SHAPE = (20, 10)  # rows (height), columns (width)
#: (study_id, image_id, laterality, view, split, photometric, [(categories, box or None)])
MAMMO_IMAGES = (
    ("s1", "i1", "L", "CC", "training", "MONOCHROME2", [("['Mass']", (1, 2, 5, 10))]),
    ("s1", "i2", "L", "MLO", "training", "MONOCHROME2", [("['No Finding']", None)]),
    ("s1", "i3", "R", "CC", "training", "MONOCHROME1",
     [("['Suspicious Calcification', 'Mass']", (2, 4, 4, 8)), ("['Architectural Distortion']", (0, 0, 10, 20)),
      ("[' Suspicious Calcification']", (6, 12, 8, 16))]),
    ("s2", "i4", "R", "MLO", "test", "MONOCHROME1", [("['Focal Asymmetry']", (3, 3, 6, 6))]),
    ("s2", "i5", "L", "CC", "test", "MONOCHROME2", [("['No Finding']", None)]),
)


def write_vindr_mammo(root: Path) -> Path:
    """``images/<study_id>/<image_id>.dicom`` (i4 JPEG 2000 compressed) + ``breast-level_annotations.csv`` +
    ``finding_annotations.csv`` (list strings in ``finding_categories``, empty boxes for no finding)."""
    h, w = MAMMO_SHAPE
    breast = ["study_id,series_id,image_id,laterality,view_position,height,width,breast_birads,breast_density,split"]
    finding = ["image_id,study_id,series_id,laterality,view_position,height,width,breast_birads,breast_density,"
               "finding_categories,finding_birads,xmin,ymin,xmax,ymax,split"]
    for k, (study, image, side, view, split, photometric, findings) in enumerate(MAMMO_IMAGES):
        pixels = (np.arange(h * w, dtype=np.uint16).reshape(h, w) * 20 + k)
        write_dicom(root / "images" / study / f"{image}.dicom", pixels, photometric, jpeg2000=image == "i4")
        birads = "BI-RADS 4" if any("Mass" in c for c, _ in findings) else "BI-RADS 1"
        breast.append(f"{study},ser{k},{image},{side},{view},{h},{w},{birads},DENSITY C,{split}")
        for categories, box in findings:
            coords = ",,," if box is None else ",".join(f"{v:.2f}" for v in box)
            cell = '"' + categories + '"'
            finding.append(f"{image},{study},ser{k},{side},{view},{h},{w},{birads},DENSITY C,{cell},"
                           f"{'' if box is None else 'BI-RADS 4'},{coords},{split}")
    (root / "breast-level_annotations.csv").write_text("\n".join(breast) + "\n")
    (root / "finding_annotations.csv").write_text("\n".join(finding) + "\n")
    return root
