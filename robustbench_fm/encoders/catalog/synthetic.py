"""The two planted calibration references (candor.md, the 200-image experiment); their module is
:mod:`robustbench_fm.encoders.synthetic`, imported only when one is loaded."""
from __future__ import annotations

from ..registry import register
from ..spec import EncoderSpec


def _spec(name: str, kind: str, description: str) -> EncoderSpec:
    return EncoderSpec(
        name=name, library="synthetic", hub_id=f"planted:{kind}", input_size=224,
        mean=(0.5,), std=(0.25,), embedding="pooled", embed_dim=256, params_m=0.07,
        channels=1, pretrained=False, seed=0, amp_dtype=None, objective="synthetic",
        model_kwargs={"kind": kind, "grid": 16, "blur_sigma": 8.0, "hp_sigma": 1.5, "sort": True},
        description=description)


PLANTED_BLUR = register(_spec(
    "planted_blur", "blur",
    "CANDOR calibration reference blind to a small local marker: Gaussian blur (sigma 8 px), "
    "16x16 average cells, sorted, fixed random projection (D ~ 1/2 on the planted set)."))
PLANTED_SHARP = register(_spec(
    "planted_sharp", "sharp",
    "CANDOR calibration reference sensitive to a small local marker: |x - blur_1.5(x)|, 16x16 "
    "max cells, sorted, the same random projection (D = 0 on the planted set)."))
