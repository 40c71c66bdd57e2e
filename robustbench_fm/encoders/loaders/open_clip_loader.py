"""open_clip loader: the projected image embedding ``model.encode_image(x)``.

Weights come from a folder holding ``open_clip_config.json`` (a hub snapshot, or
``encoder.weights=<folder>``), whose ``preprocess_cfg`` gives the transform; it must agree with
the spec. When the text tower names a Hugging Face model whose config is not available offline
(BiomedCLIP's BiomedBERT), only the image tower is built and loaded (``visual.*`` keys,
strictly): ``encode_image`` is exactly that tower, and the text tower is never needed for image
features.
"""
from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path

from ...core.errors import InvalidSetting, MissingInput
from ..base import Encoder
from ..registry import register_loader
from ..spec import ALLOW_REMOTE_CODE, EncoderSpec
from .hub import (
    hub_call,
    hub_errors,
    hub_weights_id,
    missing_offline_error,
    offline,
    require_cached,
    trust_remote_code,
)
from .preprocessing import raise_preprocess_mismatch, values_close
from .weights import file_weights_id, load_strict, pick_checkpoint, seeded

log = logging.getLogger(__name__)

_OPEN_CLIP_CKPTS = ("open_clip_model.safetensors", "open_clip_pytorch_model.safetensors",
                    "open_clip_pytorch_model.bin", "open_clip_pytorch_model.pth",
                    "model.safetensors", "pytorch_model.bin", "pytorch_model.pth", "model.pth")
_OC_RESIZE = {"shortest": "shorter_center_crop", "squash": "squash"}


def _open_clip_preprocess(config: dict, model_cfg: dict) -> dict:
    from dataclasses import asdict

    from open_clip.factory import merge_preprocess_dict
    from open_clip.transform import PreprocessCfg
    pp = merge_preprocess_dict(asdict(PreprocessCfg()), config.get("preprocess_cfg", {}))
    size = model_cfg.get("vision_cfg", {}).get("image_size")
    if size is not None:
        pp["size"] = size
    return pp


def _check_open_clip_preprocess(spec: EncoderSpec, pp: dict, source: str) -> None:
    diffs = []
    if not values_close(pp["mean"], spec.mean):
        diffs.append(f"mean {list(pp['mean'])} vs {list(spec.mean)}")
    if not values_close(pp["std"], spec.std):
        diffs.append(f"std {list(pp['std'])} vs {list(spec.std)}")
    size = pp["size"]
    sizes = {int(size)} if isinstance(size, (int, float)) else {int(s) for s in size}
    if sizes != {spec.input_size}:
        diffs.append(f"size {size} vs {spec.input_size}")
    if _OC_RESIZE.get(pp.get("resize_mode")) != spec.resize or (spec.resize_size or spec.input_size) != spec.input_size:
        diffs.append(f"resize_mode '{pp.get('resize_mode')}' (no separate resize size) vs "
                     f"'{spec.resize}' resize_size={spec.resize_size}")
    if pp.get("interpolation") != spec.interpolation:
        diffs.append(f"interpolation '{pp.get('interpolation')}' vs '{spec.interpolation}'")
    raise_preprocess_mismatch(spec, source, diffs)


@contextlib.contextmanager
def _quiet_random_init_warning():
    """open_clip warns 'initialized randomly' when built without weights; we load them next."""
    class _Drop(logging.Filter):
        def filter(self, record):
            return "initialized randomly" not in record.getMessage()
    root, flt = logging.getLogger(), _Drop()
    root.addFilter(flt)
    try:
        yield
    finally:
        root.removeFilter(flt)


def _text_tower_available(text_cfg: dict) -> bool:
    """Can open_clip build the text tower here (its HF config is local, cached, or downloadable)?"""
    name = text_cfg.get("hf_model_name")
    if not name or Path(name).is_dir():
        return True
    if not offline():
        return True
    from huggingface_hub import try_to_load_from_cache
    return isinstance(try_to_load_from_cache(name, "config.json"), str)


def _open_clip_from_folder(spec: EncoderSpec, folder: Path, ckpt: Path):
    """(model, image module, preprocess cfg) from a folder holding ``open_clip_config.json``."""
    import open_clip
    from open_clip.model import _build_vision_tower
    config = json.loads((folder / "open_clip_config.json").read_text())
    model_cfg = config.get("model_cfg", config)
    pp = _open_clip_preprocess(config, model_cfg)
    _check_open_clip_preprocess(spec, pp, f"'{folder / 'open_clip_config.json'}'")
    if _text_tower_available(model_cfg.get("text_cfg", {})):
        with _quiet_random_init_warning():  # the checkpoint is loaded right below
            model = open_clip.create_model(f"local-dir:{folder}", load_weights=False, pretrained_image=False,
                                           pretrained_text=False, **spec.model_kwargs)
        open_clip.load_checkpoint(model, str(ckpt), strict=True, weights_only=True)
        return model, model.encode_image, pp
    # The text tower's HF config is unavailable offline: build and load the image tower only.
    vision_cfg = dict(model_cfg["vision_cfg"], timm_model_pretrained=False)
    visual = _build_vision_tower(model_cfg["embed_dim"], vision_cfg,
                                 quick_gelu=model_cfg.get("quick_gelu", False), cast_dtype=None)
    sd = open_clip.factory.load_state_dict(str(ckpt), device="cpu", weights_only=True)
    sd = {k[len("visual."):]: v for k, v in sd.items() if k.startswith("visual.")}
    load_strict(spec, visual, sd, ckpt)
    log.info("encoder '%s': text tower '%s' not available offline; loaded the image tower only",
             spec.name, model_cfg.get("text_cfg", {}).get("hf_model_name"))
    return visual, visual, pp


def _open_clip_hub_folder(spec: EncoderSpec) -> tuple[Path, Path, str]:
    """Config + weights of an ``hf-hub:`` open_clip entry (cache first, download when online)."""
    from huggingface_hub import hf_hub_download
    repo = spec.hub_id.split(":", 1)[1]
    require_cached(spec, repo)
    local = offline()
    with hub_call(spec, repo):
        cfg = Path(hf_hub_download(repo, "open_clip_config.json", revision=spec.revision, local_files_only=local))
        ckpt = None
        for name in ("open_clip_model.safetensors", "open_clip_pytorch_model.bin"):
            try:
                ckpt = Path(hf_hub_download(repo, name, revision=spec.revision, local_files_only=local))
                break
            except hub_errors() as err:  # try the next file name; re-raised below if none exists
                last = err
        if ckpt is None:
            raise last
    return cfg.parent, ckpt, repo


def open_clip_image_tower(spec: EncoderSpec):
    """The entry's image tower alone (``encode_image`` without the text side), built offline from
    ``spec.architecture`` (an open_clip model config name) or ``spec.arch_kwargs`` (a model_cfg)."""
    import open_clip
    from open_clip.model import _build_vision_tower
    model_cfg = open_clip.get_model_config(spec.architecture) if spec.architecture else spec.arch_kwargs
    if not model_cfg or "vision_cfg" not in model_cfg:
        raise InvalidSetting(f"encoder '{spec.name}': no open_clip architecture '{spec.architecture}' or model_cfg "
                             "in the entry; set architecture to an open_clip model name")
    vision_cfg = dict(model_cfg["vision_cfg"], timm_model_pretrained=False)
    return _build_vision_tower(model_cfg["embed_dim"], vision_cfg,
                               quick_gelu=model_cfg.get("quick_gelu", False), cast_dtype=None)


def _open_clip_tagged(spec: EncoderSpec):
    """(model, image function, weights id) of an open_clip model name with a pretrained tag: the
    tag's hub repo from the local cache when offline (one line naming it when absent)."""
    import open_clip
    cfg = open_clip.get_pretrained_cfg(spec.hub_id, spec.pretrained_tag) or {}
    repo = (cfg.get("hf_hub") or "").strip("/") or None
    if repo is not None:
        require_cached(spec, repo)
    elif offline():
        raise missing_offline_error(spec, None)
    with hub_call(spec, repo):
        model = open_clip.create_model(spec.hub_id, pretrained=spec.pretrained_tag, **spec.model_kwargs)
    return model, model.encode_image, hub_weights_id(f"{spec.hub_id}:{spec.pretrained_tag}", repo, None)


@register_loader("open_clip")
def load_open_clip(spec: EncoderSpec, weights, device, allow_remote_code: bool = ALLOW_REMOTE_CODE) -> Encoder:
    import open_clip
    from open_clip.transform import PreprocessCfg, image_transform_v2
    trust_remote_code(spec, allow_remote_code)
    pp = None
    if weights is not None:
        path = Path(weights)
        folder = path if path.is_dir() else path.parent
        if (folder / "open_clip_config.json").is_file():
            ckpt = pick_checkpoint(path, _OPEN_CLIP_CKPTS) if path.is_dir() else path
            model, image_fn, pp = _open_clip_from_folder(spec, folder, ckpt)
        elif path.is_file() and (spec.architecture or ":" not in spec.hub_id):
            model = open_clip.create_model(spec.architecture or spec.hub_id, pretrained=str(path),
                                           pretrained_image=False,
                                           pretrained_text=False, **spec.model_kwargs)
            image_fn = model.encode_image
        else:
            raise MissingInput(f"encoder '{spec.name}': weights '{path}' need an open_clip_config.json "
                               "beside them; pass the downloaded hub folder as encoder.weights=<folder>")
        weights_id = file_weights_id(path)
    elif not spec.pretrained:
        with seeded(spec.seed):
            model = open_clip_image_tower(spec)
        image_fn = model
        weights_id = f"random:seed={spec.seed}"
    elif spec.pretrained_tag is not None:  # a generic entry: an open_clip model name and its pretrained tag
        model, image_fn, weights_id = _open_clip_tagged(spec)
    else:
        if not spec.hub_id.startswith("hf-hub:"):
            raise InvalidSetting(f"encoder '{spec.name}': open_clip hub entries use 'hf-hub:<repo>' ids, "
                                 f"got '{spec.hub_id}'")
        folder, ckpt, repo = _open_clip_hub_folder(spec)
        with hub_call(spec, repo):
            model, image_fn, pp = _open_clip_from_folder(spec, folder, ckpt)
        weights_id = hub_weights_id(spec.hub_id, repo, spec.revision)
    transform = image_transform_v2(PreprocessCfg(**pp), is_train=False) if pp is not None else None
    return Encoder(spec, model, lambda x: image_fn(x), weights_id, device, transform)
