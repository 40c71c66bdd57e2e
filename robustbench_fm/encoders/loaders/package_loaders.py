"""Loaders for entries whose architecture lives in the authors' own package or hub code.

Each loader calls the authors' documented entry point (catalog.md 2.1-2.4) and pools as the
CANDOR/CRoMa papers do; its package is an optional extra checked by :func:`extras.require` before
any import. Weights: ``encoder.weights=PATH`` always wins; hub-hosted weights are looked up in the
HF cache first (offline), weights hosted elsewhere (Google Drive) must be passed as a path.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

from ..base import Encoder
from ..registry import register_loader
from ..spec import ALLOW_REMOTE_CODE, EncoderSpec
from .extras import require
from .hub import (
    WeightsUnavailableError,
    hub_call,
    hub_weights_id,
    require_cached,
    trust_remote_code,
)
from .weights import file_weights_id, load_strict, pick_checkpoint


def _repo(hub_id: str) -> str:
    return hub_id.split(":", 1)[1] if hub_id.startswith(("hf_hub:", "hf-hub:")) else hub_id


def hub_or_local(spec: EncoderSpec, weights) -> tuple[str, str]:
    """(source the package understands, weights_id): the local path, else the hub id once the
    repo is known to be reachable (cached, or online)."""
    if weights is not None:
        return str(weights), file_weights_id(weights)
    require_cached(spec, _repo(spec.hub_id))
    return spec.hub_id, hub_weights_id(spec.hub_id, _repo(spec.hub_id), spec.revision)


def local_only(spec: EncoderSpec, weights) -> Path:
    """Weights hosted outside the HF hub must be passed as ``encoder.weights``."""
    if weights is None:
        raise WeightsUnavailableError(
            f"encoder '{spec.name}': its weights are not on the Hugging Face hub; download them from "
            f"{spec.weights_url} and pass encoder.weights=<file>")
    path = Path(weights)
    return pick_checkpoint(path, ()) if path.is_dir() else path


@register_loader("conch")
def load_conch(spec: EncoderSpec, weights, device, allow_remote_code: bool = ALLOW_REMOTE_CODE) -> Encoder:
    """CONCH ViT-B/16: ``encode_image(x, proj_contrast=False, normalize=False)`` (512-d, the
    attentional-pooler output CRoMa, TRIDENT and slide2vec use)."""
    require(spec)
    from conch.open_clip_custom import create_model_from_pretrained
    source, weights_id = hub_or_local(spec, weights)
    with hub_call(spec, _repo(spec.hub_id)):
        model, _ = create_model_from_pretrained(spec.architecture, checkpoint_path=source,
                                                hf_auth_token=os.environ.get("HF_TOKEN"), device="cpu")
    return Encoder(spec, model, lambda x: model.encode_image(x, proj_contrast=False, normalize=False),
                   weights_id, device)


@register_loader("musk")
def load_musk(spec: EncoderSpec, weights, device, allow_remote_code: bool = ALLOW_REMOTE_CODE) -> Encoder:
    """MUSK (BEiT-3 ViT-L/16 at 384 px): the ``ms_aug`` multiscale image feature, 2,048-d
    (CRoMa's extraction mode; ``model(image=x, with_head=False, out_norm=False, ms_aug=True,
    return_global=True)[0]``)."""
    require(spec)
    import timm
    from musk import modeling, utils  # noqa: F401  (modeling registers the timm architecture)
    model = timm.create_model(spec.architecture)
    source, weights_id = hub_or_local(spec, weights)
    with hub_call(spec, _repo(spec.hub_id)):
        utils.load_model_and_may_interpolate(source, model, "model|module", "")

    def forward(x):
        return model(image=x, with_head=False, out_norm=False, ms_aug=True, return_global=True)[0]
    return Encoder(spec, model, forward, weights_id, device)


@register_loader("flair")
def load_flair(spec: EncoderSpec, weights, device, allow_remote_code: bool = ALLOW_REMOTE_CODE) -> Encoder:
    """FLAIR ResNet-50: the projected image embedding of ``vision_model`` (512-d); FLAIR's
    ClinicalBERT text tower is built by the package too (its HF config must be cached offline)."""
    require(spec)
    from flair import FLAIRModel
    path = local_only(spec, weights)
    with hub_call(spec, "emilyalsentzer/Bio_ClinicalBERT"):
        model = FLAIRModel(from_checkpoint=True, weights_path=str(path), vision_pretrained=False,
                           projection=True, norm_features=False, device="cpu")
    return Encoder(spec, model, model.vision_model, file_weights_id(path), device)


@register_loader("panderm")
def load_panderm(spec: EncoderSpec, weights, device, allow_remote_code: bool = ALLOW_REMOTE_CODE) -> Encoder:
    """PanDerm-Large (CAE ViT-L/16) from the repo's ``classification/models/modeling_finetune.py``:
    ``forward_features(x, is_train=False)`` (1,024-d) over the checkpoint's encoder weights."""
    require(spec)
    import models.modeling_finetune  # noqa: F401  (registers panderm_* in timm)
    import timm
    path = local_only(spec, weights)
    model = timm.create_model(spec.architecture, num_classes=0, **spec.model_kwargs)
    sd = torch.load(path, map_location="cpu", weights_only=True)
    sd = sd.get("model", sd)
    sd = {k[len("encoder."):] if k.startswith("encoder.") else k: v for k, v in sd.items()
          if not k.startswith(spec.checkpoint_drop or ("\0",))}
    load_strict(spec, model, sd, path)
    return Encoder(spec, model, lambda x: model.forward_features(x, is_train=False), file_weights_id(path), device)


@register_loader("sam_med2d")
def load_sam_med2d(spec: EncoderSpec, weights, device, allow_remote_code: bool = ALLOW_REMOTE_CODE) -> Encoder:
    """SAM-Med2D ViT-B image encoder (256 px, adapters on): the neck output [B, 256, 16, 16]
    averaged over space, 256-d (SPAR's pooled MLP-head reading, spar.md Section 3)."""
    require(spec)
    from segment_anything import sam_model_registry
    path = local_only(spec, weights)
    args = argparse.Namespace(image_size=spec.input_size, encoder_adapter=True, sam_checkpoint=str(path))
    sam = sam_model_registry[spec.architecture](args)
    encoder = sam.image_encoder
    return Encoder(spec, encoder, lambda x: encoder(x).mean(dim=(2, 3)), file_weights_id(path), device)


@register_loader("titan_conch")
def load_titan_conch(spec: EncoderSpec, weights, device, allow_remote_code: bool = ALLOW_REMOTE_CODE) -> Encoder:
    """CONCH v1.5 as TITAN ships it: ``AutoModel.from_pretrained("MahmoodLab/TITAN",
    trust_remote_code=True).return_conch()``, whose forward gives the 768-d tile embedding."""
    require(spec)
    trust = trust_remote_code(spec, allow_remote_code)
    from transformers import AutoModel
    source, weights_id = hub_or_local(spec, weights)
    with hub_call(spec, _repo(spec.hub_id)):
        titan = AutoModel.from_pretrained(source, trust_remote_code=trust, revision=spec.revision)
    conch, _ = titan.return_conch()
    return Encoder(spec, conch, conch, weights_id, device)
