"""The one way a run gets images embedded: an :class:`Embedder` holds the extraction settings of
a run and the per-encoder options the user gave (weights, embedding, batch size), and applies them
the same way on every path: the app's panel extraction, a stage that embeds its own images
(CANDOR's retention re-embeds occluded images; SPAR reads token sequences) and slide aggregation.
Stages receive an Embedder; they never see the command-line config.

With a ``resolution`` (``resolution=224`` on the command line; candor.md "Scope": "Every image is
stored at 224x224 pixels. The image processor of each encoder then resizes it") every manifest is
first stored at that size in the content-keyed prepared-image store
(:mod:`robustbench_fm.data.prepared`), once for all encoders, and the encoders read the stored
images; the feature-cache key then names the store's locators and folder, so it differs from a
native run's. ``resolution=None`` (``native``) reads the images as the dataset ships them. Slide
aggregation (:meth:`Embedder.embed_slides`) reads its tiles as shipped either way."""
from __future__ import annotations

import dataclasses
import gc
import logging
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch

from .. import encoders
from ..data import prepared
from .extract import FeatureSet, extract
from .panel import extract_panel
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

    def prepare(self, manifest: pd.DataFrame, root: str | Path | None) -> tuple[pd.DataFrame, Path | None]:
        """``(manifest, root)`` the encoders read: unchanged at native resolution, else the manifest
        pointing into the prepared-image store at ``resolution`` px and the store's folder (written
        on the first call, read by every later one)."""
        if self.resolution is None or root is None:
            return manifest, root
        done = prepared.prepare(manifest, root, self.prepared_root, self.resolution, shard_size=self.shard_size,
                                workers=self.num_workers, on_bad_image=self.on_bad_image)
        return done.manifest, done.root

    def embed(self, manifest: pd.DataFrame, root: str | Path | None, encoder, sharded: bool = False) -> FeatureSet:
        """Every row of ``manifest`` embedded (through the content-keyed cache) by ``encoder``, a
        name or an encoder :meth:`load` returned, from the images at the run's ``resolution``
        (:meth:`prepare`). ``sharded``: only this run's part ``shard`` of ``num_shards``. The
        entry is read later (``read=False``)."""
        manifest, root = self.prepare(manifest, root)
        return self._extract(encoder, manifest, root, sharded)

    def _extract(self, encoder, manifest: pd.DataFrame, root: str | Path | None, sharded: bool) -> FeatureSet:
        """One encoder's entry of images already at the run's resolution."""
        if isinstance(encoder, str):
            encoder = self.load(encoder)
        return extract(encoder, manifest, root, self.cache_dir, batch_size=self.batch_size_of(encoder.spec.name),
                       num_workers=self.num_workers, shard_size=self.shard_size, on_bad_image=self.on_bad_image,
                       num_shards=self.num_shards if sharded else 1, shard=self.shard if sharded else 0,
                       read=False)

    def panel_groups(self, names: list[str]) -> list[list[str]]:
        """``names`` split into consecutive passes whose fp32 weights (``params_m`` x 4 bytes) fit
        :attr:`panel_memory` together; an encoder larger than that gets a pass of its own."""
        budget = self.panel_memory
        if budget is None:
            budget = int(PANEL_MEMORY_SHARE * _free_bytes(encoders.resolve_device(self.device)))
        groups, used = [], 0
        for name in names:
            need = int(float(self.spec(name).params_m) * 1e6 * 4)
            if not groups or used + need > budget:
                groups.append([])
                used = 0
            groups[-1].append(name)
            used += need
        return groups

    def embed_panel(self, manifest: pd.DataFrame, root: str | Path | None, names: list[str],
                    sharded: bool = False) -> list[FeatureSet]:
        """Every row of ``manifest`` embedded by every encoder of ``names`` (image encoders), each
        image decoded once per pass (:func:`robustbench_fm.features.panel.extract_panel`): the
        encoders that fit in memory together share a pass (:meth:`panel_groups`), the rest follow
        in further passes. Each entry is the one :meth:`embed` fills, byte for byte, from the images
        at the run's ``resolution`` (prepared once for the whole panel, :meth:`prepare`). A pass of
        one encoder is a plain extraction. Returns one FeatureSet per name, in order (``read=False``)."""
        out: dict[str, FeatureSet] = {}
        manifest, root = self.prepare(manifest, root)
        groups = self.panel_groups(list(names))
        for group in groups:
            if len(group) == 1:
                out[group[0]] = self._extract(group[0], manifest, root, sharded)
                continue
            if len(groups) > 1:
                log.info("panel pass of %d encoders (%s)", len(group), ", ".join(group))
            loaded = [self.load(name) for name in group]
            feats = extract_panel(loaded, manifest, root, self.cache_dir,
                                  batch_size=[self.batch_size_of(n) for n in group], num_workers=self.num_workers,
                                  shard_size=self.shard_size, on_bad_image=self.on_bad_image,
                                  num_shards=self.num_shards if sharded else 1, shard=self.shard if sharded else 0,
                                  read=False)
            out.update(zip(group, feats))
            del loaded, feats
            gc.collect()  # the pass's models go before the next pass loads its own
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        return [out[n] for n in names]

    def embed_slides(self, manifest: pd.DataFrame, root: str | Path, name: str) -> Path:
        """Slide embeddings of the slides of ``manifest`` by slide encoder ``name`` (tiles embedded
        by its tile encoder first); returns the cache entry."""

        opts = self._options(name)
        return extract_slides(name, manifest, root, self.cache_dir, weights=opts.weights,
                              tile_weights=opts.tile_weights, device=self.device,
                              batch_size=self.batch_size_of(name), num_workers=self.num_workers,
                              shard_size=self.shard_size, on_bad_image=self.on_bad_image,
                              allow_remote_code=self.allow_remote_code)
