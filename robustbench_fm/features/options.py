"""How features are extracted: :class:`ExtractOptions`, the one typed object holding a run's
extraction settings (docs/architecture.md, "Where each concept lives").

The plan builds it once from the config (``extract.*``, ``device``, ``security.allow_remote_code``,
``cache.on_version_change``: :data:`CONFIG_KEYS`); the Python API (``robustbench_fm.embed``,
``robustbench_fm.features.extract``) builds it from its keyword arguments. Either way it is passed
unchanged to the :class:`~robustbench_fm.features.embed.Embedder`, the feature store
(:class:`~robustbench_fm.features.store.FeatureStore`) and the extraction engine
(:mod:`robustbench_fm.features.engine`), which read its fields and check none of them again: every
value is checked here, once, when the object is made (a one-line error naming the setting).

The field defaults are the Python API's (``robustbench_fm.embed`` takes its defaults from
:data:`DEFAULTS`); the command line's are those of ``configs/config.yaml``, which the plan reads
for every field. Imports no torch."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from ..core.errors import InvalidSetting, message
from ..core.versions import VERSION_POLICIES
from ..data.images import BAD_IMAGE_POLICIES, DEFAULT_DECODE, check_decode
from ..encoders.spec import ALLOW_REMOTE_CODE

#: what a run does with rows whose image is another row's under a different sample_id
#: (``extract.duplicates``; :func:`.store.duplicate_images`): refuse the run naming them, drop all but the
#: first sample_id of each image, or keep them (a duplicate is its copy's nearest neighbour)
DUPLICATE_POLICIES = ("refuse", "drop", "keep")
DEFAULT_DUPLICATES = "refuse"


def check_duplicates(policy: str, key: str = "extract.duplicates") -> str:
    """``policy`` when it is one of :data:`DUPLICATE_POLICIES`, else a one-line error naming ``key``."""
    if policy not in DUPLICATE_POLICIES:
        raise InvalidSetting(f"{key}={policy!r}: use refuse (stop at an image listed under two sample_ids), drop "
                             "(keep its first sample_id) or keep")
    return policy


@dataclass(frozen=True)
class ExtractOptions:
    """The extraction settings of a run, each checked when the object is made (:meth:`__post_init__`;
    a whole number given as digits, as a config's string may be, is kept as an int)."""

    #: images per forward pass (an encoder's own ``encoder.batch_size`` overrides it for that encoder)
    batch_size: int = 32
    #: decode workers: a whole number, or ``"auto"`` (the engine's default for the device)
    num_workers: int | str = 0
    #: rows per shard of a new feature-cache entry (an existing entry keeps its layout)
    shard_size: int = 1024
    #: an unreadable image: ``error`` (stop naming the file and row) or ``skip`` (a NaN row, in skipped.csv)
    on_bad_image: str = "error"
    #: N > 1: this run extracts only part :attr:`shard` of N of each entry
    num_shards: int = 1
    shard: int = 0
    #: where the encoders run (``auto``: CUDA when present)
    device: str = "auto"
    #: entries that need their authors' hub code may run it
    allow_remote_code: bool = ALLOW_REMOTE_CODE
    #: stored features made with other package/library versions: reuse, warn or recompute
    on_version_change: str = "reuse"
    #: how JPEGs resized smaller are decoded: scaled or exact (:mod:`robustbench_fm.data.images`)
    decode: str = DEFAULT_DECODE
    #: an image listed under two sample_ids: refuse, drop or keep (:func:`.store.apply_duplicates`)
    duplicates: str = DEFAULT_DUPLICATES

    def __post_init__(self) -> None:
        """Every field checked, once: an error is one line starting ``<field>=<value>``
        (:meth:`named` renames the field to the key the user typed)."""
        for name, least in (("batch_size", 1), ("shard_size", 1), ("num_shards", 1), ("shard", 0)):
            object.__setattr__(self, name, _whole(name, getattr(self, name), least))
        if str(self.num_workers) != "auto":
            object.__setattr__(self, "num_workers", _whole("num_workers", self.num_workers, 0))
        if self.on_bad_image not in BAD_IMAGE_POLICIES:
            raise InvalidSetting(f"on_bad_image={self.on_bad_image!r}: use {' or '.join(BAD_IMAGE_POLICIES)} (stop at "
                                 "an unreadable image, or leave it out and list it in skipped.csv)")
        if self.on_version_change not in VERSION_POLICIES:
            raise InvalidSetting(f"on_version_change={self.on_version_change!r}: use {', '.join(VERSION_POLICIES)} "
                                 "(stored features made with other package or library versions: use them, use them "
                                 "with a warning, or embed again)")
        check_decode(self.decode, "decode")
        check_duplicates(self.duplicates, "duplicates")

    @classmethod
    def named(cls, key: Callable[[str], str], **settings) -> ExtractOptions:
        """The options ``settings`` give, an error naming the setting by ``key(field)`` (the
        config's key, :data:`CONFIG_KEYS`; ``embed: decode`` for the Python API's)."""
        try:
            return cls(**settings)
        except InvalidSetting as exc:
            text = message(exc)
            name = text.split("=", 1)[0]
            if name not in CONFIG_KEYS:
                raise
            raise InvalidSetting(key(name) + text[len(name):]) from None

    def whole(self) -> ExtractOptions:
        """These options for every part of an entry (``num_shards=1``): what a stage that embeds
        its own images (CANDOR's retention) and a slide's tiles are extracted with."""
        return self if self.num_shards == 1 else dataclasses.replace(self, num_shards=1, shard=0)


def _whole(name: str, value, least: int) -> int:
    """``value`` as an int >= ``least`` (digits in a string accepted, a bool refused), else one line."""
    if isinstance(value, bool) or not isinstance(value, int) and not str(value).strip().isdigit() \
            or int(value) < least:
        raise InvalidSetting(f"{name}={value!r}: use a whole number >= {least}")
    return int(value)


#: field -> the config key that sets it (the plan reads each; an error names it)
CONFIG_KEYS = {"batch_size": "extract.batch_size", "num_workers": "extract.num_workers",
               "shard_size": "extract.shard_size", "on_bad_image": "extract.on_bad_image",
               "num_shards": "extract.num_shards", "shard": "extract.shard", "device": "device",
               "allow_remote_code": "security.allow_remote_code", "on_version_change": "cache.on_version_change",
               "decode": "extract.decode", "duplicates": "extract.duplicates"}
#: the keys of the config's ``extract`` node that are not extraction options: how a sweep runs its
#: extraction (``extract.panel_jobs``: :mod:`robustbench_fm.cli.sweeps` reads it)
SWEEP_KEYS = ("extract.panel_jobs",)
#: every option at its default (the Python API's defaults)
DEFAULTS = ExtractOptions()
