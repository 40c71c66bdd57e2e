"""Registry entries for the hub encoders and the random-weight baselines.

Sources: ``shared/reference/catalog.md`` Part 2 (sections 2.1, 2.4 and 2.5). Each entry binds the
weights to the preprocessing and pooling their authors use; parameter counts are image-tower
counts from instantiating the architecture (timm 1.0.31 / open_clip 3.3.0 / transformers 5.24).
Nothing here touches the network: hub ids are resolved only by ``robustbench_fm.encoders.load``.
"""
from __future__ import annotations

from .registry import register
from .spec import IMNET_MEAN, IMNET_STD, OPENAI_MEAN, OPENAI_STD, EncoderSpec

# ---- random-weight baselines (no download ever; weights drawn from the seed) -------------------

register(EncoderSpec(
    name="random_vit_s", library="timm", hub_id="vit_small_patch16_224",
    pretrained=False, seed=0,
    input_size=224, mean=IMNET_MEAN, std=IMNET_STD, interpolation="bicubic",
    embedding="cls", embed_dim=384, params_m=21.7,
    description="ViT-S/16 with random weights (timm init, seed 0): a cheap untrained-geometry "
                "baseline and the encoder the CPU tests and demos run.",
))

register(EncoderSpec(
    name="random_vit_l", library="timm", hub_id="vit_large_patch16_224",
    pretrained=False, seed=0,
    input_size=224, mean=IMNET_MEAN, std=IMNET_STD, interpolation="bicubic",
    embedding="cls", embed_dim=1024, params_m=303.3,
    description="ViT-L/16 with random weights (timm init, seed 0): the CANDOR panel's 'random ViT-L' "
                "control (catalog 2.1).",
))

# ---- CANDOR / SPAR panel (catalog 2.1, 2.4) ---------------------------------------------------

register(EncoderSpec(
    name="dinov2_l", library="timm", hub_id="vit_large_patch14_dinov2.lvd142m",
    input_size=518, resize="shorter_center_crop", resize_size=518, interpolation="bicubic",
    mean=IMNET_MEAN, std=IMNET_STD,
    embedding="cls", embed_dim=1024, params_m=304.4,
    description="DINOv2 ViT-L/14 (LVD-142M, open) through timm at its native 518 px "
                "(timm pretrained cfg: bicubic, crop_pct 1.0, ImageNet mean/std); CLS after the final "
                "norm. 224 px also works with dynamic_img_size=True (pos-embed interpolation) at ~6x "
                "less compute, but is a different entry.",
))

register(EncoderSpec(
    name="rad_dino", library="transformers", hub_id="microsoft/rad-dino",
    input_size=518, resize="shorter_center_crop", resize_size=518, interpolation="bicubic",
    mean=(0.5307, 0.5307, 0.5307), std=(0.2583, 0.2583, 0.2583),
    embedding="cls", embed_dim=768, params_m=86.6,
    description="RAD-DINO (Microsoft, chest X-ray DINOv2 ViT-B/14, open) via transformers AutoModel; "
                "CLS = last_hidden_state[:, 0] = pooler_output. Preprocessing as its "
                "preprocessor_config.json (BitImageProcessor: shortest edge 518, centre crop 518, "
                "bicubic); mean/std 0.5307/0.2583 are single-channel stats replicated x3 and are "
                "marked unverified in the catalog: the loader checks them against the downloaded "
                "preprocessor_config.json and refuses a mismatch.",
))

register(EncoderSpec(
    name="biomedclip", library="open_clip",
    hub_id="hf-hub:microsoft/BiomedCLIP-PubMedBERT_256-vit_base_patch16_224",
    input_size=224, resize="shorter_center_crop", interpolation="bicubic",
    mean=OPENAI_MEAN, std=OPENAI_STD,
    embedding="projected", embed_dim=512, params_m=86.2,
    description="BiomedCLIP (PMC-15M, open, MIT): ViT-B/16 image tower through open_clip; the projected "
                "image embedding encode_image (linear projection, no bias, of the CLS token) = 512. "
                "Preprocessing from its open_clip_config.json (OpenAI mean/std, 224, shortest-side "
                "bicubic resize + centre crop). Offline, only the image tower is built when the "
                "BiomedBERT text config is not cached.",
))
