"""transformers loader: ``AutoModel.from_pretrained`` in float32.

``last_hidden_state[:, 0]`` for cls, the mean of the tokens after the CLS and
``num_register_tokens`` registers for patch_mean, ``pooler_output`` for pooled and
``get_image_features`` for projected and the model's own output for native (remote code).
``spec.model_kwargs`` goes to ``from_pretrained``; for
random entries ``model_kwargs["config"]`` (a dict with ``model_type``) builds the config offline,
other keys override config attributes; without it, ``spec.architecture`` (a model_type) and
``spec.arch_kwargs`` build the config. A local ``preprocessor_config.json`` (folder or cache)
must agree with the spec's mean/std/size.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path
from typing import Callable

import torch

from ...core.errors import InvalidSetting, MissingInput
from ..base import Encoder
from ..registry import register_loader
from ..spec import ALLOW_REMOTE_CODE, EncoderSpec
from .hub import (
    hub_call,
    hub_errors,
    hub_failure_error,
    hub_weights_id,
    offline,
    require_cached,
    trust_remote_code,
)
from .pooling import UnfitEmbedding, pool_tokens
from .preprocessing import raise_preprocess_mismatch, values_close
from .weights import CheckpointMismatch, file_weights_id, seeded

log = logging.getLogger(__name__)

_RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}


def _size_value(d, *keys):
    if isinstance(d, (int, float)):
        return int(d)
    if isinstance(d, dict):
        for k in keys:
            if d.get(k) is not None:
                return int(d[k])
    return None


def check_preprocessor_config(spec: EncoderSpec, path: Path) -> None:
    """Raise when a transformers ``preprocessor_config.json`` disagrees with the spec."""
    cfg = json.loads(Path(path).read_text())
    diffs = []
    if cfg.get("image_mean") is not None and not values_close(cfg["image_mean"], spec.mean):
        diffs.append(f"mean {cfg['image_mean']} vs {list(spec.mean)}")
    if cfg.get("image_std") is not None and not values_close(cfg["image_std"], spec.std):
        diffs.append(f"std {cfg['image_std']} vs {list(spec.std)}")
    size = cfg.get("size")
    if cfg.get("do_center_crop", "crop_size" in cfg) and cfg.get("crop_size") is not None:
        crop = _size_value(cfg["crop_size"], "height", "width", "shortest_edge")
        if crop is not None and crop != spec.input_size:
            diffs.append(f"crop size {crop} vs input_size {spec.input_size}")
        resize = _size_value(size, "shortest_edge", "height")
        if resize is not None and resize != (spec.resize_size or spec.input_size):
            diffs.append(f"resize (shortest edge) {resize} vs {spec.resize_size or spec.input_size}")
    elif size is not None and cfg.get("do_resize", True):
        resize = _size_value(size, "height", "shortest_edge", "width")
        if resize is not None and resize != spec.input_size:
            diffs.append(f"size {resize} vs input_size {spec.input_size}")
    raise_preprocess_mismatch(spec, f"'{path}'", diffs)
    resample = _RESAMPLE.get(cfg.get("resample"))
    if resample and resample != spec.interpolation:
        log.warning("encoder '%s': %s uses %s resampling, the entry %s", spec.name, path, resample,
                    spec.interpolation)


def _transformers_forward(model, spec: EncoderSpec) -> Callable[[torch.Tensor], torch.Tensor]:
    config = getattr(model, "config", None)
    vision = getattr(config, "vision_config", None) or config
    num_prefix = 1 + int(getattr(vision, "num_register_tokens", 0) or 0)

    if spec.embedding == "projected":
        if not hasattr(model, "get_image_features"):
            raise InvalidSetting(f"encoder '{spec.name}': {type(model).__name__} has no get_image_features; "
                                 "use cls, patch_mean, cls_patch_mean or pooled")

        def projected(x):
            out = model.get_image_features(pixel_values=x)
            return out if torch.is_tensor(out) else out.pooler_output
        return projected

    if spec.embedding == "native":  # remote-code models whose forward already returns [B, D]
        def native(x):
            out = model(x)
            if not torch.is_tensor(out):
                raise UnfitEmbedding(f"encoder '{spec.name}': {type(model).__name__} returned {type(out).__name__}, "
                                     "not a feature tensor; use cls, patch_mean, cls_patch_mean or pooled")
            return out
        return native

    def forward(x):
        out = model(pixel_values=x)
        if spec.embedding == "pooled":
            if getattr(out, "pooler_output", None) is None:
                raise UnfitEmbedding(f"encoder '{spec.name}': {type(model).__name__} returns no pooler_output")
            return out.pooler_output.flatten(1)
        return pool_tokens(out.last_hidden_state, spec.embedding, num_prefix, spec.name)
    return forward


def _transformers_config(spec: EncoderSpec, source, trust: bool, local: bool):
    from transformers import AutoConfig
    kwargs = dict(spec.model_kwargs)
    cfg = kwargs.pop("config", None)
    if cfg is not None:
        cfg = dict(cfg)
        config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    else:
        config = AutoConfig.from_pretrained(source, trust_remote_code=trust, local_files_only=local,
                                            **({"revision": spec.revision} if spec.revision else {}))
    for k, v in kwargs.items():
        setattr(config, k, v)
    return config


def transformers_architecture(spec: EncoderSpec):
    """The entry's config built offline from ``spec.architecture`` (a ``model_type``) and
    ``spec.arch_kwargs`` (the fields of the hub repo's config.json that differ from the defaults)."""
    from transformers import AutoConfig
    return AutoConfig.for_model(spec.architecture, **spec.arch_kwargs)


def _hub_preprocessor_config(spec: EncoderSpec) -> Path | None:
    """The hub repo's ``preprocessor_config.json`` (cache, or a small download when online)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError
    try:
        return Path(hf_hub_download(spec.hub_id, "preprocessor_config.json", revision=spec.revision,
                                    local_files_only=offline()))
    except hub_errors() as err:
        # none in the cache (offline) or in the repo (a 404): nothing to check; a network failure is fatal
        if offline() or (isinstance(err, EntryNotFoundError) and not isinstance(err, LocalEntryNotFoundError)):
            return None
        raise hub_failure_error(spec, spec.hub_id, err) from err


@contextlib.contextmanager
def _single_file_folder(path: Path):
    """A folder as ``from_pretrained`` wants it: the folder itself, or for one checkpoint file a
    temporary folder linking the file (under its standard name) beside its ``config.json``."""
    if path.is_dir():
        yield str(path)
        return
    import tempfile
    std = "model.safetensors" if path.suffix == ".safetensors" else "pytorch_model.bin"
    with tempfile.TemporaryDirectory(prefix="rbfm_weights_") as tmp:
        os.symlink(path.resolve(), os.path.join(tmp, std))
        os.symlink((path.parent / "config.json").resolve(), os.path.join(tmp, "config.json"))
        yield tmp


def _transformers_pretrained(spec: EncoderSpec, source: str, trust: bool, label=None, **kwargs):
    """``AutoModel.from_pretrained`` in float32 that refuses a checkpoint leaving weights random."""
    from transformers import AutoModel
    model, info = AutoModel.from_pretrained(source, trust_remote_code=trust, dtype=torch.float32,
                                            output_loading_info=True, **kwargs)
    missing = [k for k in info.get("missing_keys", ())
               if not (spec.embedding != "pooled" and k.startswith("pooler."))]
    mismatched = list(info.get("mismatched_keys", ()))
    if missing or mismatched:
        raise CheckpointMismatch(
            f"encoder '{spec.name}': checkpoint '{label or source}' does not fit {type(model).__name__}: "
            f"{len(missing)} missing keys (e.g. {sorted(missing)[:3]}), "
            f"{len(mismatched)} shape mismatches (e.g. {mismatched[:2]}); point encoder.weights at a checkpoint "
            "of that model")
    if info.get("unexpected_keys"):
        log.warning("encoder '%s': %d unused checkpoint keys (e.g. %s)", spec.name,
                    len(info["unexpected_keys"]), sorted(info["unexpected_keys"])[:3])
    return model


@register_loader("transformers")
def load_transformers(spec: EncoderSpec, weights, device, allow_remote_code: bool = ALLOW_REMOTE_CODE) -> Encoder:
    from transformers import AutoModel
    trust = trust_remote_code(spec, allow_remote_code)
    kwargs = {k: v for k, v in spec.model_kwargs.items() if k != "config"}
    if weights is not None:
        path = Path(weights)
        folder = path if path.is_dir() else path.parent
        if not (folder / "config.json").is_file():
            raise MissingInput(f"encoder '{spec.name}': weights '{path}' need the model's config.json "
                               "beside them; pass the downloaded hub folder as encoder.weights=<folder>")
        if (folder / "preprocessor_config.json").is_file():
            check_preprocessor_config(spec, folder / "preprocessor_config.json")
        with _single_file_folder(path) as source:
            model = _transformers_pretrained(spec, source, trust, label=path, local_files_only=True, **kwargs)
        weights_id = file_weights_id(path)
    elif not spec.pretrained:
        if spec.architecture is not None and "config" not in spec.model_kwargs:
            config = transformers_architecture(spec)
        elif "config" not in spec.model_kwargs:
            require_cached(spec, spec.hub_id)
            with hub_call(spec, spec.hub_id):
                config = _transformers_config(spec, spec.hub_id, trust, offline())
        else:
            config = _transformers_config(spec, None, trust, True)
        with seeded(spec.seed):
            model = AutoModel.from_config(config, trust_remote_code=trust)
        model = model.float()
        weights_id = f"random:seed={spec.seed}"
    else:
        require_cached(spec, spec.hub_id)
        pp = _hub_preprocessor_config(spec)
        if pp is not None:
            check_preprocessor_config(spec, pp)
        with hub_call(spec, spec.hub_id):
            model = _transformers_pretrained(spec, spec.hub_id, trust, local_files_only=offline(),
                                             revision=spec.revision or "main", **kwargs)
        weights_id = hub_weights_id(spec.hub_id, spec.hub_id, spec.revision)
    return Encoder(spec, model, _transformers_forward(model, spec), weights_id, device)
