"""The per-manifest key of the earlier layout (cache format 2), kept to find and read its entries
(a read-only migration path: :func:`find_entry`, :func:`find_slide_entry`; nothing writes that
layout): the recipe's encoder identity
(:func:`.recipe.encoder_fields` and the recipe's decode field) plus the manifest's locator hash,
image root, row count and the versions. New features are filed by recipe and image (:mod:`.store`).

The pieces of that layout live here, beside its key: the manifest's locator hash
(:func:`manifest_hash`) and the check that a keyed entry was built for a manifest
(:func:`check_manifest`), the versions an entry of that layout records (:func:`legacy_versions`)
and the bare ``<name>.npy`` frozen-token arrays of earlier releases (:func:`legacy_array`). The
format of every entry, these included, is :mod:`.entry`'s.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..data import manifest as mf
from .entry import CACHE_FORMAT, FeatureCacheError, manifest_ids, read_meta
from .entry import safe_name as safe_name
from .occlusion import OCCLUSION_COLUMNS
from .recipe import (
    DEFAULT_DECODE,
    canonical,
    decode_fields,
    encoder_fields,
    fields_key,
    library_versions,
    package_version,
)

cache_key = fields_key  # the earlier layout's name of the same hash

#: Manifest columns that locate an image's pixels: ``sample_id``, ``path`` and, on occluded rows
#: (:mod:`robustbench_fm.features.occlusion`), the erased rectangle and its fill. A manifest without
#: occlusion columns hashes exactly as before they existed.
KEY_COLUMNS = (*mf.LOCATOR_COLUMNS, *OCCLUSION_COLUMNS)


def manifest_hash(manifest: pd.DataFrame) -> str:
    """The hash of the manifest's :data:`KEY_COLUMNS` in row order (an entry's ``manifest_hash``)."""
    return mf.content_hash(manifest, KEY_COLUMNS)


def check_manifest(path: Path, fields: dict, n_rows: int, manifest: pd.DataFrame) -> np.ndarray:
    """The sample_ids of ``manifest`` once it is the manifest the keyed entry ``path`` (key fields
    ``fields``, ``n_rows`` rows) was built for: its locator hash when the fields record one, its
    row count; else a one-line :class:`~.entry.FeatureCacheError`."""
    ids = manifest_ids(manifest)
    want = fields.get("manifest_hash")
    got = manifest_hash(manifest)
    if want is not None and got != want:
        raise FeatureCacheError(f"{path}: this entry was built for manifest hash {want}, the given "
                                f"manifest hashes to {got} (rows added, removed, moved or reordered); "
                                "extract features for this manifest instead")
    if len(ids) != n_rows:
        raise FeatureCacheError(f"{path}: entry holds {n_rows} rows, manifest has {len(ids)}")
    return ids


def legacy_versions(fields: dict) -> dict:
    """What an entry's rows were made with: a chunk records ``made_with``; an entry of the
    per-manifest layout (read as an adopted chunk) its key's package and library versions."""
    if "made_with" in fields:
        return fields["made_with"]
    return canonical({"package": fields.get("package_version"), "libraries": fields.get("library_versions", {})})


def legacy_array(folder: Path, name: str) -> Path | None:
    """The frozen-token array ``<folder>/<name>.npy`` an earlier release wrote (no ``meta.json``: it
    is read in place, never written; new arrays are entries of format "array", :mod:`.entry`)."""
    path = Path(folder) / f"{name}.npy"
    return path if path.is_file() else None


def cache_key_fields(encoder, manifest: pd.DataFrame, image_root=None, decode: str = DEFAULT_DECODE) -> dict:
    """The key fields of ``encoder``'s per-manifest entry of ``manifest``: the encoder identity,
    the manifest (``content_hash(manifest, KEY_COLUMNS)``: locator and occlusion columns, no
    labels), the resolved image root (two folders holding different images under the same
    relative paths never shared an entry), the row count, the versions and the recipe's decode
    field (as :func:`.recipe.recipe_fields` has it: none for ``exact``, the key every entry made before had)."""
    return canonical({
        "cache_format": CACHE_FORMAT,
        **encoder_fields(encoder),
        "manifest_hash": manifest_hash(manifest),
        "image_root": str(Path(image_root).resolve()) if image_root is not None else None,
        "n_rows": int(len(manifest)),
        "package_version": package_version(),
        "library_versions": library_versions(),
        **decode_fields(decode),
    })


_VERSIONS = ("package_version", "library_versions")


def _matches(folder: Path, want: dict, here: str | None, ignore: tuple) -> bool:
    try:
        meta = read_meta(folder)
    except (OSError, ValueError):
        return False
    if meta is None:
        return False
    if meta.get("format") != CACHE_FORMAT or meta.get("status") != "complete":
        return False
    f = meta.get("fields") or {}
    if any(f.get(k) != v for k, v in canonical(want).items() if k not in ignore):
        return False
    if f.get("decode") != want.get("decode"):  # a scaled entry is never read for an exact request
        return False
    recorded = f.get("image_root")
    # another folder that still exists may hold other images under the same names
    return "image_root" not in ignore or recorded is None or recorded == here or not Path(recorded).exists()


def find_entry(encoder_dir: Path, want: dict, root) -> Path | None:
    """The complete entry of the per-manifest layout under ``encoder_dir`` whose key fields equal
    ``want`` but for the versions (any package or library versions: recorded, compared on use)
    and the image root, written from ``root`` or from a folder that no longer exists (a moved
    dataset); None without one."""
    here = str(Path(root).resolve())
    for folder in sorted(p for p in Path(encoder_dir).glob("*") if p.is_dir()):
        if _matches(folder, want, here, (*_VERSIONS, "image_root")):
            return folder
    return None


def find_slide_entry(cache_dir: Path, want: dict, tile_encoder, tiles: pd.DataFrame, root,
                     decode: str = DEFAULT_DECODE) -> Path | None:
    """A complete slide entry of the earlier layout (``extract_slides`` before the store: its tiles
    in a per-manifest entry named by its ``tile_entry`` field) with the slide fields ``want``
    (``tile_entry`` aside), whose tile entry holds these ``tiles`` by :func:`find_entry`'s rule
    (tiles decoded as ``decode`` says)."""
    cache_dir = Path(cache_dir)
    tile_want = cache_key_fields(tile_encoder, tiles, root, decode)
    here = str(Path(root).resolve())
    for folder in sorted(p for p in (cache_dir / safe_name(str(want["encoder"]))).glob("*") if p.is_dir()):
        if not _matches(folder, want, None, (*_VERSIONS, "tile_entry")):
            continue
        tile_entry = (read_meta(folder) or {})["fields"].get("tile_entry")
        tile_folder = cache_dir / safe_name(str(tile_encoder.spec.name)) / str(tile_entry)
        if tile_entry and _matches(tile_folder, tile_want, here, (*_VERSIONS, "image_root")):
            return folder
    return None
