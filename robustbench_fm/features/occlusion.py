"""Occluded images as manifest rows: CANDOR's erasure retention (candor.md, "Occlusion Retention";
candor_v1.md Eq. 4, "x ⊖ b_F ... the image with that region mean-filled").

An occluded image is an ordinary manifest row whose locator carries the rectangle to erase:

- ``occlude_x0, occlude_y0, occlude_x1, occlude_y1``: the rectangle, normalised to 0-1 of the
  image as read (after the ``crop_*`` columns), NaN = no occlusion;
- ``occlude_fill``: what goes in it (:data:`FILLS`).

The extraction engine applies :func:`occlude_row` to every image between reading it and the
encoder's own transform, and the feature-cache key hashes these columns with ``sample_id`` and
``path``, so occluded images are cache entries like any other.

Pixels: the rectangle covers every pixel it touches, columns ``floor(x0 * W)`` to
``ceil(x1 * W) - 1`` (rows likewise), at least one pixel. ``image_mean`` fills it with the
per-channel mean of the whole image before occlusion (the image's DC level, so the erased region
carries no local evidence and no brightness cue); ``box_mean`` with the per-channel mean of the
rectangle itself (texture removed, local brightness kept). Means are computed in float64 and
rounded to the nearest integer (ties to even); the image keeps its mode ('L' or 'RGB').

Control box (candor.md, "Occlusion Retention and Discordance"): the same size at the
horizontally mirrored position, or, when the mirror overlaps the box, a uniformly random
position of the same size that does not overlap it (:func:`control_box`).
"""
from __future__ import annotations

import math
import zlib

import numpy as np
from PIL import Image

from ..core.errors import InvalidSetting

OCCLUSION_BOX_COLUMNS = ("occlude_x0", "occlude_y0", "occlude_x1", "occlude_y1")
FILL_COLUMN = "occlude_fill"
#: Locator columns of an occluded row (hashed into the feature-cache key).
OCCLUSION_COLUMNS = (*OCCLUSION_BOX_COLUMNS, FILL_COLUMN)
FILLS = ("image_mean", "box_mean")


def check_fill(fill: str) -> str:
    if fill not in FILLS:
        raise InvalidSetting(f"occlusion fill {fill!r} unknown; use one of {', '.join(FILLS)}")
    return fill


def pixel_box(box, width: int, height: int) -> tuple[int, int, int, int]:
    """Normalised (x0, y0, x1, y1) -> pixel bounds [c0, c1) x [r0, r1) of every pixel it touches."""
    x0, y0, x1, y1 = (float(v) for v in box)
    if not (0.0 <= x0 <= x1 <= 1.0 and 0.0 <= y0 <= y1 <= 1.0):
        raise InvalidSetting(f"occlusion box {x0, y0, x1, y1} is not 0 <= x0 <= x1 <= 1, 0 <= y0 <= y1 <= 1; "
                         f"fix the {', '.join(OCCLUSION_BOX_COLUMNS)} columns")
    c0, r0 = min(int(math.floor(x0 * width)), width - 1), min(int(math.floor(y0 * height)), height - 1)
    c1, r1 = max(int(math.ceil(x1 * width)), c0 + 1), max(int(math.ceil(y1 * height)), r0 + 1)
    return c0, r0, min(c1, width), min(r1, height)


def occlude(im: Image.Image, box, fill: str = "image_mean") -> Image.Image:
    """A copy of ``im`` with the normalised rectangle ``box`` filled (module docstring)."""
    check_fill(fill)
    arr = np.array(im)
    c0, r0, c1, r1 = pixel_box(box, im.width, im.height)
    region = arr[r0:r1, c0:c1]
    source = arr if fill == "image_mean" else region
    arr[r0:r1, c0:c1] = np.rint(source.astype(np.float64).mean(axis=(0, 1))).astype(arr.dtype)
    return Image.fromarray(arr)


def occlude_row(im: Image.Image, row: dict) -> Image.Image:
    """``im`` occluded as manifest ``row``'s occlusion columns say; unchanged without them."""
    box = [row.get(c) for c in OCCLUSION_BOX_COLUMNS]
    if any(v is None or (isinstance(v, float) and math.isnan(v)) for v in box):
        return im
    fill = row.get(FILL_COLUMN)
    return occlude(im, box, "image_mean" if fill is None or fill != fill else str(fill))


def mask_box(mask: np.ndarray) -> tuple[float, float, float, float]:
    """Normalised (x0, y0, x1, y1) enclosing every True pixel of a boolean (H, W) mask; NaN if none."""
    ys, xs = np.nonzero(mask)
    if not len(xs):
        return (float("nan"),) * 4
    h, w = mask.shape
    return xs.min() / w, ys.min() / h, (xs.max() + 1) / w, (ys.max() + 1) / h


def mirror(box) -> tuple[float, float, float, float]:
    """The box mirrored about the image's vertical midline (x -> 1 - x)."""
    x0, y0, x1, y1 = (float(v) for v in box)
    return 1.0 - x1, y0, 1.0 - x0, y1


def overlaps(a, b) -> bool:
    """True when boxes ``a`` and ``b`` share a region of positive area (touching edges do not)."""
    return min(a[2], b[2]) > max(a[0], b[0]) and min(a[3], b[3]) > max(a[1], b[1])


def control_box(box, rng: np.random.Generator) -> tuple[tuple[float, float, float, float] | None, str]:
    """The control rectangle of ``box`` and how it was placed: ``"mirror"``, ``"random"`` or ``"none"``.

    Random: the top-left corner uniform over every position of a same-size box inside the image
    that does not overlap ``box`` (the allowed corners are the image's corner range minus an open
    rectangle, split into at most four disjoint strips drawn by area). When no such position
    exists (no room for a same-size box left or right of the box, nor above or below it; or only
    a zero-area set of positions is left) the control is ``None``.
    """
    box = tuple(float(v) for v in box)
    mirrored = mirror(box)
    if not overlaps(box, mirrored):
        return mirrored, "mirror"
    x0, y0, x1, y1 = box
    w, h = x1 - x0, y1 - y0
    cx, cy = 1.0 - w, 1.0 - h  # top-left corners range over [0, cx] x [0, cy]
    # forbidden corners: (x0 - w, x1) x (y0 - h, y1), open; the allowed strips (lx, hx, ly, hy):
    fx0, fx1, fy0, fy1 = max(0.0, x0 - w), min(cx, x1), max(0.0, y0 - h), min(cy, y1)
    strips = [(0.0, fx0, 0.0, cy), (fx1, cx, 0.0, cy), (fx0, fx1, 0.0, fy0), (fx0, fx1, fy1, cy)]
    areas = np.array([max(0.0, b - a) * max(0.0, d - c) for a, b, c, d in strips])
    if areas.sum() <= 0:
        return None, "none"
    lx, hx, ly, hy = strips[int(rng.choice(4, p=areas / areas.sum()))]
    u, v = rng.uniform(lx, hx), rng.uniform(ly, hy)
    return (u, v, u + w, v + h), "random"


def sample_rng(seed: int, sample_id: str) -> np.random.Generator:
    """One generator per sample, so a sample's control does not depend on the other rows."""
    return np.random.default_rng([int(seed), zlib.crc32(str(sample_id).encode())])
