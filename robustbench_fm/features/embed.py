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
from ..data import prepared
from ..data.images import CROP_COLUMNS, DECODE_MODES, Need, need_of
from ..encoders.options import EncoderOptions
from . import engine
from .cache import FeatureSet
from .options import DEFAULTS, ExtractOptions
from .slides import extract_slides
from .store import FeatureStore, Identities

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
class Embedder:
    """A run's extraction: its options (:class:`~.options.ExtractOptions`, the plan's ``extract``,
    held unchanged and handed to the store and the engine), the feature cache folder
    (``paths.cache_dir``) and :class:`EncoderOptions` per encoder name."""

    cache_dir: Path
    #: ``extract.*``, ``device``, ``security.allow_remote_code``, ``cache.on_version_change``
    extract: ExtractOptions = DEFAULTS
    options: dict[str, EncoderOptions] = field(default_factory=dict)
    #: side in pixels every image is stored at before the encoders read it; None: native
    resolution: int | None = None
    #: where the prepared-image store lives (default: ``prepared`` beside ``cache_dir``)
    prepared_dir: Path | None = None
    #: bytes the weights of one panel pass may take (None: :data:`PANEL_MEMORY_SHARE` of what is free)
    panel_memory: int | None = None

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
        return int(self._options(name).batch_size or self.extract.batch_size)

    def load(self, name: str, device: str | None = None, **changes):
        """Encoder ``name`` loaded with the user's weights and overrides (``changes`` replace spec
        fields, e.g. SPAR's per-encoder input size)."""
        return encoders.load(self.spec(name, **changes), weights=self._options(name).weights,
                             device=self.extract.device if device is None else device,
                             allow_remote_code=self.extract.allow_remote_code)

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
        x = self.extract
        done = prepared.prepare(manifest, root, self.prepared_root, self.resolution, shard_size=x.shard_size,
                                workers=x.num_workers, on_bad_image=x.on_bad_image, identities=identities,
                                decode=x.decode)
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
            budget = int(PANEL_MEMORY_SHARE * _free_bytes(encoders.resolve_device(self.extract.device)))
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
        loaded encoders), served from the per-image store (:meth:`.store.FeatureStore.serve`): each
        manifest row's image is looked up by its content identity and only the images no chunk of
        the encoder's recipe holds are embedded, each once; encoders that miss the same images share
        a decode pass (:func:`robustbench_fm.features.engine.extract_panel`, the store's backend)
        as far as their weights fit in memory together (:meth:`panel_groups`). Returns one
        FeatureSet per encoder, in order, whose ``path`` is the manifest's view (read by
        ``load_features``; ``read=False``)."""
        manifest = manifest.reset_index(drop=True)
        if root is None:
            raise InvalidSetting("image_root is required (manifest paths are relative to it)")
        t0 = time.perf_counter()
        features = self.store()
        # an image's identity is its source file's, also when the encoders read a prepared copy
        # (that copy's bytes depend on which manifest's store holds it; the prepared recipe does not);
        # the store checks the manifest's rows first (.store.check_rows)
        ids = features.identities(manifest, root, *self._prepared_recipes())
        source, source_root = manifest, root
        todo = [n if isinstance(n, str) else n.spec.name for n in names]
        given = {n.spec.name: n for n in names if not isinstance(n, str)}
        out: dict[str, FeatureSet] = {}
        for group in self.panel_groups(todo, {n: e.spec for n, e in given.items()}):
            loaded = [given.get(n) or self.load(n) for n in group]
            manifest, root = self._readable(features, source, source_root, ids, loaded)
            for enc, f in zip(loaded, features.serve(manifest, root, loaded, ids, self.backend(sharded), t0)):
                out[enc.spec.name] = f
            del loaded
            gc.collect()  # the pass's models go before the next pass loads its own
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        return [out[n] for n in todo]

    def store(self) -> FeatureStore:
        """The feature store this run's features are served from."""
        return FeatureStore(self.cache_dir, self.extract)

    def backend(self, sharded: bool = False):
        """The extraction engine with this run's options: the store's :data:`.store.Backend`
        (``sharded``: only this run's part of each entry; else the whole entry, :meth:`.ExtractOptions.whole`)."""
        return engine.backend(self.cache_dir, self.extract if sharded else self.extract.whole(), self.batch_size_of)

    def _prepared_recipes(self) -> tuple[dict | None, Need | None]:
        """The prepared-image store's recipe by decode mode and what its resize needs (None, None
        at native resolution): what the feature store identifies a prepared copy by."""
        if self.resolution is None:
            return None, None
        return {m: prepared.recipe(self.resolution, m) for m in DECODE_MODES}, need_of("squash", int(self.resolution))

    def _readable(self, features: FeatureStore, manifest: pd.DataFrame, root, ids: Identities,
                  loaded: list) -> tuple[pd.DataFrame, Path]:
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
        sources = ids.sources
        need = ~np.logical_and.reduce([features.held(enc, ids) for enc in loaded])
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

    def embed_slides(self, manifest: pd.DataFrame, root: str | Path, name: str) -> Path:
        """Slide embeddings of the slides of ``manifest`` by slide encoder ``name`` (tiles embedded
        by its tile encoder first); returns the cache entry."""

        opts = self._options(name)
        return extract_slides(name, manifest, root, self.cache_dir, weights=opts.weights,
                              tile_weights=opts.tile_weights, batch_size=self.batch_size_of(name),
                              options=self.extract)

