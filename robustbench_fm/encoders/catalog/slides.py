"""CRoMa's slide-level encoders (croma.md Table 2; catalog 2.3) and MOOZY's tile encoder.

A slide entry's preprocessing fields are its tile encoder's (the slide embedding depends on them
through the cached tile embeddings); ``resize="none"`` marks that it takes no images itself.
"""
from __future__ import annotations

from ..registry import get, register
from ..spec import EncoderSpec

register(EncoderSpec(
    name="lunit_dino_s8", library="timm", hub_id="hf-hub:1aurent/vit_small_patch8_224.lunit_dino",
    input_size=224, resize="shorter_center_crop", interpolation="bicubic",
    mean=(0.70322989, 0.53606487, 0.66096631), std=(0.21716536, 0.26081574, 0.20723464),
    embedding="cls", embed_dim=384, params_m=21.67,
    architecture="vit_small_patch8_224", arch_kwargs={"img_size": 224},
    licence="Lunit non-commercial (unverified)", release_year=2023, objective="ssl",
    preprocessing_from="card: 1aurent/vit_small_patch8_224.lunit_dino config.json (Lunit's benchmark mean/std; catalog "
                       "2.3)",
    description="Lunit DINO ViT-S/8 (TCGA tiles at 20x): MOOZY's tile encoder (CLS 384). Mean/std: Lunit's "
                "benchmark values (unverified here; the hub cfg of the timm port carries them).",
))


def _slide(name: str, tile: str, **kw) -> EncoderSpec:
    t = get(tile)
    return register(EncoderSpec(
        name=name, library="slide", tile_encoder=tile, input_size=t.input_size, mean=t.mean, std=t.std,
        interpolation=t.interpolation, resize="none", resize_size=t.resize_size, channels=t.channels,
        embedding="native", amp_dtype=None, **kw))


_slide("prism", "virchow", hub_id="paige-ai/Prism", gated=True, trust_remote_code=True, architecture="prism",
       embed_dim=1280, params_m=99.0, extra="prism", requires=("environs", "sacremoses"),
       licence="CC-BY-NC-ND-4.0", release_year=2024, objective="image-text",
       description="PRISM (Paige, Perceiver aggregator of Virchow cls_patch_mean 2560-d tiles) via hub remote "
                   "code: slide_representations(tiles)['image_embedding'], 1280-d. Its card pins "
                   "transformers 4.42.4. params: the paper's count.")

_slide("titan", "conch_v1_5", hub_id="MahmoodLab/TITAN", gated=True, trust_remote_code=True, architecture="titan",
       embed_dim=768, params_m=48.5, extra="titan", requires=("einops", "einops_exts"),
       slide_kwargs={"patch_size_level0": 1024},
       licence="CC-BY-NC-ND-4.0", release_year=2024, objective="image-text",
       description="TITAN (MahmoodLab, CoCa slide encoder of CONCH v1.5 768-d tiles, 512 px at 20x) via hub "
                   "remote code: encode_slide_from_patch_features(tiles, coords, patch_size_level0), 768-d. "
                   "patch_size_level0 defaults to 1024 (512 px at 20x on a 40x slide); pass the slide's own.")

_slide("gigapath_slide", "prov_gigapath", hub_id="hf_hub:prov-gigapath/prov-gigapath", gated=True,
       architecture="gigapath", embed_dim=768, params_m=86.3, extra="gigapath",
       requires=("gigapath", "fairscale", "flash_attn"),
       licence="Apache-2.0 (gated terms)", release_year=2024, objective="ssl",
       description="Prov-GigaPath slide encoder (LongNet, gigapath_slide_enc12l768d) over Prov-GigaPath 1536-d "
                   "tiles via the gigapath package; output 11 of all_layer_embed=True, 768-d.")

_slide("moozy", "lunit_dino_s8", hub_id="AtlasAnalyticsLab/MOOZY", hub_file="moozy.pt", architecture="moozy",
       embed_dim=768, params_m=64.1, extra="moozy", requires=("moozy",),
       slide_kwargs={"patch_size_level0": 224},
       licence="unknown", release_year=2026, objective="supervised",
       description="MOOZY (grid ViT slide + case encoder over Lunit ViT-S/8 384-d tiles at 224 px, 20x) via the "
                   "moozy package (PyPI): the case 'cls' embedding of one slide, 768-d. params: its 64.1M "
                   "slide-and-case encoder (the paper's 85.8M adds the frozen 21.7M patch encoder).")
