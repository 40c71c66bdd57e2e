"""Slide-level features (croma.md §2.6 and A.12): a slide encoder aggregates the cached tile
embeddings of each slide into one slide embedding, and the slide embeddings are cached as a
feature-cache entry of their own.

Tile layout (one folder per slide of the slide manifest, named by its ``sample_id``)::

    <root>/<tiles_dir>/<slide sample_id>/<x>_<y>.png     (or .jpg / .jpeg / .tif / .tiff)

``x``, ``y`` = the tile's level-0 pixel position (the coordinates TITAN, Prov-GigaPath and MOOZY
take). A tiler such as TRIDENT or CLAM writes the tiles; pick the magnification and tile size of
the slide encoder's tile encoder (catalog 2.3: 20x; 224 px, 512 px for TITAN/CONCH v1.5).

:func:`extract_slides` has the feature store (:class:`~.store.FeatureStore`) serve every tile
with the slide encoder's tile encoder (per image: reused, resumable) and then aggregates slide by
slide into the store's entry ``<cache>/<slide encoder>/<key>/`` (:meth:`.store.FeatureStore.entry`),
whose key fields are the slide encoder's identity (hub id, weights id, slide kwargs), the tiles'
view in the store (tile encoder recipe, the tiles' images) and the slide manifest's locator hash.
Slide shards are written whole and atomically under the entry's lock like tile shards, so an
interrupted run resumes at the first missing shard. A slide entry of the earlier layout (tiles in
a per-manifest entry) is read as it is (:func:`.key.find_slide_entry`).
"""
from __future__ import annotations

import dataclasses
import logging
import re
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from .. import encoders
from ..core.errors import InvalidSetting
from ..data import manifest as mf
from . import engine
from .cache import CACHE_FORMAT
from .key import find_slide_entry
from .options import ExtractOptions
from .recipe import library_versions, package_version
from .store import FeatureStore, gather, read_view, view_path

log = logging.getLogger("robustbench_fm.features")

TILE_NAME = re.compile(r"^(\d+)_(\d+)\.(png|jpe?g|tiff?)$", re.IGNORECASE)


def slide_tiles(slides: pd.DataFrame, root: str | Path, tiles_dir: str = "tiles") -> pd.DataFrame:
    """The tile manifest of ``slides`` (module doc layout): sample_id ``<slide>/<x>_<y>``, path,
    slide (the slide's sample_id), x, y; slides in manifest order, tiles by (y, x)."""
    root = Path(root)
    parts = []
    for slide in pd.unique(slides["sample_id"].astype(str)):
        folder = root / tiles_dir / slide
        names = [p.name for p in folder.iterdir() if TILE_NAME.match(p.name)] if folder.is_dir() else []
        if not names:
            raise FileNotFoundError(f"slide '{slide}': no tiles '<x>_<y>.png' in {folder}; tile the slide "
                                    f"into {root / tiles_dir}/<slide id>/ first")
        xy = np.array([[int(v) for v in TILE_NAME.match(n).groups()[:2]] for n in names])
        order = np.lexsort((xy[:, 0], xy[:, 1]))
        names, xy = [names[i] for i in order], xy[order]
        parts.append(pd.DataFrame({"sample_id": [f"{slide}/{n.rsplit('.', 1)[0]}" for n in names],
                                   "path": [f"{tiles_dir}/{slide}/{n}" for n in names],
                                   "slide": slide, "x": xy[:, 0], "y": xy[:, 1]}))
    return pd.concat(parts, ignore_index=True)


def slide_key_fields(slide_encoder, tile_key: str, slides: pd.DataFrame) -> dict:
    """What determines a slide entry: the slide encoder, the tiles' view in the feature store (an
    entry of the earlier layout named a per-manifest tile entry, :func:`.key.find_slide_entry`)
    and the slide locators."""
    spec = slide_encoder.spec
    return {"cache_format": CACHE_FORMAT, "encoder": spec.name, "library": spec.library, "hub_id": spec.hub_id,
            "revision": spec.revision, "architecture": spec.architecture, "slide_kwargs": spec.slide_kwargs,
            "embedding": spec.embedding, "embed_dim": int(spec.embed_dim), "weights_id": slide_encoder.weights_id,
            "tile_encoder": spec.tile_encoder, "tile_entry": tile_key,
            "manifest_hash": mf.content_hash(slides, mf.LOCATOR_COLUMNS), "n_rows": int(len(slides)),
            "package_version": package_version(), "library_versions": library_versions()}


def extract_slides(encoder, manifest: pd.DataFrame, root: str | Path, cache_dir: str | Path,
                   tile_encoder=None, tiles: pd.DataFrame | None = None, tiles_dir: str = "tiles",
                   weights=None, tile_weights=None, batch_size: int | None = None, progress: bool = True, *,
                   options: ExtractOptions | None = None, **settings) -> Path:
    """Slide embeddings of every slide (``sample_id``) of ``manifest`` with slide encoder
    ``encoder`` (a registry name or a loaded :class:`~robustbench_fm.encoders.SlideEncoder`);
    returns the cache entry folder, whose rows follow the manifest's distinct sample_ids.

    ``tiles``: the tile manifest (columns sample_id, path, slide, x, y); default
    :func:`slide_tiles` under ``root/tiles_dir``. ``tile_encoder`` (name or loaded encoder)
    defaults to the slide encoder's own; the tiles are served by the feature store (only those
    it does not hold are embedded, with :func:`robustbench_fm.features.engine.extract`'s options). Tiles
    skipped as unreadable (``on_bad_image="skip"``) are left out of their slide's bag. The
    extraction options: ``options`` (:class:`~.options.ExtractOptions`: the run's) or ``settings``,
    its fields by name, read as the store and engine read them (``decode``: how the tiles' JPEGs are
    decoded, part of the tiles' recipe, so of the slide entry's key through the tiles' view; every
    part of the tiles' entries: :meth:`~.options.ExtractOptions.whole`); ``batch_size``: the tile
    batch size (default: the options').
    """
    options = (ExtractOptions(**settings) if options is None else dataclasses.replace(options, **settings)).whole()
    device, allow_remote_code, decode = options.device, options.allow_remote_code, options.decode

    slide_enc = encoder if isinstance(encoder, encoders.SlideEncoder) else encoders.load_slide(
        encoder, weights=weights, device=device, allow_remote_code=allow_remote_code)
    spec = slide_enc.spec
    slides = manifest.drop_duplicates("sample_id").reset_index(drop=True)
    tiles = slide_tiles(slides, root, tiles_dir) if tiles is None else tiles.reset_index(drop=True)
    missing = [c for c in ("sample_id", "path", "slide", "x", "y") if c not in tiles.columns]
    if missing:
        raise InvalidSetting(f"tile manifest: columns {', '.join(missing)} missing; pass sample_id, path, slide, x, y")
    order = pd.Index(slides["sample_id"].astype(str)).get_indexer(tiles["slide"].astype(str))
    if (order < 0).any() or (np.diff(order) < 0).any() or set(order) != set(range(len(slides))):
        raise InvalidSetting("tile manifest: every slide needs tiles, listed contiguously in slide-manifest order, and "
                         "no tile may name a slide outside the manifest")
    tile_enc = tile_encoder if isinstance(tile_encoder, encoders.Encoder) else encoders.load(
        tile_encoder or spec.tile_encoder, weights=tile_weights, device=device, allow_remote_code=allow_remote_code)
    if tile_enc.spec.name != spec.tile_encoder:
        raise InvalidSetting(f"slide encoder '{spec.name}' aggregates '{spec.tile_encoder}' tiles, "
                         f"not '{tile_enc.spec.name}'")
    store = FeatureStore(cache_dir, options)
    tiles = tiles.reset_index(drop=True)
    ids = store.identities(tiles, root)
    # the tiles' view (where the store has them) names the slide entry; its shards are checked when read
    tile_view = view_path(store.look_up(tile_enc, tiles, ids, root, check=False), tiles)[0].name
    fields = slide_key_fields(slide_enc, tile_view, slides)
    if not store.settled(fields):
        # an exact tile entry serves a scaled request too (exact is the reference)
        for mode in dict.fromkeys([decode, "exact"]):
            old = find_slide_entry(Path(cache_dir), fields, tile_enc, tiles[["sample_id", "path"]], root, mode)
            if old is not None:
                log.info("%s: %d slides read from %s (written by an earlier layout)", spec.name, len(slides), old)
                return old
    bounds = np.searchsorted(order, np.arange(len(slides) + 1))
    xy = tiles[["x", "y"]].to_numpy(np.int64)
    view: list = []

    def aggregate(lo: int, hi: int):
        if not view:  # the tiles are embedded (only those the store lacks) when a slide needs them
            run = engine.backend(cache_dir, options, None if batch_size is None else (lambda _name: int(batch_size)),
                                 progress=progress)
            view.append(read_view(store.serve(tiles, root, [tile_enc], ids, run)[0].path))
        bag_rows = view[0].iloc[bounds[lo]:bounds[hi]].reset_index(drop=True)
        bags = gather(bag_rows) if len(bag_rows) else np.zeros((0, 0), np.float32)
        out = np.empty((hi - lo, spec.embed_dim), np.float32)
        for j in range(lo, hi):
            bag = bags[bounds[j] - bounds[lo]:bounds[j + 1] - bounds[lo]]
            coords = xy[bounds[j]:bounds[j + 1]]
            keep = np.isfinite(bag).all(axis=1)
            out[j - lo] = slide_enc.embed_slide(torch.from_numpy(bag[keep]),
                                                torch.from_numpy(coords[keep])).cpu().numpy()
        return slides["sample_id"].astype(str)[lo:hi], out

    entry, computed = store.entry(fields, len(slides), options.shard_size, aggregate)
    if computed:
        log.info("%s: %d slides aggregated from %d '%s' tiles (%d shards computed) -> %s", spec.name, len(slides),
                 len(tiles), spec.tile_encoder, computed, entry)
    else:
        log.info("%s: cache hit, %d slides (%s)", spec.name, len(slides), entry)
    return entry
