"""The preprocessing timm and open_clip publish for the catalog's pretrained weights: one home.

A catalog entry whose weights the library itself describes takes its preprocessing from here
(``**from_library("timm:resnet50.tv_in1k")``) instead of typing mean, std, size, interpolation and
crop again; where it departs from the library, it says which field and why (the paper's own recipe)
with ``from_library(source, field=(value, reason))``, and the spec records the reasons in
``preprocessing_differs``. An entry the library publishes nothing for offline (weights on a hub
repo of their own, a bare checkpoint) names its source in ``preprocessing_from`` instead.

The values are what ``encoders.generic.library_preprocessing`` reads from the installed library
(timm's ``get_pretrained_cfg`` through ``resolve_data_config``; open_clip's model and pretrained
configs), written out because importing the registry imports no torch (timm and open_clip
register their configs in modules that import it). ``tests/encoders/test_catalog.py`` checks every
value here against the library and every timm and open_clip entry against its source, so a library
that changes its config, or an entry that drifts from it without a stated reason, fails.
"""
from __future__ import annotations

from ..spec import HALF_MEAN, HALF_STD, IMNET_MEAN, IMNET_STD, OPENAI_MEAN, OPENAI_STD

#: ``timm:<name>.<tag>`` / ``open_clip:<model>/<tag>`` -> the spec's preprocessing fields
#: (timm 1.0.31, open_clip 3.3.0). ``resize_size`` is timm's ``floor(size / crop_pct)``.
LIBRARY = {
    "timm:vit_large_patch14_dinov2.lvd142m": dict(
        input_size=518, resize="shorter_center_crop", resize_size=518, interpolation="bicubic",
        mean=IMNET_MEAN, std=IMNET_STD, channels=3),
    "timm:vit_base_patch14_dinov2.lvd142m": dict(
        input_size=518, resize="shorter_center_crop", resize_size=518, interpolation="bicubic",
        mean=IMNET_MEAN, std=IMNET_STD, channels=3),
    "timm:vit_small_patch16_224": dict(  # the default tag, augreg_in21k_ft_in1k (crop_pct 0.9)
        input_size=224, resize="shorter_center_crop", resize_size=248, interpolation="bicubic",
        mean=HALF_MEAN, std=HALF_STD, channels=3),
    "timm:vit_large_patch16_224": dict(  # the default tag, augreg_in21k_ft_in1k (crop_pct 0.9)
        input_size=224, resize="shorter_center_crop", resize_size=248, interpolation="bicubic",
        mean=HALF_MEAN, std=HALF_STD, channels=3),
    "timm:vit_base_patch32_224.augreg_in21k_ft_in1k": dict(  # crop_pct 0.9
        input_size=224, resize="shorter_center_crop", resize_size=248, interpolation="bicubic",
        mean=HALF_MEAN, std=HALF_STD, channels=3),
    "timm:resnet50.tv_in1k": dict(  # crop_pct 0.875
        input_size=224, resize="shorter_center_crop", resize_size=256, interpolation="bilinear",
        mean=IMNET_MEAN, std=IMNET_STD, channels=3),
    "timm:tf_efficientnet_lite0.in1k": dict(  # crop_pct 0.875
        input_size=224, resize="shorter_center_crop", resize_size=256, interpolation="bicubic",
        mean=HALF_MEAN, std=HALF_STD, channels=3),
    "open_clip:ViT-L-14-quickgelu/openai": dict(
        input_size=224, resize="shorter_center_crop", resize_size=None, interpolation="bicubic",
        mean=OPENAI_MEAN, std=OPENAI_STD, channels=3),
    "open_clip:ViT-L-16-SigLIP2-512/webli": dict(
        input_size=512, resize="squash", resize_size=None, interpolation="bicubic",
        mean=HALF_MEAN, std=HALF_STD, channels=3),
}


def from_library(source: str, **differs: tuple) -> dict:
    """``EncoderSpec`` keyword arguments: the preprocessing ``source`` publishes, except each
    ``field=(value, reason)`` where the entry follows its paper instead (the reason is kept)."""
    fields = dict(LIBRARY[source])
    for key, (value, _reason) in differs.items():
        fields[key] = value
    return {**fields, "preprocessing_from": source,
            "preprocessing_differs": {key: reason for key, (_value, reason) in differs.items()}}
