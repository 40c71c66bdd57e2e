"""Generic encoder entries: a model id instead of a registry entry.

``encoder=timm encoder.model=<timm name or hf-hub id>``, ``encoder=hf encoder.model=<repo or folder>``
(transformers ``AutoModel`` + its image processor) and ``encoder=open_clip encoder.model=<hf-hub id,
folder or model name> [encoder.pretrained=<tag>]`` build an :class:`~.spec.EncoderSpec` from what the
library that owns the model says about it, so nobody types a mean, a std or an embedding size:

* **timm**: ``timm.data.resolve_model_data_config`` of the model built on the meta device (its
  ``pretrained_cfg``: input size, interpolation, mean, std, ``crop_pct``; the resize before the
  centre crop is ``floor(size / crop_pct)``, as timm's own eval transform);
* **hf**: the folder's or repo's ``preprocessor_config.json`` (``AutoImageProcessor``): mean, std,
  resample, the resize and the centre crop;
* **open_clip**: the model config's image size and the pretrained tag's (or the folder's
  ``open_clip_config.json``) ``preprocess_cfg``.

The embedding size comes from one forward pass of the meta-device model (no memory, no weights),
so it always matches the chosen pooling. ``encoder.weights`` is ``random`` (the architecture with
weights drawn from seed 0, no download: how the tests run offline), a local checkpoint file or
folder, or unset (the hub's weights, read from the local cache when ``HF_HUB_OFFLINE=1``).
``encoder.embedding`` is ``cls``, ``patch_mean`` or ``pooled`` (the library's own pooling; for
open_clip the projected image embedding ``encode_image`` returns, its only choice).

A resolved entry is named ``<kind>-<model>`` (``timm-vit_tiny_patch16_224``), is registered for this
process (:data:`.registry.RESOLVED`, found by ``encoders.get``) and is keyed in the feature cache
like any registry entry: its name, library, model id, architecture, preprocessing, pooling and
weights id all enter the key, so two generic entries, or a generic entry and a registry entry,
never share cached features. Generic entries never run remote code (``trust_remote_code`` is off).
"""
from __future__ import annotations

import functools
import json
import math
import re
from pathlib import Path

from ..core.errors import InvalidSetting, MissingInput, UnknownName
from .registry import RESOLVED
from .spec import ALLOW_REMOTE_CODE, EncoderSpec

#: ``encoder=<kind>`` -> the library whose loader builds it
GENERIC = {"timm": "timm", "hf": "transformers", "open_clip": "open_clip"}
#: the pooling choices of ``encoder.embedding`` (docs of each kind above)
EMBEDDINGS = ("cls", "patch_mean", "pooled")
RANDOM = "random"
SEED = 0  # the seed of ``encoder.weights=random``
MODEL_HINT = {"timm": "<timm name or hf-hub id>", "hf": "<hub repo or local folder>",
               "open_clip": "<hf-hub id, folder or open_clip model name>"}
#: transformers config fields that name the file rather than the architecture
_HF_DROP = ("model_type", "transformers_version", "architectures", "_name_or_path", "torch_dtype", "dtype")
_RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}
_OC_RESIZE = {"shortest": "shorter_center_crop", "squash": "squash", "longest": "longest_pad"}


def is_generic(name: str) -> bool:
    return name in GENERIC


def derived_name(kind: str, model: str, pretrained: str | None = None) -> str:
    """``<kind>-<model>`` with the model's folder name for a path and ``-<tag>`` for an open_clip tag;
    characters other than letters, digits and ``._-`` become ``_`` (a folder name in the cache)."""
    text = str(model)
    for prefix in ("hf-hub:", "hf_hub:"):
        text = text[len(prefix):] if text.startswith(prefix) else text
    if Path(text).is_dir():
        text = Path(text).resolve().name
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "model"
    return f"{kind}-{slug}" + (f"-{re.sub(r'[^A-Za-z0-9._-]+', '_', pretrained)}" if pretrained else "")


def _weights(kind: str, weights) -> tuple[bool, Path | None]:
    """(random, local path) of ``encoder.weights``; a path that does not exist is one line."""
    if weights is None or str(weights) == "":
        return False, None
    if str(weights) == RANDOM:
        return True, None
    path = Path(str(weights)).expanduser()
    if not path.exists():
        raise MissingInput(f"encoder={kind}: encoder.weights '{weights}' not found; pass a local checkpoint "
                           "file or folder, or encoder.weights=random")
    return False, path


def _embedding(kind: str, embedding, default: str) -> str:
    choice = str(embedding) if embedding else default
    if choice not in EMBEDDINGS:
        raise InvalidSetting(f"encoder={kind}: encoder.embedding={choice} is not one of {', '.join(EMBEDDINGS)}")
    return choice


def _meta_dim(forward, channels: int, size: int, label: str) -> int:
    """The embedding size of ``forward`` on one meta-device image (no memory, no weights)."""
    import torch  # lazy: the registry and the CLI's listing import no torch

    with torch.no_grad():
        out = forward(torch.empty(1, channels, size, size, device="meta"))
    if out.ndim != 2:
        raise InvalidSetting(f"{label}: the pooled output has shape {tuple(out.shape)}, not [B, D]; "
                             "choose another encoder.embedding")
    return int(out.shape[1])


def _params_m(model) -> float:
    return round(sum(p.numel() for p in model.parameters()) / 1e6, 2)


def _hub_json(repo: str, filename: str, label: str) -> dict:
    """A JSON file of a hub repo, from the local cache offline (one line when it is not there)."""
    from huggingface_hub import hf_hub_download

    from .loaders.hub import hub_errors, offline  # lazy: the loaders import torch
    try:
        return json.loads(Path(hf_hub_download(repo, filename, local_files_only=offline())).read_text())
    except hub_errors() as err:
        raise MissingInput(f"{label}: cannot read {filename} of '{repo}' ({type(err).__name__}); download the "
                           "repo and pass its folder as encoder.weights=<folder>") from err


# ------------------------------------------------------------------------------------------ timm

def timm_preprocessing(dc: dict) -> dict:
    """Spec fields from a timm data config (``resolve_data_config``): input size, channels, mean, std,
    interpolation, and the resize before the centre crop, ``floor(size / crop_pct)`` as timm's own eval
    transform (``crop_mode="squash"``: both sides to the size)."""
    channels, size = int(dc["input_size"][0]), int(dc["input_size"][1])
    squash = dc.get("crop_mode") == "squash"
    return {"input_size": size, "channels": channels, "mean": tuple(dc["mean"]), "std": tuple(dc["std"]),
            "interpolation": str(dc.get("interpolation") or "bicubic"),
            "resize": "squash" if squash else "shorter_center_crop",
            "resize_size": None if squash else int(math.floor(size / float(dc.get("crop_pct") or 1.0)))}


def _timm(model: str, random: bool, path: Path | None, embedding, name: str) -> EncoderSpec:
    import timm  # lazy: the model library is imported only when a generic entry is resolved
    import torch  # lazy: as above

    from .loaders.timm_loader import _timm_forward, timm_kwargs  # lazy: the loaders import torch
    hub_id = model
    if "/" in model and not model.startswith(("hf-hub:", "hf_hub:")):
        hub_id = f"hf-hub:{model}"  # an HF repo id names a timm hub model
    folder = (path if path.is_dir() else path.parent) if path is not None else None
    cfg = None
    if folder is not None and (folder / "config.json").is_file():
        cfg = json.loads((folder / "config.json").read_text())
    elif hub_id.startswith(("hf-hub:", "hf_hub:")):
        cfg = _hub_json(hub_id.split(":", 1)[1], "config.json", f"encoder=timm encoder.model={model}")
    arch, kwargs, overlay = model, {}, None
    if cfg is not None:
        arch = cfg.get("architecture") or cfg.get("arch") or model
        kwargs, overlay = dict(cfg.get("model_args") or {}), cfg.get("pretrained_cfg")
    label = f"encoder=timm encoder.model={model}"
    try:
        with torch.device("meta"):
            net = timm.create_model(arch, pretrained=False, num_classes=0, pretrained_cfg_overlay=overlay,
                                    **timm_kwargs(kwargs))
    except RuntimeError as err:
        if "Unknown model" not in str(err):
            raise
        raise UnknownName(f"{label}: timm knows no model '{arch}'; see timm.list_models() or pass an "
                          "hf-hub id") from None
    pre = timm_preprocessing(timm.data.resolve_model_data_config(net))
    spec = EncoderSpec(
        name=name, library="timm", hub_id=hub_id, **pre,
        embedding=_embedding("timm", embedding, "pooled"), embed_dim=1, params_m=_params_m(net),
        pretrained=not random, seed=SEED if random else None, architecture=arch if arch != hub_id else None,
        arch_kwargs=kwargs, objective="none" if random else "unknown", description=f"generic timm entry: {model}")
    try:
        dim = _meta_dim(_timm_forward(net, spec), spec.channels, spec.input_size, label)
    except (RuntimeError, ValueError) as err:
        raise InvalidSetting(f"{label}: encoder.embedding={spec.embedding} does not fit this model "
                             f"({' '.join(str(err).split())[:160]}); use pooled") from None
    return spec.replace(embed_dim=dim)


# ------------------------------------------------------------------------------------ transformers

def _hf_preprocessing(pp: dict, label: str) -> dict:
    """Spec fields from an image processor's settings (``preprocessor_config.json``)."""
    if pp.get("image_mean") is None or pp.get("image_std") is None:
        raise InvalidSetting(f"{label}: the image processor names no image_mean/image_std; add them to "
                             "preprocessor_config.json")

    def value(d, *keys):
        if isinstance(d, (int, float)):
            return int(d)
        for k in keys:
            if isinstance(d, dict) and d.get(k) is not None:
                return int(d[k])
        return None

    size = pp.get("size")
    mean, std = list(pp["image_mean"]), list(pp["image_std"])
    out = {"interpolation": _RESAMPLE.get(pp.get("resample"), "bicubic")}
    if pp.get("do_center_crop", "crop_size" in pp) and pp.get("crop_size") is not None:
        crop = value(pp["crop_size"], "height", "width", "shortest_edge")
        out.update(input_size=crop, resize="shorter_center_crop",
                   resize_size=value(size, "shortest_edge", "height") or crop)
    elif isinstance(size, dict) and size.get("height") is not None:
        out.update(input_size=int(size["height"]), resize="squash", resize_size=None)
    else:
        edge = value(size, "shortest_edge", "height", "width")
        if edge is None:
            raise InvalidSetting(f"{label}: the image processor names no size; add size to preprocessor_config.json")
        out.update(input_size=edge, resize="shorter_center_crop", resize_size=None)
    return {**out, "mean": tuple(mean), "std": tuple(std)}


def _hf(model: str, random: bool, path: Path | None, embedding, name: str) -> tuple[EncoderSpec, Path | None]:
    import torch  # lazy: the registry and the CLI's listing import no torch
    from transformers import AutoConfig, AutoImageProcessor, AutoModel  # lazy: the model library

    from .loaders.hub import hub_call, offline  # lazy: the loaders import torch
    from .loaders.transformers_loader import _transformers_forward  # lazy: the loaders import torch
    label = f"encoder=hf encoder.model={model}"
    local = Path(model).expanduser().is_dir()
    if path is None and local and not random:
        path = Path(model).expanduser()  # a saved model folder is its own weights
    folder = (path if path.is_dir() else path.parent) if path is not None else None
    source = str(folder if folder is not None else (Path(model).expanduser() if local else model))
    probe = EncoderSpec(name=name, library="transformers", hub_id=model, input_size=1, mean=(0,), std=(1,),
                        embedding="cls", embed_dim=1, params_m=0)
    if not local and folder is None and offline():
        from .loaders.hub import require_cached  # lazy: the loaders import torch
        require_cached(probe, model)
    with hub_call(probe, None if local else model):
        config = AutoConfig.from_pretrained(source, local_files_only=local or folder is not None or offline())
        try:
            processor = AutoImageProcessor.from_pretrained(source, local_files_only=local or folder is not None
                                                           or offline())
        except (OSError, ValueError) as err:
            raise MissingInput(f"{label}: no image processor (preprocessor_config.json) in '{source}'; save "
                               "one beside the model (processor.save_pretrained(folder))") from err
    vision = getattr(config, "vision_config", None) or config
    channels = int(getattr(vision, "num_channels", 3) or 3)
    default = "cls" if getattr(vision, "patch_size", None) and getattr(vision, "hidden_size", None) else "pooled"
    pre = _hf_preprocessing(processor.to_dict(), label)
    arch_kwargs = {k: v for k, v in config.to_diff_dict().items() if k not in _HF_DROP}
    spec = EncoderSpec(
        name=name, library="transformers", hub_id=str(Path(model).expanduser().resolve()) if local else model,
        embedding=_embedding("hf", embedding, default), embed_dim=1, params_m=0, channels=channels,
        pretrained=not random, seed=SEED if random else None, architecture=config.model_type,
        arch_kwargs=json.loads(json.dumps(arch_kwargs, default=str)),
        objective="none" if random else "unknown", description=f"generic transformers entry: {model}", **pre)
    with torch.device("meta"):
        net = AutoModel.from_config(config)
    try:
        dim = _meta_dim(_transformers_forward(net, spec), channels, spec.input_size, label)
    except (RuntimeError, ValueError, TypeError) as err:
        raise InvalidSetting(f"{label}: encoder.embedding={spec.embedding} does not fit {type(net).__name__} "
                             f"({' '.join(str(err).split())[:160]}); choose cls, patch_mean or pooled") from None
    return spec.replace(embed_dim=dim, params_m=_params_m(net)), path


# --------------------------------------------------------------------------------------- open_clip

def _open_clip_named_config(model_cfg: dict, pretrained_cfg: dict) -> dict:
    """An ``open_clip_config.json``-shaped dict of an open_clip model name and its tag's pretrained cfg."""
    return {"model_cfg": model_cfg, "preprocess_cfg": {k: v for k, v in pretrained_cfg.items() if k in (
        "mean", "std", "interpolation", "resize_mode")}}


def open_clip_preprocessing(config: dict) -> dict:
    """Spec fields from an ``open_clip_config.json``-shaped dict: the model config's image size and the
    ``preprocess_cfg`` merged over open_clip's defaults, as open_clip's own eval transform reads them."""
    from .loaders.open_clip_loader import _open_clip_preprocess  # lazy: the loaders import torch
    pp = _open_clip_preprocess(config, config.get("model_cfg", config))
    size = pp["size"]
    return {"input_size": int(size if isinstance(size, (int, float)) else size[0]), "channels": 3,
            "mean": tuple(pp["mean"]), "std": tuple(pp["std"]),
            "interpolation": str(pp.get("interpolation") or "bicubic"),
            "resize": _OC_RESIZE.get(pp.get("resize_mode"), "shorter_center_crop"), "resize_size": None}


def _open_clip(model: str, pretrained: str | None, random: bool, path: Path | None, embedding,
               name: str) -> tuple[EncoderSpec, Path | None]:
    import open_clip  # lazy: the model library is imported only when a generic entry is resolved
    import torch  # lazy: as above

    from .loaders.open_clip_loader import open_clip_image_tower  # lazy: the loaders import torch
    label = f"encoder=open_clip encoder.model={model}"
    choice = _embedding("open_clip", embedding, "pooled")
    if choice != "pooled":
        raise InvalidSetting(f"{label}: open_clip entries give the projected image embedding "
                             f"(encoder.embedding=pooled); {choice} is for encoder=timm or encoder=hf")
    local = Path(model).expanduser().is_dir()
    if path is None and local and not random:
        path = Path(model).expanduser()
    folder = (path if path.is_dir() else path.parent) if path is not None else None
    architecture, tag = None, None
    if folder is not None and (folder / "open_clip_config.json").is_file():
        config = json.loads((folder / "open_clip_config.json").read_text())
    elif local:
        raise MissingInput(f"{label}: '{model}' holds no open_clip_config.json; save the model's config there")
    elif model.startswith(("hf-hub:", "hf_hub:")):
        config = _hub_json(model.split(":", 1)[1], "open_clip_config.json", label)
    else:
        model_cfg = open_clip.get_model_config(model)
        if model_cfg is None:
            raise UnknownName(f"{label}: open_clip knows no model '{model}'; see open_clip.list_models() or pass an "
                              "hf-hub id")
        architecture, tag = model, pretrained
        pcfg = open_clip.get_pretrained_cfg(model, tag) if tag else {}
        if tag and not pcfg:
            raise UnknownName(f"{label}: open_clip has no pretrained tag '{tag}' for '{model}'; one of "
                              f"{', '.join(open_clip.list_pretrained_tags_by_model(model)) or 'none'}")
        if not random and not tag and path is None:
            raise InvalidSetting(f"{label}: name the weights: encoder.pretrained=<tag> (one of "
                                 f"{', '.join(open_clip.list_pretrained_tags_by_model(model)[:5])}), "
                                 "encoder.weights=<file> or encoder.weights=random")
        config = _open_clip_named_config(model_cfg, pcfg)
    model_cfg = config.get("model_cfg", config)
    spec = EncoderSpec(
        name=name, library="open_clip", hub_id=str(Path(model).expanduser().resolve()) if local else model,
        **open_clip_preprocessing(config), embedding="projected",
        embed_dim=int(model_cfg["embed_dim"]), params_m=0, pretrained=not random, seed=SEED if random else None,
        architecture=architecture, arch_kwargs={} if architecture else json.loads(json.dumps(model_cfg)),
        pretrained_tag=tag, objective="none" if random else "unknown",
        description=f"generic open_clip entry: {model}" + (f" ({tag})" if tag else ""))
    with torch.device("meta"):
        tower = open_clip_image_tower(spec)
    return spec.replace(params_m=_params_m(tower)), path


# ------------------------------------------------------------------------- a library's published config

def library_preprocessing(source: str) -> dict:
    """The spec's preprocessing fields as the owning library publishes them for a pretrained model,
    offline (nothing is downloaded or built): ``timm:<name>.<tag>`` reads ``timm.get_pretrained_cfg``
    through ``timm.data.resolve_data_config``; ``open_clip:<model>/<tag>`` reads
    ``open_clip.get_model_config`` and ``open_clip.get_pretrained_cfg``. The catalog's entries are
    checked against it (``encoders/catalog/library.py``)."""
    kind, _, name = source.partition(":")
    if kind == "timm":
        import timm  # lazy: the model library (and torch) only when a config is read

        cfg = timm.get_pretrained_cfg(name)
        if cfg is None:
            raise UnknownName(f"'{source}': timm publishes no pretrained config '{name}'; see timm.list_pretrained()")
        return timm_preprocessing(timm.data.resolve_data_config(pretrained_cfg=cfg.to_dict()))
    if kind == "open_clip":
        import open_clip  # lazy: as above

        model, _, tag = name.partition("/")
        model_cfg, pcfg = open_clip.get_model_config(model), open_clip.get_pretrained_cfg(model, tag)
        if model_cfg is None or not pcfg:
            raise UnknownName(f"'{source}': open_clip publishes no pretrained config '{tag}' of '{model}'; see "
                              "open_clip.list_pretrained()")
        return open_clip_preprocessing(_open_clip_named_config(model_cfg, pcfg))
    raise UnknownName(f"'{source}' names no library config; write timm:<name>.<tag> or open_clip:<model>/<tag>")


# ----------------------------------------------------------------------------------------- entry

@functools.lru_cache(maxsize=64)
def _resolve(kind: str, model: str, pretrained: str | None, weights: str | None,
             embedding: str | None) -> tuple[EncoderSpec, str | None]:
    random, path = _weights(kind, weights)
    name = derived_name(kind, model, pretrained if kind == "open_clip" else None)
    if kind == "timm":
        if pretrained:
            raise InvalidSetting("encoder=timm: encoder.pretrained is for open_clip tags; name a timm tag in the "
                                 "model (encoder.model=vit_small_patch16_224.augreg_in21k)")
        spec = _timm(model, random, path, embedding, name)
    elif kind == "hf":
        spec, path = _hf(model, random, path, embedding, name)
    else:
        spec, path = _open_clip(model, pretrained, random, path, embedding, name)
    return spec, (str(path) if path is not None else None)


def resolve(kind: str, model: str | None, pretrained: str | None = None, weights=None,
            embedding: str | None = None) -> tuple[EncoderSpec, str | None]:
    """The spec of generic entry ``kind`` for ``model`` and the local weights its loader takes
    (None: random or hub weights); the spec is registered for this process under its derived name.

    ``weights``: ``"random"``, a checkpoint file or folder, or None (the hub's, or the model
    folder itself). One-line errors name the option to fix."""
    if kind not in GENERIC:
        raise UnknownName(f"'{kind}' is no generic encoder; one of {', '.join(GENERIC)}")
    if not model:
        raise InvalidSetting(f"encoder={kind} needs encoder.model={MODEL_HINT[kind]}")
    spec, path = _resolve(kind, str(model), str(pretrained) if pretrained else None,
                          str(weights) if weights is not None else None, str(embedding) if embedding else None)
    RESOLVED[spec.name] = spec
    return spec, path


def load(kind: str, model: str, pretrained: str | None = None, weights=None, embedding: str | None = None,
         device="auto", allow_remote_code: bool = ALLOW_REMOTE_CODE):
    """The generic entry loaded (``robustbench_fm.encoders.load`` of its resolved spec)."""
    from . import load as load_spec  # the package's load: checks, device, the library's loader

    spec, path = resolve(kind, model, pretrained, weights, embedding)
    return load_spec(spec, weights=path, device=device, allow_remote_code=allow_remote_code)
