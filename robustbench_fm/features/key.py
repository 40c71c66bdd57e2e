"""The per-manifest key of the earlier layout (cache format 2), kept to find and read its entries
(a read-only migration path: :func:`find_entry`, :func:`find_slide_entry`; nothing writes that
layout): the recipe's encoder identity
(:func:`.recipe.encoder_fields` and the recipe's decode field) plus the manifest's locator hash,
image root, row count and the versions. New features are filed by recipe and image (:mod:`.store`).
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from .cache import CACHE_FORMAT, manifest_hash
from .cache import _safe_name as safe_name
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


def _matches(meta_path: Path, want: dict, here: str | None, ignore: tuple) -> bool:
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError):
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
    for meta_path in sorted(Path(encoder_dir).glob("*/meta.json")):
        if _matches(meta_path, want, here, (*_VERSIONS, "image_root")):
            return meta_path.parent
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
    for meta_path in sorted((cache_dir / safe_name(str(want["encoder"]))).glob("*/meta.json")):
        if not _matches(meta_path, want, None, (*_VERSIONS, "tile_entry")):
            continue
        tile_entry = json.loads(meta_path.read_text())["fields"].get("tile_entry")
        tile_meta = cache_dir / safe_name(str(tile_encoder.spec.name)) / str(tile_entry) / "meta.json"
        if tile_entry and _matches(tile_meta, tile_want, here, (*_VERSIONS, "image_root")):
            return meta_path.parent
    return None
