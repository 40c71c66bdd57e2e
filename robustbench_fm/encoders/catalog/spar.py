"""SPAR-Bench backbones (spar.md Section 3; catalog 2.4). RAD-DINO and BiomedCLIP are in chest.py."""
from __future__ import annotations

from ..registry import register
from ..spec import IMNET_MEAN, IMNET_STD, EncoderSpec
from .library import from_library

register(EncoderSpec(
    name="resnet50_in1k", library="timm", hub_id="resnet50.tv_in1k",
    **from_library("timm:resnet50.tv_in1k"), embedding="pooled", embed_dim=2048, params_m=23.51,
    licence="BSD-3-Clause", release_year=2016, objective="supervised",
    description="ResNet-50 with the torchvision ImageNet-1k weights (timm resnet50.tv_in1k): global average "
                "pool, 2048-d (SPAR's 'average-pooled features for CNN'). timm cfg: crop_pct 0.875 "
                "(resize 256, crop 224), bilinear, ImageNet mean/std.",
))

register(EncoderSpec(
    name="vit_b32_in1k", library="timm", hub_id="vit_base_patch32_224.augreg_in21k_ft_in1k",
    **from_library("timm:vit_base_patch32_224.augreg_in21k_ft_in1k"), embedding="cls", embed_dim=768, params_m=87.46,
    licence="Apache-2.0", release_year=2021, objective="supervised",
    description="ViT-B/32 (AugReg, IN-21k then IN-1k; timm's default tag): CLS after the final norm, 768-d "
                "(SPAR's 'CLS token for ViT'). timm cfg: crop_pct 0.9 (resize 248, crop 224), bicubic, "
                "mean/std 0.5.",
))

register(EncoderSpec(
    name="sam_med2d", library="sam_med2d", hub_id="gdrive:sam-med2d_b.pth",
    input_size=256, resize="squash", interpolation="bilinear", mean=IMNET_MEAN, std=IMNET_STD,
    embedding="pooled", embed_dim=256, params_m=91.0, architecture="vit_b",
    extra="sam_med2d", requires=("segment_anything",),
    weights_url="https://drive.google.com/file/d/1ARiB5RkSsWmAB_8mqWnwDF8ZKTtFwsjl",
    licence="Apache-2.0", release_year=2023, objective="supervised",
    description="SAM-Med2D ViT-B image encoder with adapters at 256 x 256 (the repo's build_sam_vit_b, "
                "image_size=256, encoder_adapter=True); the neck output [B, 256, 16, 16] averaged over space, "
                "256-d. SAM's pixel mean/std on the 0-255 scale (123.675, 116.28, 103.53)/(58.395, 57.12, "
                "57.375) are ImageNet's on the 0-1 scale. Weights on Google Drive: pass encoder.weights. "
                "params: ViT-B + adapters, approximate.",
))
