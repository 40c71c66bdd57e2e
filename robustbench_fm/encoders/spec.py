"""EncoderSpec: one registry entry binding weights to preprocessing and pooling (like timm's
``pretrained_cfg``), so that no user ever sets a mean/std or an embedding size by hand.

Besides what determines the features, an entry records what the CANDOR association analyses
need (``release_year``, ``objective``; candor.md, Experiments: Scope) and what a user needs to
obtain the weights (``gated``, ``licence``, ``extra``/``requires``, ``weights_url``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..core.errors import InvalidSetting, UserError

IMNET_MEAN, IMNET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
OPENAI_MEAN, OPENAI_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
HALF_MEAN, HALF_STD = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)

#: Libraries with a loader in ``encoders/loaders``. timm, open_clip, transformers (and the built-in
#: synthetic one) are dependencies of the package; torchxrayvision and the others are optional
#: extras (``spec.extra``) imported only when such an entry is loaded.
LIBRARIES = ("timm", "open_clip", "transformers", "torchxrayvision", "synthetic",
             "conch", "musk", "flair", "panderm", "sam_med2d", "titan_conch", "slide")
#: cls: last-layer class token; patch_mean: mean of patch tokens (registers excluded);
#: cls_patch_mean: their concatenation; projected: image-text model's projected image embedding;
#: pooled: the library's own global pooling of the penultimate layer (CNNs, MAE fc_norm, SAM neck);
#: native: the model's own feature output (MUSK ms_aug, GenBio's per-channel CLS, slide embeddings).
EMBEDDINGS = ("cls", "patch_mean", "cls_patch_mean", "projected", "pooled", "native")
#: shorter_center_crop: shorter side to ``resize_size`` then centre crop; squash: both sides to
#: ``input_size``; longest_pad: longer side to ``input_size``, zero padding right/bottom (FLAIR);
#: none: the tensor is taken as is (slide entries aggregate cached tile embeddings).
RESIZES = ("shorter_center_crop", "squash", "longest_pad", "none")
#: the fields of ``EncoderSpec.preprocessing()``: what defines the image transform
PREPROCESSING_FIELDS = ("input_size", "resize", "resize_size", "interpolation", "mean", "std", "channels")
#: Pretraining objective, as CANDOR groups encoders (SSL / I-T / Sup. / untrained), plus
#: ``synthetic``: a fixed hand-built calibration encoder (the planted references), not trained;
#: ``unknown``: a generic entry's pretrained weights (``encoder=timm|hf|open_clip``, encoders/generic.py).
OBJECTIVES = ("ssl", "image-text", "supervised", "none", "synthetic", "unknown")
#: Whether an entry that needs its authors' code from the hub (``trust_remote_code``) may run it:
#: off unless the user opts in (``security.allow_remote_code=true``; configs/config.yaml reads the
#: same value, tests/encoders/test_remote_code.py checks that the two agree).
ALLOW_REMOTE_CODE = False


class RemoteCodeRefused(UserError, PermissionError):
    """An entry needs hub code (``trust_remote_code``) and ``security.allow_remote_code`` is false."""


def check_remote_code(spec: "EncoderSpec", allow_remote_code: bool) -> bool:
    """Whether to run ``spec``'s hub code: True only when it needs that code and the user allowed it;
    raises :class:`RemoteCodeRefused` (one line naming the flag) when it needs it and it is not allowed.
    Called before any weights are looked up or downloaded (``encoders.load``/``load_slide``)."""
    if spec.trust_remote_code and not allow_remote_code:
        raise RemoteCodeRefused(
            f"encoder '{spec.name}' runs its authors' code from the Hugging Face hub ('{spec.hub_id}', "
            "trust_remote_code) and security.allow_remote_code is false (the default); add "
            "security.allow_remote_code=true to run it (Python: allow_remote_code=True), or pick another encoder")
    return bool(spec.trust_remote_code)


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
    model_kwargs: dict = field(default_factory=dict)  # passed on every build (hub, local, random)
    pretrained_tag: str | None = None  # open_clip's pretrained tag of a model name (generic open_clip entries)
    description: str = ""
    # --- where the preprocessing comes from (encoders/catalog/library.py, tests/encoders/test_catalog.py) --
    #: ``timm:<name>.<tag>`` or ``open_clip:<model>/<tag>``: the library's published config, checked field by
    #: field; otherwise the model card, config file or paper the values are read from
    preprocessing_from: str | None = None
    preprocessing_differs: dict = field(default_factory=dict)  # field -> why it departs from that config
    # --- provenance (CANDOR association analyses, the doctor) -----------------------------------
    licence: str = "unknown"
    release_year: int | None = None
    objective: str = "ssl"
    #: pip extra of robustbench_fm that installs the packages the loader imports (None: none needed)
    extra: str | None = None
    requires: tuple[str, ...] = ()  # import names the loader needs beyond the core dependencies
    weights_url: str | None = None  # where weights not on the HF hub come from (encoder.weights=PATH)
    # --- architecture offline (random weights, the meta-device tests, local files w/o a config) -----
    architecture: str | None = None  # timm/open_clip model name, transformers model_type, xrv class
    arch_kwargs: dict = field(default_factory=dict)  # what the hub config.json holds for that build
    hub_file: str | None = None  # a bare checkpoint inside the HF repo ``hub_id`` (GPFM, RETFound)
    checkpoint_drop: tuple[str, ...] = ()  # key prefixes of such a checkpoint the model has no use for
    checkpoint_keep_init: tuple[str, ...] = ()  # key prefixes the model keeps at their initial values
    # --- slide-level aggregators -----------------------------------------------------------------
    tile_encoder: str | None = None  # registry name of the tile encoder whose embeddings it takes
    slide_kwargs: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.library not in LIBRARIES:
            raise InvalidSetting(f"encoder '{self.name}': library '{self.library}' is not one of {LIBRARIES}")
        if self.embedding not in EMBEDDINGS:
            raise InvalidSetting(f"encoder '{self.name}': embedding '{self.embedding}' is not one of {EMBEDDINGS}")
        if self.resize not in RESIZES:
            raise InvalidSetting(f"encoder '{self.name}': resize '{self.resize}' is not one of {RESIZES}")
        if self.objective not in OBJECTIVES:
            raise InvalidSetting(f"encoder '{self.name}': objective '{self.objective}' is not one of {OBJECTIVES}")
        if len(self.mean) != len(self.std):
            raise InvalidSetting(f"encoder '{self.name}': mean and std lengths differ")
        if not self.pretrained and self.seed is None:
            raise InvalidSetting(f"encoder '{self.name}': random-weight entries need a seed")
        if set(self.preprocessing_differs) - set(PREPROCESSING_FIELDS):
            raise InvalidSetting(f"encoder '{self.name}': preprocessing_differs names "
                                 f"{sorted(set(self.preprocessing_differs) - set(PREPROCESSING_FIELDS))}, not one "
                                 f"of {PREPROCESSING_FIELDS}")
        if (self.library == "slide") != (self.tile_encoder is not None):
            raise InvalidSetting(f"encoder '{self.name}': slide entries (and only they) name a tile_encoder")

    @property
    def is_slide(self) -> bool:
        """True for slide-level aggregators of cached tile embeddings."""
        return self.tile_encoder is not None

    def preprocessing(self) -> dict:
        """The fields that define the image transform (part of the feature-cache key)."""
        return {"input_size": self.input_size, "resize": self.resize,
                "resize_size": self.resize_size or self.input_size,
                "interpolation": self.interpolation, "mean": list(self.mean), "std": list(self.std),
                "channels": self.channels}

    def replace(self, **changes) -> "EncoderSpec":
        return dataclasses.replace(self, **changes)
