"""torchxrayvision loader: ``xrv.models.DenseNet`` and its pooled penultimate layer.

The features are ``model.features2(x)``: ReLU and global average pooling of the last dense block,
1,024-d for DenseNet-121 (candor.md, Experiments: "for DenseNet-121, we use the pooled penultimate
layer"). The input is one channel scaled to [-1024, 1024] (``xrv.datasets.normalize``), which the
entry expresses as mean 0.5 / std 1/2048 on the [0, 1] scale.

Weights: ``hub_id`` names an ``xrv.models.model_urls`` key (e.g. ``densenet121-res224-all``);
torchxrayvision downloads the release file from GitHub into ``xrv.utils.get_cache_dir()``. Offline,
that file must already be there, or ``encoder.weights`` points at it (the release file, or a folder
holding it), or at a plain ``state_dict`` of the same architecture.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

from ...core.errors import InvalidSetting, MissingInput
from ..base import Encoder
from ..registry import register_loader
from ..spec import ALLOW_REMOTE_CODE, EncoderSpec
from .extras import require
from .hub import WeightsUnavailableError, offline
from .weights import file_weights_id, load_strict, seeded


def release_file(spec: EncoderSpec) -> str:
    """File name of the torchxrayvision release the entry's ``hub_id`` downloads."""
    import torchxrayvision as xrv
    if spec.hub_id not in xrv.models.model_urls:
        raise InvalidSetting(f"encoder '{spec.name}': '{spec.hub_id}' is not a torchxrayvision weights name; "
                             f"choose one of {sorted(k for k in xrv.models.model_urls if k.startswith('densenet'))}")
    return os.path.basename(xrv.models.model_urls[spec.hub_id]["weights_url"])


def cached_release(spec: EncoderSpec) -> Path | None:
    """The release file in torchxrayvision's own cache folder, when downloaded before."""
    import torchxrayvision as xrv
    path = Path(xrv.utils.get_cache_dir()).expanduser() / release_file(spec)
    return path if path.is_file() else None


def _architecture(spec: EncoderSpec):
    import torchxrayvision as xrv
    return getattr(xrv.models, spec.architecture or "DenseNet")(weights=None, **spec.arch_kwargs)


def _from_local(spec: EncoderSpec, path: Path):
    """A release file (or a folder holding it) through torchxrayvision, else a strict state_dict."""
    import torchxrayvision as xrv
    release = release_file(spec)
    folder = path if path.is_dir() else path.parent
    if (folder / release).is_file() and (path.is_dir() or path.name == release):
        return xrv.models.DenseNet(weights=spec.hub_id, cache_dir=str(folder)), folder / release
    if path.is_dir():
        raise MissingInput(f"encoder '{spec.name}': folder '{path}' does not hold '{release}'; "
                           "pass the release file or a state_dict file as encoder.weights")
    model = _architecture(spec)
    sd = torch.load(path, map_location="cpu", weights_only=True)
    sd = sd.get("state_dict", sd) if isinstance(sd, dict) else sd
    sd = {k: v for k, v in sd.items() if k != "op_threshs"}  # thresholds of the head, not features
    load_strict(spec, model, sd, path)
    return model, path


@register_loader("torchxrayvision")
def load_xrv(spec: EncoderSpec, weights, device, allow_remote_code: bool = ALLOW_REMOTE_CODE) -> Encoder:
    require(spec)  # torchxrayvision is the extra 'xrv': one line naming it instead of an ImportError
    import torchxrayvision as xrv
    if weights is not None:
        model, used = _from_local(spec, Path(weights))
        weights_id = file_weights_id(used)
    elif not spec.pretrained:
        with seeded(spec.seed):
            model = _architecture(spec)
        weights_id = f"random:seed={spec.seed}"
    else:
        cached = cached_release(spec)
        if cached is None and offline():
            raise WeightsUnavailableError(
                f"encoder '{spec.name}': torchxrayvision weights '{spec.hub_id}' ({release_file(spec)}) are "
                f"not in {xrv.utils.get_cache_dir()} and HF_HUB_OFFLINE is set; download "
                f"{xrv.models.model_urls[spec.hub_id]['weights_url']} and pass encoder.weights=<file>")
        try:
            model = xrv.models.DenseNet(weights=spec.hub_id)
        except (OSError, ConnectionError) as err:
            raise WeightsUnavailableError(f"encoder '{spec.name}': could not download torchxrayvision weights "
                                          f"'{spec.hub_id}': {err}; pass encoder.weights=<file>") from err
        weights_id = file_weights_id(cached_release(spec))
    return Encoder(spec, model, model.features2, weights_id, device)
