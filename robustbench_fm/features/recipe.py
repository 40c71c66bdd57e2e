"""The recipe: what makes an encoder's vector of one image, defined here first; the feature store
(:mod:`.store`) files every vector under its recipe, and the earlier per-manifest key
(:mod:`.key`, read-only) is this encoder identity plus a manifest.

:func:`encoder_fields` is the encoder's identity (entry, weights, architecture, preprocessing,
pooling, precision); :func:`recipe_fields` adds how JPEGs are decoded (``extract.decode``:
scaled or exact; exact adds no field, so every entry written before scaled decoding keeps its
key), :data:`RECIPE_VERSION` and the *major* versions of torch and of the encoder's own library.
No manifest, no absolute path, no patch version: a patch release of a library the encoder does
not use cannot change its features; the versions a row was made with are recorded per chunk
(:func:`made_with`) and compared on use (``cache.on_version_change``). Torch-free.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import sys

from ..data.images import DEFAULT_DECODE, decode_fields

#: Bump when what a recipe's vectors mean changes (preprocessing semantics, pooling code, the
#: batch rule): every chunk of an older recipe version is then left alone and images re-embedded.
#: 1: batches padded to the batch size (a row's bytes do not depend on its neighbours).
RECIPE_VERSION = 1
#: Libraries whose version can change features (module to import, distribution name).
_LIBRARIES = (("torch", "torch"), ("torchvision", "torchvision"), ("PIL", "pillow"),
              ("timm", "timm"), ("open_clip", "open_clip_torch"), ("transformers", "transformers"))
#: libraries whose major version is part of a recipe: torch for every encoder, plus its own
_LIBRARY_DISTRIBUTIONS = {"timm": "timm", "open_clip": "open_clip", "transformers": "transformers",
                          "torchvision": "torchvision"}


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


def library_major(module: str) -> str | None:
    """The major version (``'2'`` of ``2.5.1``; ``'0.9'`` of ``0.9.16``, a 0.x series moves its
    minor) of an importable library, else None."""
    v = library_versions().get(module)
    if v is None:
        return None
    parts = v.split("+")[0].split(".")
    return ".".join(parts[:2]) if parts[0] == "0" else parts[0]


def canonical(obj) -> dict:
    """JSON round trip: tuples become lists, odd values strings, so fields compare after I/O."""
    return json.loads(json.dumps(obj, sort_keys=True, default=str))


def fields_key(fields: dict) -> str:
    """First 16 hex digits of the SHA-256 of ``fields`` as canonical (sorted-key) JSON: the name of
    a recipe folder, a chunk, a view or an entry."""
    blob = json.dumps(canonical(fields), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def encoder_fields(encoder) -> dict:
    """The identity of a loaded encoder's vectors: its entry, weights, architecture,
    preprocessing, pooling and precision."""
    spec = encoder.spec
    return canonical({
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
    })


def recipe_fields(encoder, extra: dict | None = None, decode: str = DEFAULT_DECODE) -> dict:
    """What makes ``encoder``'s vector of one image (module docstring): :func:`encoder_fields`,
    how its JPEGs are decoded (``decode``: scaled or exact, ``extract.decode``, at the DCT scale the
    resize needs or at full size; :func:`~robustbench_fm.data.images.decode_fields`: ``exact`` adds
    no field, so an exact recipe, and the per-manifest key derived from it (:mod:`.key`), keep the
    keys of every entry made before), :data:`RECIPE_VERSION` and the major versions of torch
    and of the encoder's library. ``extra``: more fields (the device-side transform of a panel pass)."""
    own = _LIBRARY_DISTRIBUTIONS.get(str(encoder.spec.library))
    majors = {m: library_major(m) for m in ("torch", own) if m}
    return canonical({**encoder_fields(encoder), **decode_fields(decode), **(extra or {}),
                      "recipe_version": RECIPE_VERSION,
                      "library_major": {m: v for m, v in majors.items() if v is not None}})


def made_with() -> dict:
    """The package and library versions rows embedded now are made with (recorded per chunk)."""
    return canonical({"package": package_version(), "libraries": library_versions()})
