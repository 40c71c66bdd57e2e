"""The feature-cache key: what determines an encoder's cached features on a manifest.

:func:`cache_key_fields` collects the fields and :func:`cache_key` hashes them; the layout the
key names is described in :mod:`robustbench_fm.features.cache`.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import sys
from pathlib import Path

import pandas as pd

from ..data import manifest as mf
from ..data.images import DEFAULT_DECODE, check_decode
from .occlusion import OCCLUSION_COLUMNS

#: Manifest columns that locate an image's pixels: ``sample_id``, ``path`` and, on occluded rows
#: (:mod:`robustbench_fm.features.occlusion`), the erased rectangle and its fill. A manifest without
#: occlusion columns hashes exactly as before they existed.
KEY_COLUMNS = (*mf.LOCATOR_COLUMNS, *OCCLUSION_COLUMNS)

#: Bump when the on-disk layout or the meaning of a key field changes.
#: 2: per-shard SHA-256 and row counts in meta.json; skipped rows (NaN + skipped.csv).
CACHE_FORMAT = 2
#: Libraries whose version can change features (module to import, distribution name).
_LIBRARIES = (("torch", "torch"), ("torchvision", "torchvision"), ("PIL", "pillow"),
              ("timm", "timm"), ("open_clip", "open_clip_torch"), ("transformers", "transformers"))


def package_version() -> str:
    """``robustbench_fm``'s installed version, else ``robustbench_fm.__version__``, else 0+unknown."""
    try:
        return importlib.metadata.version("robustbench_fm")
    except importlib.metadata.PackageNotFoundError:
        return str(getattr(sys.modules.get("robustbench_fm"), "__version__", "0+unknown"))


def library_versions() -> dict[str, str]:
    """Versions of the importable libraries that can change an encoder's features.

    Read from the installed distributions' metadata, so nothing is imported here.
    """
    out = {}
    for module, dist in _LIBRARIES:
        if importlib.util.find_spec(module) is None:
            continue
        try:
            out[module] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[module] = "unknown"
    return out


def _canonical(obj) -> dict:
    """JSON round trip: tuples become lists, odd values strings, so fields compare after I/O."""
    return json.loads(json.dumps(obj, sort_keys=True, default=str))


def manifest_hash(manifest: pd.DataFrame) -> str:
    """The hash of the manifest's :data:`KEY_COLUMNS` in row order (the key's ``manifest_hash``)."""
    return mf.content_hash(manifest, KEY_COLUMNS)


def cache_key_fields(encoder, manifest: pd.DataFrame, image_root=None, decode: str = DEFAULT_DECODE) -> dict:
    """Everything that determines the cached features of ``encoder`` on ``manifest``.

    Label columns are deliberately absent: the manifest enters only through
    ``content_hash(manifest, KEY_COLUMNS)`` (the locator and any occlusion columns). The resolved
    image root is part of the key: two folders holding different images under the same relative
    paths (a dataset stored at 224 and at 512 px, regenerated synthetic data) never share an entry.
    ``decode``: ``"scaled"`` adds ``"decode": "scaled"`` (JPEGs decoded at the DCT scale the
    encoder's resize needs, :func:`robustbench_fm.data.images.draft_scale`); ``"exact"`` adds
    nothing, so an exact entry keeps the key of an entry made before scaled decoding existed.
    """
    spec = encoder.spec
    return _canonical({
        "cache_format": CACHE_FORMAT,
        "encoder": spec.name,
        "library": spec.library,
        "hub_id": spec.hub_id,
        "revision": spec.revision,
        "model_kwargs": spec.model_kwargs,
        "architecture": spec.architecture,  # what random or bare-checkpoint weights are built into
        "arch_kwargs": spec.arch_kwargs,
        "embedding": spec.embedding,
        "embed_dim": int(spec.embed_dim),
        "preprocessing": spec.preprocessing(),
        "weights_id": encoder.weights_id,
        "precision": spec.amp_dtype if encoder.uses_amp else "fp32",
        "manifest_hash": manifest_hash(manifest),
        "image_root": str(Path(image_root).resolve()) if image_root is not None else None,
        "n_rows": int(len(manifest)),
        "package_version": package_version(),
        "library_versions": library_versions(),
        **({} if check_decode(decode) == "exact" else {"decode": decode}),
    })


def cache_key(fields: dict) -> str:
    """First 16 hex digits of the SHA-256 of ``fields`` as canonical (sorted-key) JSON."""
    blob = json.dumps(_canonical(fields), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
