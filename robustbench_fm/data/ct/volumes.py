"""NIfTI volumes in RAS orientation and their axial slices in the radiological display frame.

Volumes are reoriented with ``nibabel.as_closest_canonical`` (array axes point to patient Right,
Anterior, Superior), so a file saved with any axis-flipped or permuted affine gives the same
slices (spar.md section 3.1 extracts axial slices). An axial slice is shown as radiologists read
it: row 0 is the most anterior row, column 0 the patient's rightmost column (patient right on
the viewer's left), so ``display[row, col] = ras[X-1-col, Y-1-row, z]``.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..files import DatasetError, DatasetFileMissing

#: CT window of spar.md section 3.1 (level 50 HU, width 400 HU).
WINDOW_LEVEL, WINDOW_WIDTH = 50.0, 400.0


def load_ras(path: str | Path, dtype=np.float32, spacing: bool = False):
    """The voxel array of NIfTI ``path`` reoriented to RAS (axes x, y, z), cast to ``dtype``.
    With ``spacing``: ``(array, (sx, sy, sz))``, the voxel size in mm along the RAS axes (the
    reoriented header's zooms; NaN for an axis whose size is not a positive finite number). In
    the display frame of :func:`to_display`, columns are x and rows are y."""
    import nibabel as nib  # imported on use: it is slow to import

    path = Path(path)
    if not path.is_file():
        raise DatasetFileMissing(f"NIfTI file '{path}' not found; check dataset.root")
    try:
        img = nib.as_closest_canonical(nib.load(str(path)))
    except Exception as err:  # nibabel raises several types for corrupt headers
        raise DatasetError(f"'{path}' is not a readable NIfTI file ({err}); re-download it") from err
    data = np.asanyarray(img.dataobj)
    if data.ndim == 4 and data.shape[3] == 1:
        data = data[..., 0]
    if data.ndim != 3:
        raise DatasetError(f"'{path}' has shape {data.shape}; expected a 3-D volume")
    data = data.astype(dtype, copy=False)
    if not spacing:
        return data
    zooms = np.asarray(img.header.get_zooms()[:3], np.float64)
    return data, tuple(float(z) if np.isfinite(z) and z > 0 else float("nan") for z in zooms)


def to_display(ras: np.ndarray) -> np.ndarray:
    """Stack of axial slices (Z, H=Y, W=X) in the radiological display frame, z from inferior up."""
    return np.ascontiguousarray(ras[::-1, ::-1, :].transpose(2, 1, 0))


def window(hu: np.ndarray, level: float = WINDOW_LEVEL, width: float = WINDOW_WIDTH) -> np.ndarray:
    """CT intensities mapped linearly from [level - width/2, level + width/2] to [0, 1], clipped."""
    return np.clip((np.asarray(hu, dtype=np.float32) - (level - width / 2.0)) / width, 0.0, 1.0)
