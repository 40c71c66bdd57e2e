"""NIfTI volumes in RAS orientation and their axial slices in the radiological display frame.

Volumes are reoriented with ``nibabel.as_closest_canonical`` (array axes point to patient Right,
Anterior, Superior), so a file saved with any axis-flipped or permuted affine gives the same
slices (spar.md section 3.1 extracts axial slices). A label map is read in its image's space
only: its affine must equal the image's (:func:`check_same_space`), else the organs would be
cut from a mirrored or shifted place. A header without pixel spacing (``pixdim`` 0, which
nibabel silently reads as 1 mm) gives NaN spacing (:func:`load_ras`). An axial slice is shown as radiologists read
it: row 0 is the most anterior row, column 0 the patient's rightmost column (patient right on
the viewer's left), so ``display[row, col] = ras[X-1-col, Y-1-row, z]``.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..files import DatasetError, DatasetFileMissing

#: CT window of spar.md section 3.1 (level 50 HU, width 400 HU).
WINDOW_LEVEL, WINDOW_WIDTH = 50.0, 400.0
#: A label map and its image are one space when their affines agree to this many mm in every
#: entry (``np.allclose(atol=..., rtol=0)``): float32 header rounding and qform/sform round trips
#: are below 1e-4 mm, a voxel is 0.5-5 mm, so 0.01 mm passes rounding and nothing else.
AFFINE_TOLERANCE_MM = 0.01


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
    # nibabel reads a pixdim of 0 as 1 mm (with a notice): the file's own header says "unknown"
    for axis, known in enumerate(_stored_spacing_known(path)):
        if not known:
            zooms[_ras_axis(path, axis)] = np.nan
    return data, tuple(float(z) if np.isfinite(z) and z > 0 else float("nan") for z in zooms)


def _stored_spacing_known(path: Path) -> list[bool]:
    """Per stored array axis (x, y, z): whether the file's header holds a positive, finite pixdim."""
    import nibabel as nib
    from nibabel.openers import ImageOpener

    header_class = type(nib.load(str(path)).header)
    with ImageOpener(str(path)) as f:
        raw = header_class.from_fileobj(f, check=False)
    pixdim = np.asarray(raw["pixdim"][1:4], np.float64)
    return [bool(np.isfinite(v) and v > 0) for v in pixdim]


def _ras_axis(path: Path, stored_axis: int) -> int:
    """The RAS axis (of :func:`load_ras`'s array) that stored array axis ``stored_axis`` becomes."""
    import nibabel as nib
    from nibabel.orientations import io_orientation

    return int(io_orientation(nib.load(str(path)).affine)[stored_axis, 0])


def affine(path: str | Path) -> np.ndarray:
    """The voxel-to-world (mm) affine of NIfTI ``path``, from its header (the data is not read)."""
    import nibabel as nib

    try:
        return np.asarray(nib.load(str(path)).affine, np.float64)
    except Exception as err:  # nibabel raises several types for corrupt headers
        raise DatasetError(f"'{path}' is not a readable NIfTI file ({err}); re-download it") from err


def check_same_space(image: str | Path, labels: str | Path, image_affine: np.ndarray | None = None) -> None:
    """Refuse, naming both files, a label map whose affine differs from its image's by more than
    :data:`AFFINE_TOLERANCE_MM` (a mirrored, permuted or shifted header): reoriented from their own
    headers the two would not overlay, and the organs would be cut from the wrong place.
    ``image_affine``: the image's, when the caller read it already (one image, many class files)."""
    from nibabel.orientations import aff2axcodes

    mine = affine(image) if image_affine is None else image_affine
    theirs = affine(labels)
    if np.allclose(mine, theirs, rtol=0.0, atol=AFFINE_TOLERANCE_MM):
        return
    axes = "".join(aff2axcodes(mine)), "".join(aff2axcodes(theirs))
    how = (f"axes {axes[1]} against the image's {axes[0]}" if axes[0] != axes[1] else
           f"the same axes ({axes[0]}), offset or scaled by up to {np.abs(mine - theirs).max():.3g} mm")
    raise DatasetError(f"label map '{labels}' and its image '{image}' are not in one space: {how} (their affines "
                       f"differ beyond the {AFFINE_TOLERANCE_MM} mm of header rounding); re-save the label map "
                       "with its image's affine, or fix whichever header is wrong")


def to_display(ras: np.ndarray) -> np.ndarray:
    """Stack of axial slices (Z, H=Y, W=X) in the radiological display frame, z from inferior up."""
    return np.ascontiguousarray(ras[::-1, ::-1, :].transpose(2, 1, 0))


def window(hu: np.ndarray, level: float = WINDOW_LEVEL, width: float = WINDOW_WIDTH) -> np.ndarray:
    """CT intensities mapped linearly from [level - width/2, level + width/2] to [0, 1], clipped."""
    return np.clip((np.asarray(hu, dtype=np.float32) - (level - width / 2.0)) / width, 0.0, 1.0)
