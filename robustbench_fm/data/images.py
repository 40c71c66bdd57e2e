"""Open one manifest row as a PIL image, whatever format its dataset ships.

``read_image(image_root, row)`` dispatches on the row's ``path`` (relative to ``image_root``):

- ``<file>.h5#<i>`` / ``.hdf5``: row ``i`` of the file's dataset ``x`` (PatchCamelyon's key; a
  file holding a single dataset uses that one). Files are opened lazily with h5py and kept open,
  one handle per file per process (handles are never shared across a fork: a DataLoader worker
  opens its own on first use).
- ``<file>.npz#<key>``: the array ``key`` of a NumPy archive (Harvard-FairVision's
  ``slo_fundus``), read on its own without loading the archive's other members.
- DICOM (a Part-10 file, recognised by its ``DICM`` marker whatever its name, or a ``.dcm`` /
  ``.dicom`` file Pillow cannot identify, read as a bare data set): pydicom. The Modality LUT
  (rescale slope/intercept) and then the first VOI LUT, or else the first Window Center/Width,
  are applied with pydicom's own ``apply_modality_lut`` and ``apply_voi_lut``; the result is
  stretched to 0-255 (rule below) and a ``MONOCHROME1`` image is inverted (``255 - v``) so that
  dense tissue is bright, as in DICOM display order: modality LUT, VOI LUT, then polarity.
- anything else (8/16-bit PNG, JPEG, TIFF, BMP): Pillow, which recognises the format by content.

Bit depth: 8-bit data are returned unchanged. Data of any other depth (16-bit PNG/TIFF, DICOM
after its LUTs, float arrays) are stretched linearly so that the image's minimum maps to 0 and
its maximum to 255 (``(v - min) * 255 / (max - min)``, rounded to nearest, ties to even), which
keeps the full contrast of 10-12-bit data stored in 16-bit containers; a constant image becomes
all 0. (The widely used VinDr/Kaggle DICOM recipe does the same: VOI LUT, then min-max.)

EXIF orientation (issue 54): an image whose EXIF Orientation tag (TIFF 6.0 / EXIF 2.3 tag 274,
read from the header: :func:`exif_orientation`) is not 1 is turned upright with Pillow's
``ImageOps.exif_transpose``, as a viewer shows it: JPEG, TIFF, PNG, WebP files, images embedded in
parquet rows, and lesion masks (:func:`read_mask`). An image without the tag (or with 1) is
returned as before, without a copy.

Crop: when the row has ``crop_left``, ``crop_top``, ``crop_right``, ``crop_bottom`` (pixels
removed from each edge of the upright image; NaN or absent = 0) they are applied before anything
else downstream, e.g. the 20-px copyright banner of FGVC-Aircraft (catalog 1.3).

The result is mode ``'L'`` for single-channel data and ``'RGB'`` for colour (alpha dropped,
palette expanded); the encoder's own transform converts channels to what it expects.

Scaled decoding (``decode="scaled"``, the default; issue 44, docs/datasets.md "Scaled decoding"):
a caller that resizes the image down anyway passes ``need`` (:class:`Need`: the pixels its resize
must start from, :func:`need_of` an encoder's preprocessing or the prepared store's side). A
JPEG is then decoded by libjpeg directly at 1/2, 1/4 or 1/8 scale in the DCT domain (Pillow's
``Image.draft``): the largest scale that still leaves at least :data:`REDUCING_GAP` x ``need`` on
the side the resize uses (:func:`draft_scale`), so the final resize starts from at least twice
the pixels it writes and its own antialiasing filter, not libjpeg's reduced IDCT, shapes the
result (Pillow's ``Image.thumbnail`` drafts with the same ``reducing_gap=2.0``). Measured: with
a gap of 1 the final resize of a 512 px photograph drafted to 256 px is nearly the identity and
differs from the exact path by up to 43 grey levels (mean 1.5) on sharp edges; with the gap of 2
by at most 2 levels on films (mean under 0.35; ``benchmarks/cpu2/decode.json``). A scale is used
only when the edges of the region kept (the whole image, or the crop box: crop margins are
full-resolution pixels) fall on its block grid, so the decode covers exactly the source pixels
the exact path keeps: libjpeg's last row/column of blocks of a side not divisible by the scale
covers a partial block yet is one pixel wide, which shifts the geometry by up to half a decoded
pixel (measured: up to 20 grey levels after the resize on a 2,048 x 2,500 film at 1/8, against
3 at 1/4, which divides 2,500). The check applies to the cropped size. Every other format, and
``need=None`` (``decode="exact"``), decodes at full size: exactly today's pixels. A scaled
decode changes pixels (by a grey level or two after the resize), so it is part of every recipe
it feeds (the feature key, the prepared store's key) and entries made either way never mix.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import ExifTags, Image, ImageOps, UnidentifiedImageError

from ..core.errors import InvalidSetting
from .parquet_images import read_parquet_image

#: what extraction and the prepared-image store do with an image that cannot be read
#: (``extract.on_bad_image``): stop with the file named, or skip it and list it
BAD_IMAGE_POLICIES = ("error", "skip")

#: the smallest image extraction and the prepared-image store accept, in pixels on the short side
#: (after the crop columns; docs/datasets.md, "Image size"): a smaller one (a 1 x 1 placeholder, a
#: thumbnail) is an unreadable image under ``extract.on_bad_image`` (stop, or skip and list it in
#: skipped.csv), not something to upsample to 224 and score. 16 px: the smallest tiles of the
#: shipped datasets are 28 px (MNIST) and a ViT's patch is 14-16 px.
MIN_IMAGE_SIDE = 16

CROP_COLUMNS = ("crop_left", "crop_top", "crop_right", "crop_bottom")
HDF5_SUFFIXES = (".h5", ".hdf5")
DICOM_SUFFIXES = (".dcm", ".dicom")

#: how a JPEG that is resized smaller is decoded (``extract.decode``; module docstring): "scaled"
#: at the largest DCT scale that leaves the resize's target, "exact" at full size (the pixels of
#: every release before issue 44)
DECODE_MODES = ("scaled", "exact")
DEFAULT_DECODE = "scaled"
#: libjpeg's scaled decodes that Pillow's ``draft`` exposes, largest reduction first
DRAFT_SCALES = (8, 4, 2)
#: a scaled decode keeps at least this many times the resize's target (Pillow's thumbnail default)
REDUCING_GAP = 2

#: for each EXIF Orientation (TIFF 6.0 / EXIF 2.3 tag 274) that moves pixels, which stored edge
#: (0 left, 1 top, 2 right, 3 bottom) each edge of the upright image is: upright edge k is stored
#: edge ``ORIENTED_EDGES[o][k]`` (checked against Pillow's ``exif_transpose`` in the tests)
ORIENTED_EDGES = {2: (2, 1, 0, 3), 3: (2, 3, 0, 1), 4: (0, 3, 2, 1), 5: (1, 0, 3, 2), 6: (3, 0, 1, 2),
                  7: (3, 2, 1, 0), 8: (1, 2, 3, 0)}

_h5_files: dict[str, object] = {}
_h5_pid: int | None = None


def locator_file(path: str) -> str:
    """The file part of a manifest ``path`` (``'a/b_x.h5#12'`` -> ``'a/b_x.h5'``)."""
    return str(path).split("#", 1)[0]


def to_uint8(arr: np.ndarray) -> np.ndarray:
    """8-bit data unchanged; anything else stretched min->0, max->255 (module docstring)."""
    if arr.dtype == np.uint8:
        return arr
    arr = np.asarray(arr, dtype=np.float64)
    lo, hi = float(np.min(arr)), float(np.max(arr))
    if hi <= lo:
        return np.zeros(arr.shape, dtype=np.uint8)
    return np.rint((arr - lo) * 255.0 / (hi - lo)).astype(np.uint8)


def array_to_image(arr: np.ndarray, source: str) -> Image.Image:
    """(H, W), (H, W, 1) -> 'L'; (H, W, 3) -> 'RGB'; (H, W, 4) -> 'RGB' without alpha."""
    arr = np.asarray(arr)
    if arr.ndim == 3 and arr.shape[-1] in (1, 3, 4):
        arr = arr[..., 0] if arr.shape[-1] == 1 else arr[..., :3]
    if arr.ndim not in (2, 3):
        raise InvalidSetting(f"{source}: image array has shape {arr.shape}; expected (H, W) or (H, W, 3)")
    return Image.fromarray(np.ascontiguousarray(to_uint8(arr)))


def _h5_file(path: Path):
    global _h5_pid
    import h5py

    if _h5_pid != os.getpid():  # a forked worker: never use the parent's handles
        _h5_files.clear()
        _h5_pid = os.getpid()
    key = str(path)
    handle = _h5_files.get(key)
    if handle is None:
        handle = _h5_files[key] = h5py.File(path, "r")
    return handle


def _read_hdf5(file: Path, index: str) -> Image.Image:
    handle = _h5_file(file)
    names = list(handle.keys())
    name = "x" if "x" in names else (names[0] if len(names) == 1 else None)
    if name is None:
        raise InvalidSetting(f"{file}: no dataset 'x' among {names}; the locator '<file>.h5#<row>' reads "
                             "dataset 'x' or a file's only dataset")
    data = handle[name]
    try:
        i = int(index)
    except ValueError:
        raise InvalidSetting(f"{file}: row index '{index}' is not an integer; write the path as '<file>.h5#<row>'")
    if not 0 <= i < data.shape[0]:
        raise InvalidSetting(f"{file}: row {i} out of range (dataset '{name}' has {data.shape[0]} rows); "
                             "fix the '#<row>' of the path")
    return array_to_image(data[i], f"{file}#{i}")


def _read_npz(file: Path, key: str) -> Image.Image:
    with np.load(file, allow_pickle=False) as archive:
        if key not in archive.files:
            raise InvalidSetting(f"{file}: no array '{key}' (has {', '.join(archive.files)}); "
                                 "fix the '#<key>' of the path")
        return array_to_image(archive[key], f"{file}#{key}")


def _is_part10_dicom(file: Path) -> bool:
    with open(file, "rb") as f:
        return f.read(132)[128:] == b"DICM"


def _read_dicom(file: Path, force: bool = False) -> Image.Image:
    import pydicom
    from pydicom.pixels import apply_modality_lut, apply_voi_lut

    ds = pydicom.dcmread(file, force=force)
    if "TransferSyntaxUID" not in ds.file_meta:  # a bare data set: its encoding as pydicom read it
        implicit, little = ds.original_encoding
        ds.file_meta.TransferSyntaxUID = (pydicom.uid.ImplicitVRLittleEndian if implicit else
                                          pydicom.uid.ExplicitVRLittleEndian if little else
                                          pydicom.uid.ExplicitVRBigEndian)
    if int(ds.get("NumberOfFrames", 1) or 1) > 1:
        raise InvalidSetting(f"{file}: multi-frame DICOM ({ds.NumberOfFrames} frames); expected one image per file")
    arr = ds.pixel_array
    if int(ds.get("SamplesPerPixel", 1)) > 1:
        return array_to_image(arr, str(file))
    out = to_uint8(apply_voi_lut(apply_modality_lut(arr, ds), ds))
    if str(ds.get("PhotometricInterpretation", "")).upper() == "MONOCHROME1":
        out = 255 - out
    return Image.fromarray(np.ascontiguousarray(out))


@dataclass(frozen=True)
class Need:
    """The pixels a resize must start from: at least ``short`` px on the decoded image's short
    side and ``long`` px on its long side (0: no demand)."""

    short: int = 0
    long: int = 0


def check_decode(decode: str, key: str = "extract.decode") -> str:
    """``decode`` when it is one of :data:`DECODE_MODES`, else a one-line error naming ``key``."""
    if decode not in DECODE_MODES:
        raise InvalidSetting(f"{key}={decode!r}: use scaled (JPEGs decoded at the scale the resize needs, the "
                             "default) or exact (full-size decode: the pixels of earlier releases)")
    return decode


def decode_fields(decode: str = DEFAULT_DECODE) -> dict:
    """A decode mode as key fields, for every key that depends on it (the feature store's recipe,
    :func:`robustbench_fm.features.recipe.recipe_fields`; the prepared-image store's key):
    ``{"decode": "scaled"}``; none for ``exact``, so an exact entry keeps the key of an entry made
    before scaled decoding existed (and is found by it)."""
    return {} if check_decode(decode) == "exact" else {"decode": decode}


def need_of(resize: str, input_size: int, resize_size: int | None = None) -> Need:
    """What an encoder's resize (``EncoderSpec.preprocessing()``: ``resize``, ``input_size``,
    ``resize_size``) needs: ``squash`` and the prepared store's S x S both sides >= S (short side);
    ``shorter_center_crop`` the short side >= the resize size; ``longest_pad`` the long side >= S."""
    if resize == "longest_pad":
        return Need(long=int(input_size))
    if resize == "squash":
        return Need(short=int(input_size))
    return Need(short=int(resize_size or input_size))


def _margins(row: dict) -> tuple[int, int, int, int]:
    return tuple(0 if (m := row.get(c)) is None or (isinstance(m, float) and math.isnan(m)) else int(m)
                 for c in CROP_COLUMNS)


def draft_scale(size: tuple[int, int], need: Need | None, margins: tuple[int, int, int, int] = (0, 0, 0, 0)) -> int:
    """The DCT scale (8, 4, 2, else 1) to decode a ``size`` = (w, h) JPEG at for ``need``: the
    largest whose block grid the kept region's four edges lie on (the image's edges, or those of
    the crop ``margins``: left, top, right, bottom in full-resolution pixels) and whose decode of
    that region still has at least :data:`REDUCING_GAP` x ``need.short`` px on its short side and
    :data:`REDUCING_GAP` x ``need.long`` on its long side."""
    if need is None:
        return 1
    w, h = (int(v) for v in size)
    left, top, right, bottom = (int(m) for m in margins)
    for d in DRAFT_SCALES:
        if left % d or top % d or (w - right) % d or (h - bottom) % d:
            continue
        cw, ch = (w - left - right) // d, (h - top - bottom) // d
        if min(cw, ch) >= max(REDUCING_GAP * need.short, 1) and max(cw, ch) >= REDUCING_GAP * need.long:
            return d
    return 1


def scale_groups(image_root: str | Path, row: dict, needs: list[Need | None]) -> list[tuple[Need | None, list[int]]]:
    """The positions of ``needs`` grouped by the DCT scale each gives the row's image (its header
    only is read), each group with a representative need: reading the image once per group with
    that need gives every member exactly what its own need gives (a panel decodes an image once
    per distinct scale its encoders need). A file that is not a JPEG, or cannot be opened here
    (the reader reports it), is one group."""
    everyone = list(range(len(needs)))
    if len(set(needs)) <= 1:
        return [(needs[0] if needs else None, everyone)]
    rel = str(row["path"]).partition("#")[0]
    file = Path(image_root) / rel
    if file.suffix.lower() in (*HDF5_SUFFIXES, ".npz", ".parquet"):
        return [(needs[0], everyone)]
    try:
        with Image.open(file) as im:
            if im.format != "JPEG":
                return [(needs[0], everyone)]
            size, margins = im.size, stored_margins(_margins(row), exif_orientation(im))
    except Exception:  # noqa: BLE001  (the reader raises it, with the row named)
        return [(needs[0], everyone)]
    groups: dict[int, list[int]] = {}
    for k, need in enumerate(needs):
        groups.setdefault(draft_scale(size, need, margins), []).append(k)
    return [(needs[ks[0]], ks) for ks in groups.values()]


def exif_orientation(im: Image.Image) -> int:
    """The EXIF Orientation (1-8; 1 = as stored) of an opened image, read from its header only
    (the EXIF block, TIFF tags or XMP): what :func:`read_image` applies. A PNG is asked for the
    eXIf chunk before its pixel data only (Pillow's own ``PngImageFile.getexif`` decodes the whole
    image to look after it too). Absent, unreadable or out of range: 1."""
    try:
        exif = Image.Image.getexif(im) if im.format == "PNG" else im.getexif()
        value = exif.get(ExifTags.Base.Orientation, 1)
    except Exception:  # noqa: BLE001  (a damaged EXIF block: the pixels as stored)
        return 1
    return value if isinstance(value, int) and value in ORIENTED_EDGES else 1


def file_orientation(file: str | Path) -> int:
    """:func:`exif_orientation` of an image file (its header only); 1 for the HDF5, NPZ and parquet
    containers and for a file Pillow cannot open (DICOM, a missing file: no EXIF to apply)."""
    if Path(file).suffix.lower() in (*HDF5_SUFFIXES, ".npz", ".parquet"):
        return 1
    try:
        with Image.open(file) as im:
            return exif_orientation(im)
    except Exception:  # noqa: BLE001  (the reader reports an unreadable file)
        return 1


def stored_margins(margins, orientation: int) -> tuple[int, int, int, int]:
    """Margins (left, top, right, bottom) of the upright image as margins of the stored one."""
    edges = ORIENTED_EDGES.get(orientation)
    if edges is None:
        return tuple(margins)
    out = [0, 0, 0, 0]
    for k, e in enumerate(edges):
        out[e] = margins[k]
    return tuple(out)


def upright(im: Image.Image, orientation: int | None = None) -> Image.Image:
    """``im`` turned as its EXIF Orientation says (Pillow's ``ImageOps.exif_transpose``), else
    ``im`` itself (no copy). ``orientation``: :func:`exif_orientation` when already read."""
    if (exif_orientation(im) if orientation is None else orientation) == 1:
        return im
    return ImageOps.exif_transpose(im)


def _read_pillow(file: Path, need: Need | None = None, margins=(0, 0, 0, 0)) -> tuple[Image.Image, int]:
    """(the image upright and cropped, the DCT scale it was decoded at). ``margins``: the crop
    columns, pixels of the upright full-resolution image (the image as a viewer shows it). The
    scale's block-grid check and the crop itself are done in the stored orientation, where the
    decode's partial last block lies (right and bottom), then the image is turned (:func:`upright`)
    and cropped by the same margins seen upright. The file is closed on return; a loaded image
    needs no copy (its pixels live in memory, not in the file)."""
    with Image.open(file) as im:
        orientation = exif_orientation(im)
        kept = stored_margins(margins, orientation)
        full = im.size
        d = draft_scale(im.size, need, kept) if need is not None and im.format == "JPEG" else 1
        if d > 1:
            w, h = im.size
            im.draft(im.mode, (w // d, h // d))  # Pillow picks d: w // (w // d) lies in [d, 2d)
            if im.size != (-(-w // d), -(-h // d)):
                raise RuntimeError(f"{file}: Pillow decoded {im.size} at scale 1/{d} of {w}x{h}")
        im.load()
        _check_crop(margins, full if orientation in (1, 2, 3, 4) else full[::-1])
        (w, h), (left, top, right, bottom) = full, kept
        decoded = (left // d, top // d, im.size[0] - (w - right) // d, im.size[1] - (h - bottom) // d)
        im = upright(im, orientation)
        return _cut(_l_or_rgb(im, file, copy=False), _upright_margins(decoded, orientation)), d


def _upright_margins(margins, orientation: int) -> tuple[int, int, int, int]:
    edges = ORIENTED_EDGES.get(orientation)
    return tuple(margins) if edges is None else tuple(margins[e] for e in edges)


def _check_crop(margins, size) -> None:
    left, top, right, bottom = margins
    w, h = size
    if left + right >= w or top + bottom >= h:
        raise InvalidSetting(f"crop {left, top, right, bottom} leaves nothing of a {w}x{h} image; "
                             f"fix the {', '.join(CROP_COLUMNS)} columns")


def _cut(im: Image.Image, margins) -> Image.Image:
    """``im`` without ``margins`` (left, top, right, bottom) pixels."""
    left, top, right, bottom = margins
    if not (left or top or right or bottom):
        return im
    w, h = im.size
    return im.crop((left, top, w - right, h - bottom))


def _l_or_rgb(im: Image.Image, file: Path, copy: bool = True) -> Image.Image:
    if im.mode in ("L", "RGB"):
        return im.copy() if copy else im
    if im.mode in ("1", "LA", "La"):
        return im.convert("L")
    if im.mode.startswith("I") or im.mode == "F":
        return array_to_image(np.asarray(im), str(file))
    return im.convert("RGB")


def _crop(im: Image.Image, row: dict) -> Image.Image:
    """The row's crop columns applied to ``im`` (full resolution, upright)."""
    margins = _margins(row)
    if not any(margins):
        return im
    _check_crop(margins, im.size)
    return _cut(im, margins)


def read_image(image_root: str | Path, row: dict, need: Need | None = None) -> Image.Image:
    """The image of manifest ``row`` under ``image_root`` as 'L' or 'RGB' (module docstring);
    ``need``: a JPEG is decoded at the largest DCT scale that leaves it (scaled decoding)."""
    rel, _, locator = str(row["path"]).partition("#")
    file = Path(image_root) / rel
    suffix = file.suffix.lower()
    if suffix in HDF5_SUFFIXES:
        im = _read_hdf5(file, locator)
    elif suffix == ".npz":
        im = _read_npz(file, locator)
    elif suffix == ".parquet":  # PathoROB's HF snapshot: image bytes embedded in parquet rows

        im = _l_or_rgb(upright(read_parquet_image(image_root, row)), file)
    elif _is_part10_dicom(file):
        im = _read_dicom(file)
    else:
        try:
            return _read_pillow(file, need, _margins(row))[0]
        except UnidentifiedImageError:
            if suffix not in DICOM_SUFFIXES:
                raise
            im = _read_dicom(file, force=True)  # a DICOM data set without the Part-10 preamble
    return _crop(im, row)


class ImageTooSmall(InvalidSetting):
    """An image below :data:`MIN_IMAGE_SIDE` on its short side."""


def check_size(im: Image.Image) -> Image.Image:
    """``im`` when its short side is at least :data:`MIN_IMAGE_SIDE` px, else :class:`ImageTooSmall`
    (extraction names the file, the manifest row and the sample_id)."""
    w, h = im.size
    if min(w, h) < MIN_IMAGE_SIDE:
        raise ImageTooSmall(f"the image is {w}x{h} px, below the minimum of {MIN_IMAGE_SIDE} px on its short side "
                            "(docs/datasets.md); remove the row, or set extract.on_bad_image=skip to leave it out")
    return im


def read_mask(file: str | Path) -> np.ndarray:
    """A lesion mask as a boolean (H, W) array: any non-zero channel is lesion (IDRiD draws its
    lesions in red, which reads as {0, 76} in grayscale; catalog 1.4)."""
    with Image.open(file) as im:
        arr = np.asarray(upright(im))
    return arr.any(axis=-1) if arr.ndim == 3 else arr != 0
