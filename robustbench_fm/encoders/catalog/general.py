"""CANDOR general-purpose and untrained encoders (candor.md Table 2; catalog 2.1)."""
from __future__ import annotations

from ..registry import register
from ..spec import (
    IMNET_MEAN,
    IMNET_STD,
    EncoderSpec,
)
from .library import from_library

#: random weights follow no pretrained recipe: timm's default tag (AugReg: mean/std 0.5, crop_pct 0.9) belongs
#: to weights these entries do not load, so they keep the ImageNet statistics and a plain 224 px crop they were
#: first cached with (changing them would re-key every cached feature of the demos and tests)
_UNTRAINED = {
    "mean": (IMNET_MEAN, "random weights: no pretrained recipe applies; ImageNet mean kept (see _UNTRAINED)"),
    "std": (IMNET_STD, "random weights: no pretrained recipe applies; ImageNet std kept (see _UNTRAINED)"),
    "resize_size": (None, "random weights: resize 224 + crop 224, not AugReg's crop_pct 0.9 (see _UNTRAINED)"),
}

_DINOV3 = {  # facebook/dinov3-vit*16-pretrain-lvd1689m config.json fields (4 registers, RoPE)
    "s": dict(hidden_size=384, intermediate_size=1536, num_attention_heads=6, num_hidden_layers=12),
    "b": dict(hidden_size=768, intermediate_size=3072, num_attention_heads=12, num_hidden_layers=12),
    "l": dict(hidden_size=1024, intermediate_size=4096, num_attention_heads=16, num_hidden_layers=24),
    "hplus": dict(hidden_size=1280, intermediate_size=5120, num_attention_heads=20, num_hidden_layers=32,
                  use_gated_mlp=True, hidden_act="silu"),
}
_DINOV3_IDS = {"s": "vits16", "b": "vitb16", "l": "vitl16", "hplus": "vith16plus"}
_DINOV3_PARAMS = {"s": 21.6, "b": 85.66, "l": 303.13, "hplus": 840.59}
_DINOV3_DIMS = {"s": 384, "b": 768, "l": 1024, "hplus": 1280}

for size in _DINOV3:
    register(EncoderSpec(
        name=f"dinov3_{size}", library="transformers",
        hub_id=f"facebook/dinov3-{_DINOV3_IDS[size]}-pretrain-lvd1689m", gated=True,
        input_size=224, resize="squash", interpolation="bilinear", mean=IMNET_MEAN, std=IMNET_STD,
        embedding="cls", embed_dim=_DINOV3_DIMS[size], params_m=_DINOV3_PARAMS[size],
        architecture="dinov3_vit", arch_kwargs={**_DINOV3[size], "patch_size": 16, "num_register_tokens": 4},
        licence="DINOv3 Licence", release_year=2025, objective="ssl",
        description=f"DINOv3 ViT-{size.upper().replace('PLUS', '+')}/16 (LVD-1689M) via transformers AutoModel; "
                    "CLS after the final norm (= pooler_output). Its image processor (DINOv3ViTImageProcessor) "
                    "resizes to 224 x 224, bilinear, ImageNet mean/std: CANDOR feeds every encoder through its "
                    "own processor (candor.md, Experiments).",
    ))

register(EncoderSpec(
    name="dinov2_l", library="timm", hub_id="vit_large_patch14_dinov2.lvd142m",
    **from_library("timm:vit_large_patch14_dinov2.lvd142m"),
    embedding="cls", embed_dim=1024, params_m=304.4,
    licence="Apache-2.0", release_year=2023, objective="ssl",
    description="DINOv2 ViT-L/14 (LVD-142M, open) through timm at its native 518 px "
                "(timm pretrained cfg: bicubic, crop_pct 1.0, ImageNet mean/std); CLS after the final "
                "norm. 224 px also works with dynamic_img_size=True (pos-embed interpolation) at ~6x "
                "less compute, but is a different entry.",
))

register(EncoderSpec(
    name="clip_l14", library="open_clip", hub_id="hf-hub:timm/vit_large_patch14_clip_224.openai",
    **from_library("open_clip:ViT-L-14-quickgelu/openai"),
    embedding="projected", embed_dim=768, params_m=303.97, architecture="ViT-L-14-quickgelu",
    licence="MIT", release_year=2021, objective="image-text",
    description="OpenAI CLIP ViT-L/14 through open_clip (its 'openai' weights live in this HF repo); "
                "encode_image, the projected image embedding, 768-d. 224 bicubic shortest-side resize + "
                "centre crop, OpenAI mean/std; QuickGELU as the OpenAI weights need.",
))

register(EncoderSpec(
    name="siglip2_l_512", library="open_clip", hub_id="hf-hub:timm/ViT-L-16-SigLIP2-512",
    **from_library("open_clip:ViT-L-16-SigLIP2-512/webli"),
    embedding="projected", embed_dim=1024, params_m=316.72, architecture="ViT-L-16-SigLIP2-512",
    licence="Apache-2.0", release_year=2025, objective="image-text",
    description="SigLIP 2 ViT-L/16 at 512 px (WebLI) through open_clip; encode_image = the MAP-head pooled "
                "image embedding (no extra projection), 1024-d. open_clip's pretrained cfg: squash resize "
                "to 512, bicubic, mean/std 0.5 (the catalog's 'HALF'; open_clip's arch-only default would "
                "print OpenAI mean/std).",
))

register(EncoderSpec(
    name="random_vit_s", library="timm", hub_id="vit_small_patch16_224",
    pretrained=False, seed=0,
    **from_library("timm:vit_small_patch16_224", **_UNTRAINED),
    embedding="cls", embed_dim=384, params_m=21.7, objective="none", licence="none",
    description="ViT-S/16 with random weights (timm init, seed 0): a cheap untrained-geometry "
                "baseline and the encoder the CPU tests and demos run.",
))

register(EncoderSpec(
    name="random_vit_l", library="timm", hub_id="vit_large_patch16_224",
    pretrained=False, seed=0,
    **from_library("timm:vit_large_patch16_224", **_UNTRAINED),
    embedding="cls", embed_dim=1024, params_m=303.3, objective="none", licence="none",
    description="ViT-L/16 with random weights (timm init, seed 0): the CANDOR panel's 'random ViT-L' "
                "control (catalog 2.1).",
))
