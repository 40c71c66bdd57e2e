"""The stable Python API (docs/architecture.md, "Contracts").

* :func:`run`: an experiment (or any run the command line can do) from Python: the same pipeline,
  jobs, folders and tables as ``python -m robustbench_fm experiment=<name> [overrides]``;
* :func:`embed`: a manifest's images embedded by an encoder through the content-keyed feature
  cache, exactly as the command line's extraction does it (the same cache entry);
* ``robustbench_fm.evaluate(stage, features, manifest, **params)``: one stage on features you
  already have, the same function the command line runs after extraction.

The manifest builders are ``robustbench_fm.data.build_manifest``; the encoders
``robustbench_fm.encoders.names/get/load`` and ``load_slide``."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from . import data
from .core.errors import InvalidSetting
from .encoders import generic
from .features.options import DEFAULTS, ExtractOptions
from .methods.run import evaluate

if TYPE_CHECKING:  # the feature engine imports torch, the pipeline Hydra; importing the package does neither
    from .features.engine import FeatureSet
    from .pipeline.experiment import Outcome

__all__ = ["Outcome", "embed", "evaluate", "run"]


def __getattr__(name: str):
    """``Outcome`` (what :func:`run` returns), imported on first use: it lives with the pipeline,
    which imports Hydra, and importing the package does not."""
    if name == "Outcome":
        from .pipeline.experiment import Outcome  # lazy: the pipeline imports Hydra

        return Outcome
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def run(experiment: str = "demo", overrides: list[str] | tuple[str, ...] = (), *,
        config_dir: str | Path | None = None, run_dir: str | Path | None = None) -> Outcome:
    """Run ``experiment`` with the command line's ``overrides`` (``["paths.data_dir=/data",
    "device=cuda"]``), as ``python -m robustbench_fm experiment=<experiment> <overrides>`` does
    without ``-m``: a paper experiment's jobs one after another in this process, then the collect
    step that writes its tables; a plain run (the demo) as one job. ``run_dir``: where (default
    ``outputs/runs/<date>/<time>``, as the command line); ``config_dir``: your own config folder.

    Returns an :class:`~robustbench_fm.pipeline.experiment.Outcome`: ``run_dir``, ``tables``
    (name -> DataFrame, the files under ``<run_dir>/tables/``), ``summary`` (every job's summary
    rows) and ``errors`` (one line per job or table that failed; ``ok`` when none). Bad input
    raises :class:`~robustbench_fm.core.errors.UserError` with one line, before any job runs."""
    from .pipeline.experiment import run_experiment  # lazy: composing the configs imports Hydra

    return run_experiment(experiment, list(overrides), config_dir=config_dir, run_dir=run_dir)

DEFAULT_CACHE = Path("outputs") / "cache" / "features"  # the command line's paths.cache_dir


#: the extraction options :func:`embed` leaves at their defaults (:data:`DEFAULTS`): one call embeds
#: every row of its manifest into a fresh or current cache entry (its other options are its keywords)
EMBED_FIXED = ("shard_size", "num_shards", "shard", "on_version_change", "duplicates")


def embed(manifest: pd.DataFrame | str | Path, encoder: str, root: str | Path | None = None, *,
          model: str | None = None, pretrained: str | None = None, weights: str | Path | None = None,
          embedding: str | None = None, cache_dir: str | Path = DEFAULT_CACHE, device: str = DEFAULTS.device,
          batch_size: int = DEFAULTS.batch_size, num_workers: int | str = DEFAULTS.num_workers,
          on_bad_image: str = DEFAULTS.on_bad_image, allow_remote_code: bool = DEFAULTS.allow_remote_code,
          decode: str = DEFAULTS.decode) -> FeatureSet:
    """Embed every image of ``manifest`` with ``encoder`` through the feature cache.

    ``manifest``: a canonical manifest (``data.build_manifest``) or a CSV/parquet path read as
    ``dataset=csv`` reads it (``path`` plus optional ``sample_id``/``patient_id``/``acq_group``,
    robustbench_fm/data/csv_manifest.py). ``root``: the folder the ``path`` column is relative to
    (default for a CSV: its folder). ``encoder``: a registry name (``python -m robustbench_fm list
    encoders``) or a generic kind, ``timm``/``hf``/``open_clip`` with ``model=`` (and
    ``pretrained=`` for an open_clip tag). ``weights``: a local checkpoint file or folder, or
    ``"random"`` for a generic kind. ``embedding``: ``cls``/``patch_mean``/``pooled`` (a generic
    kind's pooling, or a registry entry's override). ``cache_dir`` defaults to the command line's
    ``outputs/cache/features`` (relative to the current folder), so a later CLI run with the same
    encoder, images and root reads this entry, and the other way round. ``decode``: how JPEGs resized
    smaller are decoded, as the command line's ``extract.decode`` (same default): ``scaled`` (at the
    largest DCT scale that leaves the resize twice its target) or ``exact`` (full size: the pixels
    of earlier releases); part of the feature store's recipe, so the two never share features.

    Returns a :class:`~robustbench_fm.features.engine.rows.FeatureSet`: ``embeddings`` (N, D) float32 in
    the manifest's row order (one row per ``sample_id``), ``sample_ids``, ``path`` (the cache
    entry), ``key``, ``n_forward`` (0 on a warm cache) and ``skipped`` (rows whose image could not be read, NaN rows).

    ``device``, ``batch_size``, ``num_workers``, ``on_bad_image``, ``allow_remote_code`` and
    ``decode`` make the call's :class:`~robustbench_fm.features.options.ExtractOptions` (checked
    there, an error naming ``embed: <keyword>``); the others are at their defaults (:data:`EMBED_FIXED`).
    """
    from .features.embed import Embedder, EncoderOptions  # lazy: the feature engine imports torch
    from .features.load import load_features  # lazy: as above

    extract = ExtractOptions.named(lambda name: f"embed: {name}", device=device, batch_size=batch_size,
                                   num_workers=num_workers, on_bad_image=on_bad_image,
                                   allow_remote_code=allow_remote_code, decode=decode)
    if not isinstance(manifest, pd.DataFrame):
        path = Path(manifest)
        root = Path(root) if root is not None else path.parent
        manifest = data.build_manifest("csv", root, verify_images=False, manifest=path)
    elif root is None:
        raise InvalidSetting("embed: pass root=<folder the manifest's paths are relative to>")
    if generic.is_generic(encoder):
        spec, local = generic.resolve(encoder, model, pretrained, weights, embedding)
        name, options = spec.name, EncoderOptions(weights=local)
    else:
        if model is not None or pretrained is not None:
            raise InvalidSetting(f"embed: model= and pretrained= are for the generic encoders "
                                 f"({', '.join(generic.GENERIC)}); '{encoder}' is a registry entry")
        name = encoder
        options = EncoderOptions(weights=str(weights) if weights is not None else None, embedding=embedding)
    service = Embedder(Path(cache_dir), extract, options={name: options})
    images = manifest.drop_duplicates("sample_id")  # as the command line: paired designs list an image once
    feats = service.embed(images, root, name)
    ids, matrix = load_features(feats.path, images)
    return dataclasses.replace(feats, sample_ids=ids, embeddings=matrix)
