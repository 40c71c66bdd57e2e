"""The one way a run gets images embedded: an :class:`Embedder` holds the extraction settings of
a run and the per-encoder options the user gave (weights, embedding, batch size), and applies them
the same way on every path: the app's panel extraction, a stage that embeds its own images
(CANDOR's retention re-embeds occluded images; SPAR reads token sequences) and slide aggregation.
Stages receive an Embedder; they never see the command-line config.

Features come from the per-image feature store (:mod:`robustbench_fm.features.store`): a manifest
is served by looking up its images, and only images no earlier run embedded are embedded.

With a ``resolution`` (``resolution=224`` on the command line; candor.md "Scope": "Every image is
stored at 224x224 pixels. The image processor of each encoder then resizes it") the images the
store does not hold yet are first stored at that size in the prepared-image store
(:mod:`robustbench_fm.data.prepared`), once for all encoders, and the encoders read the stored
copies; an image's identity is then its source's plus the prepared recipe, so it differs from a
native run's. ``resolution=None`` (``native``) reads the images as the dataset ships them. Slide
aggregation (:meth:`Embedder.embed_slides`) reads its tiles as shipped either way."""
from __future__ import annotations

import dataclasses
import gc
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from .. import encoders
from ..core.errors import InvalidSetting
from ..core.text import one_line
from ..data import prepared
from ..data.images import CROP_COLUMNS, DEFAULT_DECODE
from . import load, store
from .cache import FeatureCacheError
from .extract import FeatureSet, _unwritable
from .panel import extract, extract_panel
from .slides import extract_slides

log = logging.getLogger("robustbench_fm.features")

#: Share of the free device memory (of available RAM on CPU) that the weights of one panel pass
#: may take; the rest is left to activations and decode buffers.
PANEL_MEMORY_SHARE = 0.5


def _free_bytes(device: torch.device) -> int:
    """Free memory of ``device``: CUDA's ``mem_get_info``, else ``MemAvailable`` (Linux), else 8 GiB."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30


@dataclass(frozen=True)
class EncoderOptions:
    """What the user set for one encoder (``encoder.weights=...`` and friends); unset = the
    registry's defaults. ``embedding`` replaces the spec's pooling (e.g. the CLS vs patch-mean
    ablation); ``batch_size`` overrides the run's; ``tile_weights`` is a slide encoder's tile
    encoder's checkpoint."""

    weights: str | None = None
    tile_weights: str | None = None
    embedding: str | None = None
    batch_size: int | None = None


@dataclass(frozen=True)
class Embedder:
    """Extraction settings of a run (``extract.*``, ``device``, ``paths.cache_dir``,
    ``security.allow_remote_code``) and :class:`EncoderOptions` per encoder name."""

    cache_dir: Path
    device: str = "auto"
    batch_size: int = 32
    num_workers: int | str = 0
    shard_size: int = 1024
    on_bad_image: str = "error"
    num_shards: int = 1
    shard: int = 0
    allow_remote_code: bool = True
    options: dict[str, EncoderOptions] = field(default_factory=dict)
    #: side in pixels every image is stored at before the encoders read it; None: native
    resolution: int | None = None
    #: where the prepared-image store lives (default: ``prepared`` beside ``cache_dir``)
    prepared_dir: Path | None = None
    #: bytes the weights of one panel pass may take (None: :data:`PANEL_MEMORY_SHARE` of what is free)
    panel_memory: int | None = None
    #: rows made with other package/library versions: reuse (one-line notice), warn, recompute
    on_version_change: str = "reuse"
    #: how JPEGs resized smaller are decoded (``extract.decode``: scaled or exact; data.images, keyed)
    decode: str = DEFAULT_DECODE

    def _options(self, name: str) -> EncoderOptions:
        return self.options.get(name, EncoderOptions())

    def spec(self, name: str, **changes) -> encoders.EncoderSpec:
        """The registry's spec of ``name`` with the user's embedding override (and ``changes``)."""
        spec = encoders.get(name)
        embedding = self._options(name).embedding
        if embedding and embedding != spec.embedding:
            changes = {"embedding": embedding, **changes}
        return dataclasses.replace(spec, **changes) if changes else spec

    def batch_size_of(self, name: str) -> int:
        """The batch size of encoder ``name``: its own override, else the run's."""
        return int(self._options(name).batch_size or self.batch_size)

    def load(self, name: str, device: str | None = None, **changes):
        """Encoder ``name`` loaded with the user's weights and overrides (``changes`` replace spec
        fields, e.g. SPAR's per-encoder input size)."""
        return encoders.load(self.spec(name, **changes), weights=self._options(name).weights,
                             device=self.device if device is None else device,
                             allow_remote_code=self.allow_remote_code)

    @property
    def prepared_root(self) -> Path:
        return Path(self.prepared_dir) if self.prepared_dir is not None else Path(self.cache_dir).parent / "prepared"

    def prepare(self, manifest: pd.DataFrame, root: str | Path | None,
                identities=None) -> tuple[pd.DataFrame, Path | None]:
        """``(manifest, root)`` the encoders read: unchanged at native resolution, else the manifest
        pointing into the prepared-image store at ``resolution`` px and the store's folder (written
        on the first call, read by every later one). ``identities``: each row's source identity
        (:func:`.store.source_ids`): images an earlier entry holds are read from it, not decoded."""
        if self.resolution is None or root is None:
            return manifest, root
        done = prepared.prepare(manifest, root, self.prepared_root, self.resolution, shard_size=self.shard_size,
                                workers=self.num_workers, on_bad_image=self.on_bad_image, identities=identities,
                                decode=self.decode)
        return done.manifest, done.root

    def embed(self, manifest: pd.DataFrame, root: str | Path | None, encoder, sharded: bool = False) -> FeatureSet:
        """Every row of ``manifest`` embedded by ``encoder``, a name or an encoder :meth:`load`
        returned, from the images at the run's ``resolution`` (:meth:`prepare`), served from the
        per-image store (:mod:`.store`: only images no earlier run embedded are embedded).
        ``sharded``: only this run's part ``shard`` of ``num_shards``. The entry is read later
        (``read=False``)."""
        return self.embed_panel(manifest, root, [encoder], sharded=sharded)[0]

    def panel_groups(self, names: list[str], specs: dict | None = None) -> list[list[str]]:
        """``names`` split into consecutive passes whose fp32 weights (``params_m`` x 4 bytes) fit
        :attr:`panel_memory` together; an encoder larger than that gets a pass of its own.
        ``specs``: the specs of encoders given loaded (by name), else the registry's."""
        budget = self.panel_memory
        if budget is None:
            budget = int(PANEL_MEMORY_SHARE * _free_bytes(encoders.resolve_device(self.device)))
        groups, used = [], 0
        for name in names:
            spec = (specs or {}).get(name) or self.spec(name)
            need = int(float(spec.params_m) * 1e6 * 4)
            if not groups or used + need > budget:
                groups.append([])
                used = 0
            groups[-1].append(name)
            used += need
        return groups

    def embed_panel(self, manifest: pd.DataFrame, root: str | Path | None, names: list,
                    sharded: bool = False) -> list[FeatureSet]:
        """Every row of ``manifest`` embedded by every encoder of ``names`` (image encoders: names or
        loaded encoders), served from the per-image store (:mod:`.store`): each manifest row's
        image is looked up by its content identity and only the images no chunk of the encoder's
        recipe holds are embedded, each once; encoders that miss the same images share a decode
        pass (:func:`robustbench_fm.features.panel.extract_panel`) as far as their weights fit in
        memory together (:meth:`panel_groups`). Returns one FeatureSet per encoder, in order, whose
        ``path`` is the manifest's view (read by ``load_features``; ``read=False``)."""
        manifest = manifest.reset_index(drop=True)
        _check_rows(manifest)
        if root is None:
            raise InvalidSetting("image_root is required (manifest paths are relative to it)")
        t0 = time.perf_counter()
        hashes = store.FileHashes(self.cache_dir)
        # an image's identity is its source file's, also when the encoders read a prepared copy
        # (that copy's bytes depend on which manifest's store holds it; the prepared recipe does not)
        ids = store.image_ids(manifest, root, hashes)
        sources = None
        if self.resolution is not None:
            sources = store.source_ids(manifest, root, hashes)  # what the prepared store finds images by
            ids = store.derived_ids(ids, prepared.recipe(self.resolution, self.decode))
        hashes.save()
        source, source_root = manifest, root
        todo = [n if isinstance(n, str) else n.spec.name for n in names]
        given = {n.spec.name: n for n in names if not isinstance(n, str)}
        out: dict[str, FeatureSet] = {}
        for group in self.panel_groups(todo, {n: e.spec for n, e in given.items()}):
            loaded = [given.get(n) or self.load(n) for n in group]
            manifest, root = self._readable(source, source_root, ids, loaded, sources)
            plans = [self._plan(enc, manifest, ids, root) for enc in loaded]
            counts = self._fill(loaded, plans, root, sharded)
            for enc, p, (n_forward, n_images) in zip(loaded, plans, counts):
                out[enc.spec.name] = self._result(p, manifest, root, n_forward, n_images, time.perf_counter() - t0)
            del loaded
            gc.collect()  # the pass's models go before the next pass loads its own
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        return [out[n] for n in todo]

    def _readable(self, manifest: pd.DataFrame, root, ids, loaded: list,
                  sources=None) -> tuple[pd.DataFrame, Path]:
        """``(manifest, root)`` the encoders of a pass read: at native resolution the manifest itself;
        else the images no complete chunk of some encoder holds are first stored at the run's
        resolution (:meth:`prepare`, which finds each by its source identity ``sources`` in the
        entries already stored and decodes only the others; none: nothing is decoded) and their
        rows point into the prepared store, while the rows every encoder already holds keep their
        source locators (looked up by identity, never read). When no row is held, the whole
        manifest is prepared, its own entry read first as before the per-image store (so an entry
        of the earlier layout is still found)."""
        if self.resolution is None:
            return manifest, Path(root)
        have = [store.Recipe(self.cache_dir, enc, decode=self.decode).held(complete=True) for enc in loaded]
        need = np.array([any(i not in h for h in have) for i in ids], bool)
        if need.all():
            read, read_root = self.prepare(manifest, root, sources)
            return read.reset_index(drop=True), Path(read_root)
        if not need.any():
            return manifest, Path(self.prepared_root)
        read, read_root = self.prepare(manifest[need].reset_index(drop=True), root,
                                       None if sources is None else sources[need])
        out = manifest.drop(columns=[c for c in CROP_COLUMNS if c in manifest.columns])
        out["path"] = out["path"].astype(object)
        out.loc[need, "path"] = read["path"].to_numpy()
        return out, Path(read_root)

    def _plan(self, encoder, manifest: pd.DataFrame, ids, root) -> store.Plan:
        recipe = store.Recipe(self.cache_dir, encoder, decode=self.decode)
        if not recipe.covers(ids):  # an entry of the earlier per-manifest layout may hold them
            recipe.adopt(encoder, manifest, root, ids)
        try:
            p = store.plan(recipe, manifest, ids, self.on_version_change)
        except OSError as exc:
            if not _unwritable(exc, Path(self.cache_dir)):
                raise
            raise FeatureCacheError(
                f"feature cache '{self.cache_dir}' is not writable ({one_line(exc)}) and '{encoder.spec.name}' has "
                f"{recipe.n_missing(ids)} of {len(set(map(str, ids)))} images of this manifest to embed; set "
                "paths.cache_dir=<a writable folder>") from None
        if self.on_bad_image == "error":  # images an earlier run skipped are read again (and stop the run if bad)
            filling = {c.name for c, _ in p.fill}
            for c in p.chunks:
                if c.name not in filling and len(load.read_skipped(recipe.chunk_folder(c))):
                    rows = recipe.chunk_manifest(c, manifest, ids)
                    if rows is not None:
                        p.fill.append((c, rows))
        if not p.fill:
            log.info("cache hit: %d rows, 0 forward passes (%s)", len(ids),
                     store.view_path(recipe, manifest, ids)[0])
        notice = store.version_notice(p, self.on_version_change)
        if notice:
            (log.warning if self.on_version_change == "warn" else log.info)("%s", notice)
        return p

    def _fill(self, loaded: list, plans: list[store.Plan], root, sharded: bool) -> list[tuple[int, int]]:
        """Embed what each plan still needs; encoders missing the same images share one pass.
        Returns (forward batches, images embedded) per encoder."""
        counts = [[0, 0] for _ in loaded]
        groups: dict[str, list] = {}
        for j, p in enumerate(plans):
            for chunk, rows in p.fill:
                groups.setdefault(store._hash(list(rows["sample_id"]), list(rows["path"].astype(str))), []).append(
                    (j, chunk, rows))
        parts = dict(num_shards=self.num_shards if sharded else 1, shard=self.shard if sharded else 0)
        for items in groups.values():
            rows = items[0][2]
            entries = [(plans[j].recipe.chunk_folder(c), plans[j].recipe.chunk_cache(c).fields) for j, c, _ in items]
            encs = [loaded[j] for j, _, _ in items]
            if len(encs) == 1:
                feats = [extract(encs[0], rows, root, self.cache_dir, batch_size=self.batch_size_of(encs[0].spec.name),
                                 num_workers=self.num_workers, shard_size=self.shard_size,
                                 on_bad_image=self.on_bad_image, read=False, entry=entries[0], decode=self.decode,
                                 **parts)]
            else:
                feats = extract_panel(encs, rows, root, self.cache_dir,
                                      batch_size=[self.batch_size_of(e.spec.name) for e in encs],
                                      num_workers=self.num_workers, shard_size=self.shard_size,
                                      on_bad_image=self.on_bad_image, read=False, entries=entries, decode=self.decode,
                                      **parts)
            for (j, c, _), f in zip(items, feats):
                counts[j][0] += f.n_forward
                counts[j][1] += f.n_images_embedded
                c._cache = None  # re-read its meta (now complete, or this part's shards)
        return [tuple(c) for c in counts]

    def _result(self, p: store.Plan, manifest: pd.DataFrame, root, n_forward: int, n_images: int,
                seconds: float) -> FeatureSet:
        folder = store.write_view(p, manifest)
        missing = load.missing_shards(folder)
        table = load.read_skipped(folder) if not missing else None
        skipped = [] if table is None else [str(s) for s in table["sample_id"]]
        if table is not None:
            store.write_view_skipped(folder, table)
        fields = {**store.view_fields(p.recipe, manifest, p.ids), "image_root": str(Path(root).resolve())}
        return FeatureSet(sample_ids=manifest["sample_id"].astype(str).to_numpy(), embeddings=None,
                          key=folder.name, path=folder, n_forward=n_forward, n_images_embedded=n_images,
                          seconds=seconds, images_per_s=n_images / seconds if n_images and seconds else 0.0,
                          fields={**fields, "recipe": p.recipe.fields}, skipped=skipped,
                          missing_shards=missing)

    def embed_slides(self, manifest: pd.DataFrame, root: str | Path, name: str) -> Path:
        """Slide embeddings of the slides of ``manifest`` by slide encoder ``name`` (tiles embedded
        by its tile encoder first); returns the cache entry."""

        opts = self._options(name)
        return extract_slides(name, manifest, root, self.cache_dir, weights=opts.weights,
                              tile_weights=opts.tile_weights, device=self.device,
                              batch_size=self.batch_size_of(name), num_workers=self.num_workers,
                              shard_size=self.shard_size, on_bad_image=self.on_bad_image,
                              allow_remote_code=self.allow_remote_code)


def _check_rows(manifest: pd.DataFrame) -> None:
    """What every served manifest needs: unique sample_ids and a path per row."""
    for col in ("sample_id", "path"):
        if col not in manifest.columns:
            raise InvalidSetting(f"manifest has no '{col}' column; validate it with "
                                 "robustbench_fm.data.manifest.validate")
    ids = manifest["sample_id"].astype(str)
    dup = ids.duplicated()
    if dup.any():
        j = int(dup.to_numpy().nonzero()[0][0])
        raise InvalidSetting(f"manifest row {j}: duplicate sample_id {ids.iloc[j]!r}; one row per image")
