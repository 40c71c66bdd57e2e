"""Pathology tile encoders: the CRoMa panel of 20 (croma.md Table 2; catalog 2.2, croma_conventions
E), of which 7 are also CANDOR's histopathology encoders (candor.md Table 1).

Embeddings follow CRoMa's extraction modes: ``cls`` (CLS token), ``cls_patch_mean`` (CRoMa's
``cls+patch`` / ``virchow``: concat(CLS, mean of patch tokens, registers excluded)), ``projected``
(CONCH's ``raw`` 512-d) and ``native`` (MUSK ``ms_aug``, GenBio's per-channel CLS). Tiles are
224 px with ImageNet mean/std and a shorter-side resize + centre crop unless said otherwise.
"""
from __future__ import annotations

from ..registry import register
from ..spec import (
    HALF_MEAN,
    HALF_STD,
    IMNET_MEAN,
    IMNET_STD,
    OPENAI_MEAN,
    OPENAI_STD,
    EncoderSpec,
)
from .library import from_library

HOPT_MEAN, HOPT_STD = (0.707223, 0.578729, 0.703617), (0.211883, 0.230117, 0.177517)
HIBOU_MEAN, HIBOU_STD = (0.7068, 0.5755, 0.722), (0.195, 0.2316, 0.1816)
SWIGLU = {"mlp_layer": "SwiGLUPacked", "act_layer": "silu"}  # passed on every build (not in hub configs)


def _tile(name: str, **kw) -> EncoderSpec:
    base = dict(input_size=224, mean=IMNET_MEAN, std=IMNET_STD, interpolation="bicubic",
                resize="shorter_center_crop", objective="ssl")
    return register(EncoderSpec(name=name, **{**base, **kw}))


_tile("phikon", library="transformers", hub_id="owkin/phikon", interpolation="bilinear", resize="squash",
      embedding="cls", embed_dim=768, params_m=85.8, architecture="vit",
      licence="Owkin non-commercial", release_year=2023,
      description="Phikon (Owkin, iBOT ViT-B/16 on TCGA) via transformers ViTModel; CLS "
                  "last_hidden_state[:, 0] (the pooler is not used: its weights are absent from the "
                  "checkpoint). ViTImageProcessor: squash to 224, bilinear, ImageNet mean/std.")

_tile("phikon_v2", library="transformers", hub_id="owkin/phikon-v2",
      embedding="cls", embed_dim=1024, params_m=303.35, architecture="dinov2",
      arch_kwargs={"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16, "patch_size": 16,
                   "image_size": 224},
      licence="Owkin non-commercial", release_year=2024,
      description="Phikon-v2 (Owkin, DINOv2 ViT-L/16, PanCancer-XL) via transformers AutoModel; CLS 1024 "
                  "(croma's 'cls'; PathoROB's 2048-d CLS+mean is a different entry).")

_tile("uni", library="timm", hub_id="hf-hub:MahmoodLab/uni", gated=True,
      embedding="cls", embed_dim=1024, params_m=303.35,
      architecture="vit_large_patch16_224", arch_kwargs={"img_size": 224, "init_values": 1e-5},
      model_kwargs={"dynamic_img_size": True},
      licence="CC-BY-NC-ND-4.0", release_year=2024,
      preprocessing_from="card: MahmoodLab/uni (224, resize + centre crop, ImageNet mean/std; catalog 2.1: timm's "
                         "vit_large_patch16_224 default shows 0.5 and crop_pct 0.9, which are not UNI's)",
      description="UNI (MahmoodLab, DINOv2 ViT-L/16, Mass-100K) through timm hf-hub; CLS after the final norm.")

_tile("uni2_h", library="timm", hub_id="hf-hub:MahmoodLab/UNI2-h", gated=True,
      embedding="cls", embed_dim=1536, params_m=681.39,
      architecture="vit_giant_patch14_224",
      arch_kwargs={"img_size": 224, "patch_size": 14, "depth": 24, "num_heads": 24, "init_values": 1e-5,
                   "embed_dim": 1536, "mlp_ratio": 2.66667 * 2, "no_embed_class": True, "reg_tokens": 8},
      model_kwargs={**SWIGLU, "dynamic_img_size": True},
      licence="CC-BY-NC-ND-4.0", release_year=2025,
      preprocessing_from="card: MahmoodLab/UNI2-h (224, ImageNet mean/std; catalog 2.1)",
      description="UNI2-h (MahmoodLab, ViT-H/14 with 8 registers, SwiGLU) through timm hf-hub with the "
                  "card's kwargs; CLS 1536 (croma's 'cls').")

_tile("virchow", library="timm", hub_id="hf-hub:paige-ai/Virchow", gated=True,
      embedding="cls_patch_mean", embed_dim=2560, params_m=631.23,
      architecture="vit_huge_patch14_224", arch_kwargs={"img_size": 224, "init_values": 1e-5, "mlp_ratio": 5.3375},
      model_kwargs=dict(SWIGLU),
      licence="Apache-2.0 (gated terms)", release_year=2024,
      preprocessing_from="card: paige-ai/Virchow (224 bicubic, ImageNet mean/std; catalog 2.1)",
      description="Virchow (Paige, DINOv2 ViT-H/14) through timm hf-hub; concat(CLS, mean of the 256 patch "
                  "tokens) = 2560 as its model card and CRoMa use.")

_tile("virchow2", library="timm", hub_id="hf-hub:paige-ai/Virchow2", gated=True,
      embedding="cls_patch_mean", embed_dim=2560, params_m=631.23,
      architecture="vit_huge_patch14_224",
      arch_kwargs={"img_size": 224, "init_values": 1e-5, "mlp_ratio": 5.3375, "reg_tokens": 4},
      model_kwargs=dict(SWIGLU),
      licence="CC-BY-NC-ND-4.0", release_year=2024,
      preprocessing_from="card: paige-ai/Virchow2 (224, ImageNet mean/std; catalog 2.1)",
      description="Virchow2 (Paige, ViT-H/14 + 4 registers) through timm hf-hub; concat(CLS, mean of the patch "
                  "tokens after the 4 registers) = 2560.")

_tile("prov_gigapath", library="timm", hub_id="hf_hub:prov-gigapath/prov-gigapath", gated=True,
      resize_size=256, embedding="cls", embed_dim=1536, params_m=1134.95,
      architecture="vit_giant_patch14_dinov2",
      arch_kwargs={"img_size": 224, "patch_size": 16, "embed_dim": 1536, "depth": 40, "num_heads": 24,
                   "init_values": 1e-5, "mlp_ratio": 5.33334},
      licence="Apache-2.0 (gated terms)", release_year=2024,
      preprocessing_from="card: prov-gigapath/prov-gigapath (resize 256 bicubic, centre crop 224, ImageNet mean/std; "
                         "catalog 2.1)",
      description="Prov-GigaPath tile encoder (DINOv2 ViT-g with 16 px patches) through timm hf_hub; resize 256 "
                  "bicubic, centre crop 224; CLS 1536.")

_tile("conch", library="conch", hub_id="hf_hub:MahmoodLab/conch", gated=True,
      input_size=448, mean=OPENAI_MEAN, std=OPENAI_STD,
      embedding="projected", embed_dim=512, params_m=86.0, architecture="conch_ViT-B-16",
      extra="conch", requires=("conch",), licence="CC-BY-NC-ND-4.0", release_year=2024, objective="image-text",
      description="CONCH (MahmoodLab, ViT-B/16 vision-language) via the conch package; "
                  "encode_image(proj_contrast=False, normalize=False) = 512 (croma's 'raw'). 448 px, OpenAI "
                  "mean/std. params: the paper's 86M.")

_tile("conch_v1_5", library="titan_conch", hub_id="MahmoodLab/TITAN", gated=True, trust_remote_code=True,
      input_size=448, interpolation="bilinear",
      embedding="native", embed_dim=768, params_m=307.0,
      extra="titan", requires=("einops", "einops_exts"),
      licence="CC-BY-NC-ND-4.0", release_year=2024, objective="image-text",
      description="CONCH v1.5 (ViT-L/16 trunk + attentional pooler) as TITAN's remote code returns it "
                  "(return_conch()); 768-d. 448 px bilinear + centre crop, ImageNet mean/std (TRIDENT). "
                  "params: the paper's 307M.")

_tile("h_optimus_0", library="timm", hub_id="hf-hub:bioptimus/H-optimus-0", gated=True,
      mean=HOPT_MEAN, std=HOPT_STD, embedding="cls", embed_dim=1536, params_m=1134.77,
      architecture="vit_giant_patch14_reg4_dinov2", arch_kwargs={"img_size": 224, "init_values": 1e-5},
      model_kwargs={"dynamic_img_size": False},
      licence="Apache-2.0", release_year=2024,
      preprocessing_from="card: bioptimus/H-optimus-0 (224, its own mean/std; catalog 2.2)",
      description="H-optimus-0 (Bioptimus, ViT-g/14 + 4 registers) through timm hf-hub; CLS 1536; its own "
                  "mean/std. Gated as TRIDENT's error text says (the catalog marks this unverified).")

_tile("h_optimus_1", library="timm", hub_id="hf-hub:bioptimus/H-optimus-1", gated=True,
      mean=HOPT_MEAN, std=HOPT_STD, embedding="cls", embed_dim=1536, params_m=1134.77,
      architecture="vit_giant_patch14_reg4_dinov2", arch_kwargs={"img_size": 224, "init_values": 1e-5},
      model_kwargs={"dynamic_img_size": False},
      licence="Bioptimus non-commercial (unverified)", release_year=2025,
      preprocessing_from="card: bioptimus/H-optimus-1 (224, its own mean/std; catalog 2.2)",
      description="H-optimus-1 (Bioptimus, ViT-g/14 + 4 registers) through timm hf-hub; CLS 1536.")

_tile("h0_mini", library="timm", hub_id="hf-hub:bioptimus/H0-mini", gated=True,
      mean=HOPT_MEAN, std=HOPT_STD, embedding="cls_patch_mean", embed_dim=1536, params_m=85.78,
      architecture="vit_base_patch14_reg4_dinov2",
      arch_kwargs={"img_size": 224, "init_values": 1e-5, "mlp_ratio": 5.3334},
      model_kwargs=dict(SWIGLU),
      licence="CC-BY-NC-ND-4.0 (unverified)", release_year=2025,
      preprocessing_from="card: bioptimus/H0-mini (224, H-optimus mean/std; catalog 2.2)",
      description="H0-mini (Bioptimus, ViT-B/14 + 4 registers, SwiGLU, distilled from H-optimus-0) through "
                  "timm hf-hub; concat(CLS, mean of patch tokens after the registers) = 1536 (croma's "
                  "'virchow' mode). The offline architecture uses mlp_ratio 5.3334, which gives the paper's "
                  "86M (SwiGLU at ratio 4 gives 72M); the hub config.json overrides it when present.")

_tile("midnight_12k", library="transformers", hub_id="kaiko-ai/midnight", mean=HALF_MEAN, std=HALF_STD,
      embedding="cls_patch_mean", embed_dim=3072, params_m=1134.77, architecture="dinov2",
      arch_kwargs={"hidden_size": 1536, "num_hidden_layers": 40, "num_attention_heads": 24, "patch_size": 14,
                   "image_size": 224, "use_swiglu_ffn": True},
      licence="MIT", release_year=2025,
      description="Midnight-12k (kaiko.ai, DINOv2 ViT-g/14 on 12k TCGA slides) via transformers; concat(CLS, "
                  "mean patch) = 3072 (croma's 'cls+patch'); 224 resize + crop, mean/std 0.5.")

_tile("prost40m", library="timm", hub_id="hf-hub:waticlems/Prost40M",
      embedding="cls", embed_dim=384, params_m=21.62,
      architecture="vit_small_patch16_224", arch_kwargs={"img_size": 224}, model_kwargs={"patch_size": 14},
      licence="unknown", release_year=2025,
      preprocessing_from="card: waticlems/Prost40M (224, ImageNet mean/std, unverified in catalog 2.2)",
      description="Prost40M (DINO ViT-S/14 on prostate) through timm hf-hub with patch_size=14; CLS 384. "
                  "Mean/std: ImageNet (the catalog leaves the norm unverified).")

_tile("hibou_b", library="transformers", hub_id="histai/hibou-b", trust_remote_code=True,
      mean=HIBOU_MEAN, std=HIBOU_STD, embedding="cls", embed_dim=768, params_m=86.0,
      licence="Apache-2.0", release_year=2024,
      description="Hibou-B (HistAI, DINOv2 ViT-B/14 + registers) via transformers remote code; "
                  "last_hidden_state[:, 0] (croma's 'cls'). params: the paper's 86M.")

_tile("hibou_l", library="transformers", hub_id="histai/hibou-L", trust_remote_code=True,
      mean=HIBOU_MEAN, std=HIBOU_STD, embedding="cls", embed_dim=1024, params_m=307.0,
      licence="Apache-2.0", release_year=2024,
      description="Hibou-L (HistAI, DINOv2 ViT-L/14 + registers) via transformers remote code; "
                  "last_hidden_state[:, 0]. params: the paper's 307M.")

_tile("mstar", library="timm", hub_id="hf-hub:Wangyh/mSTAR", gated=True,
      embedding="cls", embed_dim=1024, params_m=303.35,
      architecture="vit_large_patch16_224", arch_kwargs={"img_size": 224, "init_values": 1e-5},
      model_kwargs={"dynamic_img_size": True},
      licence="CC-BY-NC-ND-4.0 (unverified)", release_year=2024,
      preprocessing_from="paper: the authors' Resize(224) + ImageNet mean/std (catalog 2.2; the hub cfg's 0.5 and "
                         "crop_pct 0.9 are not their recipe)",
      description="mSTAR (ViT-L/16 distilled from UNI) through timm hf-hub; CLS 1024. Authors' transform: "
                  "Resize(224) + ImageNet mean/std (the hub cfg's 0.5/crop 0.9 is not their recipe).")

_tile("gpfm", library="timm", hub_id="majiabo/GPFM", hub_file="GPFM.pth",
      embedding="cls", embed_dim=1024, params_m=303.23,
      architecture="vit_large_patch14_dinov2", arch_kwargs={"img_size": 224, "init_values": 1e-5},
      licence="MIT", release_year=2024,
      preprocessing_from="card: majiabo/GPFM (224 bicubic, ImageNet mean/std; catalog 2.2); a bare checkpoint timm "
                         "publishes no config for",
      description="GPFM (multi-expert distillation into a DINOv2 ViT-L/14): GPFM.pth from the HF repo loaded "
                  "strictly into timm vit_large_patch14_dinov2 at 224; CLS 1024.")

_tile("musk", library="musk", hub_id="hf_hub:xiangjx/musk", gated=True,
      input_size=384, mean=HALF_MEAN, std=HALF_STD,
      embedding="native", embed_dim=2048, params_m=307.0, architecture="musk_large_patch16_384",
      extra="musk", requires=("musk", "fairscale"),
      licence="CC-BY-NC-ND-4.0", release_year=2025, objective="image-text",
      description="MUSK (BEiT-3 vision-language, ViT-L/16 at 384 px) via the musk package; the ms_aug "
                  "multiscale image feature, 2048-d (CRoMa's choice). 384 bicubic + centre crop, mean/std 0.5.")

_tile("genbio_pathfm", library="transformers", hub_id="genbio-ai/genbio-pathfm", trust_remote_code=True,
      interpolation="bilinear", mean=(0.697, 0.575, 0.728), std=(0.188, 0.240, 0.187),
      embedding="native", embed_dim=4608, params_m=1130.0,
      licence="GenBio AI Community Licence", release_year=2025,
      description="GenBio-PathFM (JEDI, single-channel ViT-g/16) via its hub remote code: each RGB channel is "
                  "encoded separately and the 3 CLS tokens concatenated = 4608 (the model's own output). "
                  "params: the paper's 1.13B.")

register(EncoderSpec(
    name="dinov2_b", library="timm", hub_id="vit_base_patch14_dinov2.lvd142m",
    **from_library("timm:vit_base_patch14_dinov2.lvd142m",
                   input_size=(224, "CRoMa runs its DINOv2-B control at 224 px like the pathology tiles "
                                    "(croma_conventions.md E; catalog 2.2), not timm's native 518"),
                   resize_size=(None, "224 px tiles: resize 224 + crop 224 (CRoMa's tile transform)")),
    embedding="cls", embed_dim=768, params_m=86.58, model_kwargs={"dynamic_img_size": True},
    licence="Apache-2.0", release_year=2023, objective="ssl",
    description="DINOv2 ViT-B/14 (LVD-142M): CRoMa's natural-image control at 224 px (dynamic_img_size=True "
                "interpolates the 518 px position embedding, as croma's registry does); CLS 768.",
))
