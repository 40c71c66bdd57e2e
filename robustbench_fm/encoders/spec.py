"""EncoderSpec: one registry entry binding weights to preprocessing and pooling (like timm's
``pretrained_cfg``), so that no user ever sets a mean/std or an embedding size by hand."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

IMNET_MEAN, IMNET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
OPENAI_MEAN, OPENAI_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
HALF_MEAN, HALF_STD = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)

LIBRARIES = ("timm", "open_clip", "transformers", "synthetic")
#: cls: last-layer class token; patch_mean: mean of patch tokens (registers excluded);
#: cls_patch_mean: their concatenation; projected: image-text model's projected image embedding;
#: pooled: the library's own global pooling of the penultimate layer (CNNs).
EMBEDDINGS = ("cls", "patch_mean", "cls_patch_mean", "projected", "pooled")
RESIZES = ("shorter_center_crop", "squash")


@dataclass(frozen=True)
class EncoderSpec:
    """Everything that determines an encoder's features except the weights themselves."""

    name: str
    library: str
    hub_id: str
    input_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    embedding: str
    embed_dim: int
    params_m: float
    resize: str = "shorter_center_crop"
    resize_size: int | None = None  # shorter side before the centre crop; None = input_size
    interpolation: str = "bicubic"
    channels: int = 3
    pretrained: bool = True  # False: random weights drawn with ``seed`` (no download ever)
    seed: int | None = None
    revision: str | None = None
    gated: bool = False
    trust_remote_code: bool = False
    amp_dtype: str | None = "bfloat16"  # autocast dtype on CUDA; None = always fp32
    model_kwargs: dict = field(default_factory=dict)
    description: str = ""

    def __post_init__(self):
        if self.library not in LIBRARIES:
            raise ValueError(f"encoder '{self.name}': library '{self.library}' is not one of {LIBRARIES}")
        if self.embedding not in EMBEDDINGS:
            raise ValueError(f"encoder '{self.name}': embedding '{self.embedding}' is not one of {EMBEDDINGS}")
        if self.resize not in RESIZES:
            raise ValueError(f"encoder '{self.name}': resize '{self.resize}' is not one of {RESIZES}")
        if len(self.mean) != len(self.std):
            raise ValueError(f"encoder '{self.name}': mean and std lengths differ")
        if not self.pretrained and self.seed is None:
            raise ValueError(f"encoder '{self.name}': random-weight entries need a seed")

    def preprocessing(self) -> dict:
        """The fields that define the image transform (part of the feature-cache key)."""
        return {"input_size": self.input_size, "resize": self.resize,
                "resize_size": self.resize_size or self.input_size,
                "interpolation": self.interpolation, "mean": list(self.mean), "std": list(self.std),
                "channels": self.channels}

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["mean"], d["std"] = list(self.mean), list(self.std)
        return d

    def replace(self, **changes) -> "EncoderSpec":
        return dataclasses.replace(self, **changes)
