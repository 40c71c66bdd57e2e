"""SPAR-Bench samples (spar.md section 3.1): organ tiles (Levels 1-2) and whole slices with questions (Level 3)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ...data.ct.layouts import DATASET_LAYOUTS, ORGANS, list_volumes, load_labels, sample_options
from ...data.ct.volumes import load_ras, to_display, window
from ...data.files import DatasetError, DatasetFileMissing
from .probes import L3_PROBES, TRANSFORMS, count_tumours, grid_cells, make_questions

__all__ = ["ORGANS", "L3_PROBES", "TRANSFORMS", "SparSamples", "apply_transform", "build_samples"]


@dataclass
class SparSamples:
    """One dataset's SPAR samples; row i of ``table`` is tile set i, row j of ``slice_table`` is slice j.

    ``slice_table`` also has the original slice ``height`` and ``width`` in pixels and its pixel
    spacing ``spacing_x`` (columns) and ``spacing_y`` (rows) in mm, NaN where the header gives none.
    """

    table: pd.DataFrame        # sample_id, subject_id, split, dataset, z, n_present
    tiles: np.ndarray          # uint8 (N, 16, 224, 224) windowed organ crops, black where absent
    present: np.ndarray        # bool (N, 16)
    centroids: np.ndarray      # float32 (N, 16, 2) (x, y) in [0, 1]; NaN where absent
    centroids_px: np.ndarray   # float32 (N, 16, 2) pixels of the 224x224 resized slice
    grid_cells: np.ndarray     # int64 (N, 16) L2 target cell of each slot (a permutation of 0..15)
    slices: np.ndarray         # uint8 (M, 224, 224) windowed whole slices (Level 3)
    slice_table: pd.DataFrame  # sample_id, subject_id, split, dataset, z
    questions: pd.DataFrame    # question_id, probe, slice_row, transform, organ_a..organ_d, label, n_classes, split
    # per-slice measurements the Level-3 labels derive from (rows of ``slice_table``):
    slice_present: np.ndarray | None = None    # bool (M, 16) organs present (in their inter-quartile range)
    slice_centroids: np.ndarray | None = None  # float32 (M, 16, 2) normalised (x, y); NaN where absent
    slice_areas: np.ndarray | None = None      # int64 (M, 16) organ pixels in the original slice
    slice_tumours: np.ndarray | None = None    # int64 (M,) tumour components (-1: no tumour labels)


def apply_transform(image: np.ndarray, transform: str) -> np.ndarray:
    """The image as a question presents it; works on the last two axes (H, W).

    'hflip' mirrors columns, 'vflip' mirrors rows, 'rot90' rotates 90 degrees counter-clockwise
    (``np.rot90``), 'rot180' rotates 180 degrees.
    """
    if transform == "none":
        return image
    if transform == "hflip":
        return image[..., :, ::-1]
    if transform == "vflip":
        return image[..., ::-1, :]
    if transform == "rot90":
        return np.rot90(image, 1, axes=(-2, -1))
    if transform == "rot180":
        return image[..., ::-1, ::-1]
    raise ValueError(f"unknown transform {transform!r}; use one of {', '.join(TRANSFORMS)}")


# ---------------------------------------------------------------------------------------------
# Building the samples (spar.md section 3.1)

#: Bumped whenever sample construction changes, so old caches are rebuilt.
SAMPLES_VERSION = 3  # 2: relative-position labels in the patient's side convention; 3: grid cells keep
# uncontested centroid cells, 8-connected tumour counts, distances in mm
_ARRAYS = ("tiles", "present", "centroids", "centroids_px", "grid_cells", "slices", "slice_present",
           "slice_centroids", "slice_areas", "slice_tumours")


def slice_frame_mm(slice_table: pd.DataFrame) -> np.ndarray:
    """(width, height) of every slice in mm [M, 2] (pixels times spacing); NaN where the spacing is
    unknown (a table without spacing columns: all NaN)."""
    if not {"spacing_x", "spacing_y"} <= set(slice_table.columns):
        return np.full((len(slice_table), 2), np.nan)
    return np.stack([slice_table["width"] * slice_table["spacing_x"], slice_table["height"] * slice_table["spacing_y"]],
                    -1).astype(np.float64)


def _resize(image: np.ndarray, size: int) -> np.ndarray:
    """A [0, 1] float image resized to size x size (bilinear, antialiased) as uint8."""
    from PIL import Image

    out = np.asarray(Image.fromarray(np.ascontiguousarray(image, np.float32))  # mode "F"
                     .resize((size, size), Image.Resampling.BILINEAR))
    return np.clip(np.rint(out * 255.0), 0, 255).astype(np.uint8)


def organ_presence(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-slice organ areas (Z, 16) in pixels and presence (Z, 16) of a display-frame label stack.

    An organ counts as present on slice z when it has pixels there and z lies in the
    inter-quartile range (25th-75th percentile, inclusive) of the slices holding that organ, so
    the ends of each organ's axial extent, where it is only partly visible, are not used.
    """
    n_z = labels.shape[0]
    areas = np.stack([np.bincount(labels[z].ravel(), minlength=len(ORGANS) + 1)[1:] for z in range(n_z)])
    present = np.zeros(areas.shape, bool)
    z = np.arange(n_z)
    for o in range(len(ORGANS)):
        zs = np.flatnonzero(areas[:, o])
        if len(zs):
            q25, q75 = np.percentile(zs, [25, 75])
            present[:, o] = (areas[:, o] > 0) & (z >= q25) & (z <= q75)
    return areas, present


def slice_measurements(labels2d: np.ndarray, present: np.ndarray):
    """Centroids (16, 2) normalised (x, y) (NaN where absent) and bounding boxes of the present organs.

    Centroid x = (mean column + 0.5) / W and y = (mean row + 0.5) / H, the pixel-centre mean in
    slice units, so it lands on the same anatomy after resizing the slice to any size.
    """
    from scipy import ndimage

    h, w = labels2d.shape
    flat = labels2d.ravel()
    count = np.bincount(flat, minlength=len(ORGANS) + 1)[1:]
    rows, cols = np.divmod(np.arange(flat.size), w)
    mean_r = np.bincount(flat, weights=rows, minlength=len(ORGANS) + 1)[1:] / np.maximum(count, 1)
    mean_c = np.bincount(flat, weights=cols, minlength=len(ORGANS) + 1)[1:] / np.maximum(count, 1)
    centroids = np.stack([(mean_c + 0.5) / w, (mean_r + 0.5) / h], -1).astype(np.float32)
    centroids[~present] = np.nan
    boxes = ndimage.find_objects(labels2d, max_label=len(ORGANS))
    return centroids, [boxes[o] if present[o] else None for o in range(len(ORGANS))]


def _volume_samples(volume, size: int, min_organs: int) -> dict:
    """Tile sets and Level-3 slices of one volume (section 3.1)."""
    hu_ras, spacing = load_ras(volume.image, spacing=True)
    hu = to_display(hu_ras)
    organ_ras, tumour_ras = load_labels(volume)
    labels = to_display(organ_ras)
    if labels.shape != hu.shape:
        raise DatasetError(f"'{volume.labels}' has {labels.shape[::-1]} voxels but '{volume.image}' "
                         f"{hu.shape[::-1]}; the label map must match its image")
    tumour = None if tumour_ras is None else to_display(tumour_ras)
    areas, present = organ_presence(labels)
    out = {k: [] for k in ("z", "l3_z", "tiles", "tile_present", "tile_centroids", "slices", "present",
                           "centroids", "areas", "tumours")}
    for z in np.flatnonzero(present.any(1)):
        windowed = window(hu[z])
        centroids, boxes = slice_measurements(labels[z], present[z])
        out["l3_z"].append(z)
        out["slices"].append(_resize(windowed, size))
        out["present"].append(present[z])
        out["centroids"].append(centroids)
        out["areas"].append(areas[z])
        out["tumours"].append(-1 if tumour is None else count_tumours(tumour[z]))
        if present[z].sum() >= min_organs:
            tiles = np.zeros((len(ORGANS), size, size), np.uint8)
            for o, box in enumerate(boxes):
                if box is not None:
                    tiles[o] = _resize(windowed[box], size)
            out["z"].append(z)
            out["tiles"].append(tiles)
            out["tile_present"].append(present[z])
            out["tile_centroids"].append(centroids)
    out["shape"] = (int(hu.shape[1]), int(hu.shape[2]))
    out["spacing"] = spacing[:2]  # mm per display column (x) and row (y)
    return out


def _volumes(dataset: str, root: Path, opts: dict) -> tuple[list, list]:
    """(volumes of the dataset's own layout, LiTS candidate volumes for the counting probe)."""

    if dataset not in DATASET_LAYOUTS:
        raise DatasetError(f"unknown SPAR dataset {dataset!r}; use one of {', '.join(DATASET_LAYOUTS)}")
    layout = DATASET_LAYOUTS[dataset]
    if layout == "lits":
        return [], list_volumes("lits", root)
    lits_root = opts["lits_root"]
    if lits_root is None and dataset == "spar_phantom_word" and (root / "lits").is_dir():
        lits_root = root / "lits"  # written by the generator unless n_lits = 0
    if lits_root is not None and not Path(lits_root).is_dir():
        raise DatasetFileMissing(f"dataset '{dataset}': LiTS folder '{lits_root}' does not exist; set "
                                "dataset.options.lits_root to it, or to null to leave out the counting probe")
    return list_volumes(layout, root), ([] if lits_root is None else list_volumes("lits", lits_root))


#: options added after caches existed, left out of the key at their default so those caches stay valid
_UNHASHED = {("distance_rule", "random")}


def content_key(dataset: str, volumes: list, seed: int, opts: dict) -> str:
    """Hash of what the samples depend on: file names and sizes, seed, options, SAMPLES_VERSION."""
    import hashlib
    import json

    for v in volumes:  # a file a volume needs (a TotalSegmentator class file) that is not there: one line
        for p in [v.image, *v.label_files()]:
            if not p.is_file():
                what = "each class file of its segmentations folder" if p.parent == v.labels else "it"
                raise DatasetFileMissing(f"{v.dataset} subject {v.subject_id}: '{p}' not found (the volume needs "
                                         f"{what}); restore it from the download, or remove the subject")
    files = [(v.dataset, v.subject_id, v.split, *[(p.name, p.stat().st_size) for p in [v.image, *v.label_files()]])
             for v in volumes]
    blob = json.dumps({"version": SAMPLES_VERSION, "dataset": dataset, "seed": int(seed),
                       "options": {k: v for k, v in opts.items() if k != "lits_root" and (k, v) not in _UNHASHED},
                       "files": files}, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def load_samples(folder: str | Path) -> SparSamples:
    """A cached sample folder written by ``build_samples``; tiles and slices are memory-mapped."""
    folder = Path(folder)
    if not (folder / "meta.json").is_file():
        raise FileNotFoundError(f"'{folder}' is not a complete SPAR sample cache; delete it and rebuild")
    arrays = {k: np.load(folder / f"{k}.npy", mmap_mode="r" if k in ("tiles", "slices") else None) for k in _ARRAYS}
    tables = {k: pd.read_parquet(folder / f"{k}.parquet") for k in ("table", "slice_table", "questions")}
    return SparSamples(**tables, **arrays)


def build_samples(dataset: str, root: str | Path, cache_dir: str | Path, seed: int = 42, **options) -> SparSamples:
    """The SPAR samples of ``dataset`` under ``root``, built once and cached (spar.md section 3.1).

    Axial slices come from the inter-quartile range of each organ's axial extent
    (``organ_presence``). Levels 1-2 keep slices with >= ``min_organs`` present organs: each
    organ is cropped to its tightest bounding box from the windowed slice (level 50, width 400)
    and resized to ``size`` x ``size``, absent organs are black tiles, slots in ``ORGANS`` order.
    Level 3 uses every such slice whole, windowed and resized, with ``probes.make_questions``
    (seeded by ``seed``; ``distance_questions`` distance questions per slice, drawn by
    ``distance_rule``: ``random`` or ``varying``). The counting
    probe uses the first ``n_lits`` LiTS volumes (by volume number) with tumour on at least one
    of their selected liver slices, from ``lits_root``
    (``root/lits`` for ``spar_phantom_word``); LiTS slices carry only counting questions.
    The result lives in ``<cache_dir>/spar/<dataset>-<content key>/``; a second call with the
    same files, seed and options loads it without reading any NIfTI file.
    """
    import os
    import shutil

    root, opts = Path(root), sample_options(dataset, options)
    own, lits = _volumes(dataset, root, opts)
    folder = Path(cache_dir) / "spar" / f"{dataset}-{content_key(dataset, own + lits, seed, opts)}"
    if (folder / "meta.json").is_file():
        return load_samples(folder)
    tmp = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:  # a failed build (a bad volume, Ctrl-C) leaves no .tmp-<pid> folder in the cache
        _write_samples(tmp, dataset, root, seed, opts, own, lits)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        os.replace(tmp, folder)
    except OSError:  # another process finished the same cache first
        shutil.rmtree(tmp, ignore_errors=True)
    return load_samples(folder)


def _write_samples(tmp: Path, dataset: str, root: Path, seed: int, opts: dict, own: list, lits: list) -> None:
    """The sample files of :func:`build_samples` written into ``tmp``."""
    import json

    size, min_organs = int(opts["size"]), int(opts["min_organs"])
    rows, l3_rows, small = [], [], {k: [] for k in ("present", "centroids", "l3_present", "l3_centroids", "areas",
                                                     "tumours")}
    n_lits_used, shard = 0, 0
    for volume in own + lits:
        if volume.dataset == "lits" and n_lits_used >= int(opts["n_lits"]):
            break
        part = _volume_samples(volume, size, min_organs)
        if volume.dataset == "lits":
            if max(part["tumours"], default=0) <= 0:
                continue  # the counting probe uses LiTS volumes with tumour labels on its slices
            n_lits_used += 1
        ids = {"subject_id": volume.subject_id, "split": volume.split, "dataset": volume.dataset}
        rows += [{"sample_id": f"{volume.subject_id}_z{z:04d}", **ids, "z": int(z),
                  "n_present": int(p.sum())} for z, p in zip(part["z"], part["tile_present"])]
        l3_rows += [{"sample_id": f"{volume.subject_id}_z{z:04d}", **ids, "z": int(z), "height": part["shape"][0],
                     "width": part["shape"][1], "spacing_x": part["spacing"][0], "spacing_y": part["spacing"][1]}
                    for z in part["l3_z"]]
        np.save(tmp / f"tiles-{shard:05d}.npy",
                np.asarray(part["tiles"], np.uint8).reshape(-1, len(ORGANS), size, size))
        np.save(tmp / f"slices-{shard:05d}.npy", np.asarray(part["slices"], np.uint8).reshape(-1, size, size))
        small["present"] += part["tile_present"]
        small["centroids"] += part["tile_centroids"]
        for key, src in (("l3_present", "present"), ("l3_centroids", "centroids"), ("areas", "areas"),
                         ("tumours", "tumours")):
            small[key] += part[src]
        shard += 1
    if not l3_rows:
        raise DatasetError(f"dataset '{dataset}' under '{root}': no slice holds a labelled organ; check the label "
                           "maps (each must label its image's organs with the layout's ids)")
    if own and not rows:
        most = max((int(np.asarray(p).sum()) for p in small["l3_present"]), default=0)
        raise DatasetError(f"dataset '{dataset}' under '{root}': no slice holds min_organs={min_organs} present "
                           f"organs (the most on any slice: {most}), so Levels 1-2 have no sample; lower "
                           f"dataset.options.min_organs (e.g. {max(most, 1)}) or check the label maps")
    n_slots = len(ORGANS)
    present = np.asarray(small["present"], bool).reshape(-1, n_slots)
    centroids = np.asarray(small["centroids"], np.float32).reshape(-1, n_slots, 2)
    table_cols = ["sample_id", "subject_id", "split", "dataset", "z", "n_present"]
    table = pd.DataFrame(rows, columns=table_cols).astype({"z": np.int64, "n_present": np.int64})
    slice_table = pd.DataFrame(l3_rows, columns=[*table_cols[:5], "height", "width", "spacing_x", "spacing_y"]).astype(
        {"z": np.int64, "height": np.int64, "width": np.int64, "spacing_x": np.float64, "spacing_y": np.float64})
    per_slice = {"slice_present": np.asarray(small["l3_present"], bool).reshape(-1, n_slots),
                 "slice_centroids": np.asarray(small["l3_centroids"], np.float32).reshape(-1, n_slots, 2),
                 "slice_areas": np.asarray(small["areas"], np.int64).reshape(-1, n_slots),
                 "slice_tumours": np.asarray(small["tumours"], np.int64)}
    questions = make_questions(slice_table, per_slice["slice_present"], per_slice["slice_centroids"],
                               per_slice["slice_areas"], (slice_table["height"] * slice_table["width"]).to_numpy(),
                               per_slice["slice_tumours"], np.random.default_rng(seed), size=size,
                               distance_questions=int(opts["distance_questions"]), frame_mm=slice_frame_mm(slice_table),
                               distance_rule=str(opts["distance_rule"]))
    for name, n, shape in (("tiles", len(table), (n_slots, size, size)), ("slices", len(slice_table), (size, size))):
        out = np.lib.format.open_memmap(tmp / f"{name}.npy", mode="w+", dtype=np.uint8, shape=(n, *shape))
        start = 0
        for i in range(shard):
            part = np.load(tmp / f"{name}-{i:05d}.npy")
            out[start:start + len(part)] = part
            start += len(part)
            (tmp / f"{name}-{i:05d}.npy").unlink()
        out.flush()
        del out
    np.save(tmp / "present.npy", present)
    np.save(tmp / "centroids.npy", centroids)
    np.save(tmp / "centroids_px.npy", centroids * np.float32(size))
    np.save(tmp / "grid_cells.npy", grid_cells(centroids, present))
    for name, array in per_slice.items():
        np.save(tmp / f"{name}.npy", array)
    for name, frame in (("table", table), ("slice_table", slice_table), ("questions", questions)):
        frame.to_parquet(tmp / f"{name}.parquet", index=False)
    (tmp / "meta.json").write_text(json.dumps({"dataset": dataset, "root": str(root), "seed": int(seed),
                                               "options": opts, "version": SAMPLES_VERSION,
                                               "n_lits_used": n_lits_used}, default=str, indent=1))
