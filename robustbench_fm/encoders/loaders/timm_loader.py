"""timm loader: ``create_model(arch, num_classes=0, **spec.model_kwargs)``.

Local checkpoints are loaded strictly (after timm's own ``checkpoint_filter_fn`` for the
architecture and after dropping the classifier the ``num_classes=0`` model does not have), so a
checkpoint that only partly fits fails instead of silently leaving layers random. A folder with a
timm ``config.json`` (an HF snapshot such as ``MahmoodLab/uni``) takes its architecture and
``model_args`` from it. timm's pretrained cfg mean/std are *not* checked against the spec: for hub
models they are often the architecture's generic defaults rather than the model card's (see the
catalog).

``spec.architecture`` + ``spec.arch_kwargs`` build the model when no hub config is at hand (random
weights, a bare checkpoint file, ``spec.hub_file`` checkpoints such as GPFM's ``GPFM.pth``).
Layer classes in kwargs are written as names (``mlp_layer="SwiGLUPacked"``, ``act_layer="silu"``)
so that entries stay JSON (the feature-cache key) and are resolved here.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Callable

import torch

from ...core.errors import InvalidSetting
from ..base import Encoder
from ..registry import register_loader
from ..spec import ALLOW_REMOTE_CODE, EncoderSpec
from .hub import (
    hub_call,
    hub_weights_id,
    missing_offline_error,
    offline,
    require_cached,
    trust_remote_code,
)
from .pooling import pool_tokens
from .weights import file_weights_id, load_strict, pick_checkpoint, seeded


def _timm_repo(hub_id: str) -> str | None:
    """HF repo holding a timm model's weights (None when its weights live at a plain URL)."""
    for prefix in ("hf-hub:", "hf_hub:"):
        if hub_id.startswith(prefix):
            return hub_id[len(prefix):].split("@")[0]
    import timm
    cfg = timm.models.get_pretrained_cfg(hub_id, allow_unregistered=True)
    return getattr(cfg, "hf_hub_id", None) if cfg is not None else None


def _timm_forward(model, spec: EncoderSpec) -> Callable[[torch.Tensor], torch.Tensor]:
    if spec.embedding == "pooled":
        return lambda x: model.forward_head(model.forward_features(x), pre_logits=True)
    if spec.embedding == "projected":
        raise InvalidSetting(f"encoder '{spec.name}': timm models have no projected embedding; "
                             "use cls, patch_mean, cls_patch_mean or pooled")
    num_prefix = int(getattr(model, "num_prefix_tokens", 1))
    return lambda x: pool_tokens(model.forward_features(x), spec.embedding, num_prefix, spec.name)


def timm_kwargs(kwargs: dict) -> dict:
    """``kwargs`` with layer names resolved to timm classes (``mlp_layer="SwiGLUPacked"``)."""
    import timm
    out = dict(kwargs)
    for key in ("mlp_layer", "norm_layer", "block_fn"):
        if isinstance(out.get(key), str):
            out[key] = getattr(timm.layers, out[key])
    return out


def timm_architecture(spec: EncoderSpec) -> tuple[str, dict]:
    """The timm model name and kwargs that build the entry without any hub config."""
    if spec.architecture is None and spec.hub_id.startswith(("hf-hub:", "hf_hub:")):
        raise InvalidSetting(f"encoder '{spec.name}': '{spec.hub_id}' needs its timm config.json (or an "
                             "architecture in the entry); pass the downloaded folder as encoder.weights=<folder>")
    return spec.architecture or spec.hub_id, timm_kwargs({**spec.arch_kwargs, **spec.model_kwargs})


def _timm_load_checkpoint(spec: EncoderSpec, model, path: Path) -> None:
    import timm
    sd = timm.models.load_state_dict(str(path), use_ema=True, weights_only=True)
    sd = {k: v for k, v in sd.items() if not k.startswith(spec.checkpoint_drop or ("\0",))}
    filter_fn = getattr(sys.modules.get(type(model).__module__), "checkpoint_filter_fn", None)
    if filter_fn is not None:
        try:
            sd = filter_fn(sd, model)
        except TypeError:
            sd = filter_fn(sd)
    own = model.state_dict()
    classifiers = (getattr(model, "pretrained_cfg", None) or {}).get("classifier") or ()
    for name in (classifiers,) if isinstance(classifiers, str) else classifiers:
        for key in (f"{name}.weight", f"{name}.bias"):
            if key not in own:
                sd.pop(key, None)
    for key, value in own.items():  # layers the authors leave at their initial values (RETFound fc_norm)
        if key.startswith(spec.checkpoint_keep_init or ("\0",)):
            sd.setdefault(key, value)
    load_strict(spec, model, sd, path)


def _timm_arch(spec: EncoderSpec, folder: Path | None) -> tuple[str, dict]:
    """Architecture and kwargs: a folder's timm ``config.json`` wins over the entry's own."""
    cfg_path = folder / "config.json" if folder is not None else None
    if cfg_path is not None and cfg_path.is_file():
        cfg = json.loads(cfg_path.read_text())
        arch = cfg.get("architecture") or cfg.get("arch")
        if arch:
            return arch, timm_kwargs({**cfg.get("model_args", {}), **spec.model_kwargs})
    return timm_architecture(spec)


def _hub_file(spec: EncoderSpec) -> Path:
    """``spec.hub_file`` of the HF repo ``spec.hub_id`` (cache first, download when online)."""
    from huggingface_hub import hf_hub_download
    require_cached(spec, spec.hub_id)
    with hub_call(spec, spec.hub_id):
        return Path(hf_hub_download(spec.hub_id, spec.hub_file, revision=spec.revision,
                                    local_files_only=offline()))


@register_loader("timm")
def load_timm(spec: EncoderSpec, weights, device, allow_remote_code: bool = ALLOW_REMOTE_CODE) -> Encoder:
    import timm
    trust_remote_code(spec, allow_remote_code)
    if weights is not None:
        path = Path(weights)
        folder = path if path.is_dir() else path.parent
        arch, kwargs = _timm_arch(spec, folder)
        ckpt = pick_checkpoint(path, ("model.safetensors", "pytorch_model.bin")) if path.is_dir() else path
        model = timm.create_model(arch, pretrained=False, num_classes=0, **kwargs)
        _timm_load_checkpoint(spec, model, ckpt)
        weights_id = file_weights_id(path)
    elif not spec.pretrained:
        arch, kwargs = timm_architecture(spec)
        with seeded(spec.seed):
            model = timm.create_model(arch, pretrained=False, num_classes=0, **kwargs)
        weights_id = f"random:seed={spec.seed}"
    elif spec.hub_file is not None:
        ckpt = _hub_file(spec)
        arch, kwargs = timm_architecture(spec)
        model = timm.create_model(arch, pretrained=False, num_classes=0, **kwargs)
        _timm_load_checkpoint(spec, model, ckpt)
        weights_id = hub_weights_id(f"{spec.hub_id}/{spec.hub_file}", spec.hub_id, spec.revision)
    else:
        if spec.revision:
            raise InvalidSetting(f"encoder '{spec.name}': timm cannot pin hub revision '{spec.revision}'; download "
                                 "that revision and pass encoder.weights=<folder>")
        repo = _timm_repo(spec.hub_id)
        if repo is None:
            if offline():
                raise missing_offline_error(spec, None)
        else:
            require_cached(spec, repo)
        with hub_call(spec, repo):
            model = timm.create_model(spec.hub_id, pretrained=True, num_classes=0,
                                      **timm_kwargs(spec.model_kwargs))
        weights_id = hub_weights_id(spec.hub_id, repo, None)
    return Encoder(spec, model, _timm_forward(model, spec), weights_id, device)
