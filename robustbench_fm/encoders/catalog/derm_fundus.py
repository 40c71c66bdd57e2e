"""CANDOR fundus and dermatology encoders (candor.md Table 1; catalog 2.1), plus PanDerm."""
from __future__ import annotations

from ..registry import register
from ..spec import IMNET_MEAN, IMNET_STD, OPENAI_MEAN, OPENAI_STD, EncoderSpec

register(EncoderSpec(
    name="retfound", library="timm", hub_id="YukunZhou/RETFound_mae_natureCFP",
    hub_file="RETFound_mae_natureCFP.pth", gated=True,
    input_size=224, resize="shorter_center_crop", resize_size=256, interpolation="bicubic",
    mean=IMNET_MEAN, std=IMNET_STD,
    embedding="pooled", embed_dim=1024, params_m=303.3,
    architecture="vit_large_patch16_224", arch_kwargs={"img_size": 224, "global_pool": "avg"},
    checkpoint_drop=("decoder", "mask_token", "norm."), checkpoint_keep_init=("fc_norm.",),
    licence="CC-BY-NC-4.0", release_year=2023, objective="ssl",
    preprocessing_from="paper: RETFound's eval transform (resize 256, centre crop 224, ImageNet mean/std; "
                       "catalog 2.1); a bare checkpoint timm publishes no config for",
    description="RETFound (MAE ViT-L/16 on colour fundus photographs): the pretrained encoder checkpoint "
                "loaded into timm ViT-L/16 with global_pool='avg', i.e. the mean of the patch tokens "
                "through fc_norm (1024-d) as the authors' models_vit with global_pool=True does. The "
                "MAE decoder, mask token and final norm of the checkpoint are dropped and fc_norm keeps "
                "its initial values (weight 1, bias 0), exactly as their fine-tuning code leaves it. "
                "Eval transform: resize 256, centre crop 224, ImageNet mean/std. The HF repo is gated "
                "(auto-approved).",
))

register(EncoderSpec(
    name="flair", library="flair", hub_id="gdrive:flair_resnet.pth",
    input_size=512, resize="longest_pad", interpolation="bilinear", mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0),
    embedding="projected", embed_dim=512, params_m=24.5,
    extra="flair", requires=("flair",),
    weights_url="https://drive.google.com/file/d/1l24_2IzwQdnaa034I0zcyDLs_zMujsbR",
    licence="Apache-2.0", release_year=2023, objective="image-text",
    description="FLAIR (fundus image-text, ResNet-50 vision tower) via the FLAIR package: the projected "
                "image embedding of vision_model (512-d, CANDOR's rule for image-text models). Input: the "
                "longer side scaled to 512 and zero-padded right/bottom to a 512 x 512 canvas, intensities "
                "/255, no mean/std. Weights come from Google Drive (no HF id): pass encoder.weights.",
))

register(EncoderSpec(
    name="monet", library="transformers", hub_id="suinleelab/monet",
    input_size=224, resize="shorter_center_crop", interpolation="bicubic", mean=OPENAI_MEAN, std=OPENAI_STD,
    embedding="projected", embed_dim=768, params_m=303.97,
    architecture="clip", arch_kwargs={
        "projection_dim": 768,
        "vision_config": {"hidden_size": 1024, "intermediate_size": 4096, "num_attention_heads": 16,
                          "num_hidden_layers": 24, "patch_size": 14, "image_size": 224},
        "text_config": {"hidden_size": 768, "intermediate_size": 3072, "num_attention_heads": 12,
                        "num_hidden_layers": 12}},
    licence="MIT", release_year=2024, objective="image-text",
    description="MONET (dermatology CLIP ViT-L/14) via transformers CLIPModel; get_image_features = the "
                "projected image embedding, 768-d. CLIPImageProcessor at 224; its card says the mean was "
                "updated, so the loader checks the entry against the downloaded preprocessor_config.json "
                "and refuses a mismatch.",
))

register(EncoderSpec(
    name="dermlip", library="open_clip", hub_id="hf-hub:redlessone/DermLIP_ViT-B-16",
    input_size=224, resize="shorter_center_crop", interpolation="bicubic", mean=OPENAI_MEAN, std=OPENAI_STD,
    embedding="projected", embed_dim=512, params_m=86.19, architecture="ViT-B-16",
    licence="CC-BY-NC-ND-4.0", release_year=2025, objective="image-text",
    preprocessing_from="card: redlessone/DermLIP_ViT-B-16 open_clip_config.json (the loader checks it on load)",
    description="DermLIP ViT-B/16 (dermatology CLIP) through open_clip; encode_image 512-d. The loader checks "
                "mean/std/size against the repo's open_clip_config.json.",
))

register(EncoderSpec(
    name="panderm", library="panderm", hub_id="gdrive:panderm_ll_data6_checkpoint-499.pth",
    input_size=224, resize="shorter_center_crop", interpolation="bicubic", mean=IMNET_MEAN, std=IMNET_STD,
    embedding="native", embed_dim=1024, params_m=304.0, architecture="panderm_large_patch16_224",
    checkpoint_drop=("decoder", "teacher", "regressor", "mask_token", "head."),
    extra="panderm", requires=("models.modeling_finetune",),
    weights_url="https://drive.google.com/file/d/1XHKRk2p-dS1PFQE-xRbOM3yx47i3bXmi",
    licence="CC-BY-NC-ND-4.0 (unverified)", release_year=2024, objective="ssl",
    description="PanDerm-Large (CAE ViT-L/16, self-supervised on 2M dermatology images) from the authors' "
                "repo (classification/models/modeling_finetune.py registers panderm_large_patch16_224 in "
                "timm); forward_features, 1024-d. Weights on Google Drive: pass encoder.weights.",
))
