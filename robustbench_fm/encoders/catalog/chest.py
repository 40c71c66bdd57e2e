"""CANDOR chest specialists (candor.md Table 2; catalog 2.1)."""
from __future__ import annotations

from ..registry import register
from ..spec import OPENAI_MEAN, OPENAI_STD, EncoderSpec

register(EncoderSpec(
    name="rad_dino", library="transformers", hub_id="microsoft/rad-dino",
    input_size=518, resize="shorter_center_crop", resize_size=518, interpolation="bicubic",
    mean=(0.5307, 0.5307, 0.5307), std=(0.2583, 0.2583, 0.2583),
    embedding="cls", embed_dim=768, params_m=86.6,
    architecture="dinov2", arch_kwargs={"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
                                        "patch_size": 14, "image_size": 518, "mlp_ratio": 4},
    licence="MSRLA", release_year=2024, objective="ssl",
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
    arch_kwargs={"embed_dim": 512, "vision_cfg": {"timm_model_name": "vit_base_patch16_224", "timm_pool": "",
                                                  "timm_proj": "linear", "image_size": 224}},
    licence="MIT", release_year=2023, objective="image-text",
    preprocessing_from="card: microsoft/BiomedCLIP-PubMedBERT_256-vit_base_patch16_224 open_clip_config.json (the "
                       "loader checks it on load)",
    description="BiomedCLIP (PMC-15M, open, MIT): ViT-B/16 image tower through open_clip; the projected "
                "image embedding encode_image (linear projection, no bias, of the CLS token) = 512. "
                "Preprocessing from its open_clip_config.json (OpenAI mean/std, 224, shortest-side "
                "bicubic resize + centre crop). Offline, only the image tower is built when the "
                "BiomedBERT text config is not cached.",
))

register(EncoderSpec(
    name="densenet121_xrv", library="torchxrayvision", hub_id="densenet121-res224-all",
    input_size=224, resize="shorter_center_crop", interpolation="bilinear", channels=1,
    mean=(0.5,), std=(1 / 2048,),
    embedding="pooled", embed_dim=1024, params_m=6.97,
    architecture="DenseNet", amp_dtype=None,
    licence="Apache-2.0", release_year=2020, objective="supervised",
    extra="xrv", requires=("torchxrayvision",),  # not a core dependency (pip install -e . lacks it)
    weights_url="https://github.com/mlmed/torchxrayvision/releases/download/v1/"
                "nih-pc-chex-mimic_ch-google-openi-kaggle-densenet121-d121-tw-lr001-rot45-tr15-sc15-seed0-best.pt",
    description="torchxrayvision DenseNet-121 'all' (NIH, PadChest, CheXpert, MIMIC, Google, Open-I, RSNA; "
                "supervised, 18 findings). One grey channel at 224 px scaled to [-1024, 1024] as "
                "xrv.datasets.normalize does ((2 x/255 - 1) * 1024 = (x - 0.5) / (1/2048) on the [0, 1] "
                "scale); xrv's centre crop + resize is the shorter-side resize + centre crop here. "
                "Features: model.features2 (ReLU + global average pool of the last dense block), 1024-d. "
                "Params 6.97M include the 18-way head the features do not use.",
))
