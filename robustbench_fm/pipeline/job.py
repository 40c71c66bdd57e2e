"""What one job does: dataset → manifest → (per encoder) features → stage → results.

The pipeline below the command line (docs/architecture.md, "One run"): :func:`plan` is the one
place that reads a job's resolved config (a Hydra ``DictConfig``). It checks it once and returns
the job's typed run configuration, :class:`Plan`: what to read, which encoders with which of the
user's options, which stage with which parameters, where the caches are, how features are
extracted, what the report builds, and how the job runs (alone or as one job of a sweep, under
which experiment). Every step after it (manifest, extraction service, stage, results, report)
takes the Plan, never the config: :func:`run_planned` does the work. The entry points
:func:`run` (a config in: :func:`plan`, then :func:`run_planned`) and :func:`job_manifest` (a
finished job's manifest, for a sweep's collect step) are the only other functions that take a
config. The command line (:mod:`robustbench_fm.cli`) parses, composes the config with Hydra and
prints; a sweep's or an experiment's jobs come here one by one (:mod:`.experiment`). Imports no
Hydra.
"""
from __future__ import annotations

import contextlib
import json
import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

if TYPE_CHECKING:  # the feature engine imports torch: a plan, a dry run and its one-line errors do not
    from ..features.embed import Embedder, EncoderOptions
    from ..methods.job import JobContext

from .. import data, encoders, methods
from .. import methods as stages
from ..core.atomic import write_atomic, write_text_atomic
from ..core.devices import check_device
from ..core.errors import InvalidSetting, MissingInput, UnknownName, UserError
from ..core.locking import FileLock, LockTimeout
from ..core.redact import redact_config, redacted_yaml
from ..core.results import not_scored, to_markdown, without_interval, without_single_group_pools
from ..core.shards import META_NAME
from ..core.tables import SweepResults
from ..core.versions import VERSION_POLICIES
from ..data import cards, prepared
from ..data import manifest as mf
from ..data.csv_manifest import no_findings_reason
from ..data.images import BAD_IMAGE_POLICIES, DEFAULT_DECODE, check_decode
from ..data.sample import fixed_sample
from ..encoders import generic
from ..methods.run import score_and_save
from ..report.comparisons import build as build_comparisons
from ..report.comparisons import verdict
from ..report.html import run_report, write_report
from ..report.long_format import to_long
from ..report.tables import build_tables

log = logging.getLogger("robustbench_fm")

#: Errors caused by the user's input (names, files, options, an unreadable folder): the CLI prints
#: them as one line; anything else is a bug: one line saying so, the traceback in the log file
#: (``debug=true`` shows it on the console too).
USER_ERRORS = (UserError, PermissionError)


# ----------------------------------------------------------------------------- the typed plan

@dataclass(frozen=True)
class Paths:
    """Where the job's caches live: ``paths.cache_dir`` (the feature cache) and the store of
    images prepared at ``resolution`` (``paths.prepared_dir``, else ``prepared`` beside the
    feature cache: :func:`resolved_prepared_dir`)."""

    cache_dir: Path
    prepared_dir: Path


@dataclass(frozen=True)
class ExtractOptions:
    """How the feature cache is filled: ``extract.*`` (batch size, decode workers, shard size,
    the unreadable-image policy, the part of a sharded extraction), ``device`` and
    ``security.allow_remote_code``."""

    batch_size: int
    num_workers: int | str
    shard_size: int
    on_bad_image: str
    num_shards: int
    shard: int
    device: str
    allow_remote_code: bool
    on_version_change: str = "reuse"
    decode: str = DEFAULT_DECODE


@dataclass(frozen=True)
class EncoderSettings:
    """The options the user gave the job's ``encoder`` (``encoder.weights``, ``tile_weights``,
    ``embedding``, ``batch_size``); ``name`` is the entry they apply to (a generic entry,
    ``encoder=timm|hf|open_clip``, by its resolved name, with its local weights)."""

    name: str
    weights: str | None = None
    tile_weights: str | None = None
    embedding: str | None = None
    batch_size: int | None = None


@dataclass(frozen=True)
class ReportOptions:
    """What the report builds: the paper tables of ``report.tables``."""

    tables: tuple[str, ...] = ()


@dataclass(frozen=True)
class Plan:
    """The typed run configuration of one job, built once from the resolved config (:func:`plan`)
    and checked before any heavy step starts; everything after :func:`plan` reads it, not the config.

    ``dataset``: the dataset name (with ``features_file``: the name of the user's data, see
    :func:`features_names`); ``encoders``: the panel (with ``features_file``: the feature set's
    name); ``multirun``: one job of a sweep or of an experiment run as a unit (its paper tables
    wait for the collect step); ``experiment``: the experiment's name for the report.
    ``params``: the stage's resolved parameters (``param_overrides``: parameter -> the top-level
    key that sets it, for error messages); ``manifest_file``: a manifest to read instead of the
    dataset's (``dataset_options``, ``generate``, ``verify_images``, ``card``: how the dataset's is
    built); ``fixed_sample`` and ``seed``: the fixed draw of :func:`load_manifest`;
    ``swept_encoders``: the panel a ``-m`` sweep fans out (``encoders``); ``encoder``: the user's
    options of the chosen encoder; ``config``: the resolved config, secrets masked, as
    ``config.yaml`` holds it (its hash keys the results); ``cli_overrides``: the command line's
    overrides (``overrides.yaml``). The fields after ``experiment`` default to empty for a plan
    built by hand (tests); :func:`plan` fills every one."""

    dataset: str | None
    root: Path | None
    encoders: list[str]
    stage: str
    findings: list[str]
    features_file: Path | None
    resolution: int | None = None  # every image stored at this side first (``resolution``); None: native
    multirun: bool = False
    experiment: str | None = None
    params: dict = field(default_factory=dict)
    param_overrides: dict[str, str] = field(default_factory=dict)
    seed: int | None = None
    manifest_file: Path | None = None
    dataset_options: dict = field(default_factory=dict)
    generate: bool = False
    verify_images: bool = True
    card: dict | None = None
    fixed_sample: int | None = None
    swept_encoders: tuple[str, ...] = ()
    encoder: EncoderSettings | None = None
    paths: Paths | None = None
    extract: ExtractOptions | None = None
    report: ReportOptions = field(default_factory=ReportOptions)
    config: dict = field(default_factory=dict)
    cli_overrides: tuple[str, ...] = ()

    def describe(self) -> str:
        """The plan in words, as ``dry_run=true`` prints it."""
        if self.features_file is not None:
            source = f"features {self.features_file}, manifest {self.manifest_file}"
        else:
            generated = "" if self.root.is_dir() else " (generated on the first run)"
            source = f"{self.dataset} at {self.root}{generated}"
        rows = [("data", source),
                ("encoders", f"{', '.join(self.encoders)} ({len(self.encoders)})" if self.encoders else "-"),
                ("stage", f"{self.stage} on {', '.join(self.findings)}"),
                ("params", ", ".join(f"{k}={v}" for k, v in self.params.items())),
                ("images", "native (the files as shipped)" if self.resolution is None else
                 f"stored at {self.resolution} x {self.resolution} px once in {self.paths.prepared_dir}, then "
                 "each encoder's own resize (resolution=native reads the files as shipped)"),
                ("cache", str(self.paths.cache_dir)),
                ("device", self.extract.device)]
        return "\n".join(["plan (dry_run=true: nothing was read, embedded or written):"]
                         + [f"  {k:9s}{v}" for k, v in rows])

    @property
    def config_yaml(self) -> str:
        """``config.yaml``: :attr:`config` as YAML (the text ``redacted_yaml`` of the config gives)."""
        return OmegaConf.to_yaml(OmegaConf.create(self.config))


# ------------------------------------------------- reading the config (called by plan() only)

def panel(cfg: DictConfig, cli_overrides: list[str] | None = None) -> list[str]:
    """The encoders of this job: an explicit ``encoder=`` override wins over a panel. A generic
    entry (``encoder=timm|hf|open_clip encoder.model=...``) is named by its resolved spec
    (:func:`generic_entry`)."""
    if cli_overrides and any(o.split("=")[0].lstrip("+~") == "encoder" for o in cli_overrides):
        names = [str(cfg.encoder.name)]
    else:
        names = [str(n) for n in cfg.encoders] if cfg.get("encoders") else [str(cfg.encoder.name)]
    return [_resolved_name(cfg, n) for n in names]


def generic_entry(cfg: DictConfig) -> tuple[encoders.EncoderSpec, str | None] | None:
    """The resolved spec and local weights of ``encoder=timm|hf|open_clip`` (None for a registry
    entry): ``encoder.model``, ``encoder.pretrained``, ``encoder.weights`` (``random``, a file or a
    folder), ``encoder.embedding`` (robustbench_fm/encoders/generic.py)."""
    enc = cfg.encoder
    if not generic.is_generic(str(enc.name)):
        return None
    return generic.resolve(str(enc.name), enc.get("model"), enc.get("pretrained"), enc.get("weights"),
                           enc.get("embedding"))


def _resolved_name(cfg: DictConfig, name: str) -> str:
    if not generic.is_generic(name):
        return name
    if str(cfg.encoder.name) != name:
        raise InvalidSetting(f"the generic encoder '{name}' needs its model: run it as encoder={name} "
                             f"encoder.model=<id>, or put a card for it in your config folder (README)")
    return generic_entry(cfg)[0].name


def _require_settings(cfg: DictConfig) -> None:
    """The settings an experiment lists under ``required`` (``experiment=from_features``:
    features_file, manifest_file, stage.findings) must be set: one line naming the first unset one
    and an override that sets it (for stage.findings, one of the manifest's own columns)."""
    for key, hint in (cfg.get("required") or {}).items():
        if OmegaConf.select(cfg, key) is not None:
            continue
        if key == "stage.findings" and cfg.get("manifest_file") and Path(cfg.manifest_file).is_file():
            columns = [c for c in mf.header(cfg.manifest_file) if c not in mf.STRING_COLUMNS + mf.BOX_COLUMNS]
            if columns:
                hint = (hint.replace("[<column>]", f"[{columns[0]}]")
                        + f" (the non-canonical columns of {cfg.manifest_file}: {', '.join(columns[:12])})")
        raise InvalidSetting(f"{key} is not set: {hint}")


def _refuse_no_findings(cfg: DictConfig) -> None:
    """``dataset=csv`` whose finding auto-detection found no 0/1 column, for a stage that scores
    0/1 findings: one line naming each column it skipped and the value that kept it out (or the
    CSV's 0 rows), instead of the stage's "no finding to score"."""
    manifest = OmegaConf.select(cfg, "dataset.manifest", default=None)
    if str(cfg.dataset.get("name")) != "csv" or not manifest or not Path(str(manifest)).is_file():
        return
    if not label_columns(str(cfg.stage.name), ["finding"])[0]:  # a stage of categorical labels
        return
    raise InvalidSetting(no_findings_reason(manifest))


def _refuse_encoder_field(cfg: DictConfig, cli_overrides: list[str] | None) -> None:
    """``encoder.name=<x>`` does not choose the encoder (the group does, and only ``encoder=``
    overrides an experiment's panel): one line saying to use ``encoder=<x>``, with the registry's
    closest names when <x> is unknown."""
    if not any(o.split("=")[0].lstrip("+~") == "encoder.name" for o in cli_overrides or ()):
        return

    name = str(cfg.encoder.name)
    try:
        encoders.get(name)
    except KeyError as exc:
        import difflib

        close = difflib.get_close_matches(name, encoders.names(), n=1)
        how = f" Choose it with encoder={close[0]}" if close else " and choose one with encoder=<name>"
        raise UnknownName(f"encoder.name={name}: {exc.args[0]}{how}, not encoder.name=") from None
    raise InvalidSetting(f"encoder.name={name} does not choose the encoder (the experiment's panel would run); "
                         f"use encoder={name}")


def feature_set_name(path) -> str:
    """The name of a feature set: a feature-cache entry folder (``<cache>/<encoder>/<key>/``) is
    named by its encoder, a parquet file by its stem, another folder by its name."""
    p = Path(str(path))
    if p.is_dir() and (p / META_NAME).exists():
        return p.parent.name
    return p.stem if p.suffix == ".parquet" else p.name


def features_names(cfg: DictConfig) -> tuple[str, str]:
    """``(feature set, data)`` names of a bring-your-own-features job (``experiment=from_features``):
    ``features_encoder`` / ``features_dataset`` when set, else the feature file's name (a
    feature-cache entry: its encoder folder) and the manifest file's stem. They name the results'
    ``encoder`` and ``dataset`` columns, the job folders and the benchmark a paper table looks for
    (``features_dataset=pathorob_camelyon`` for ``report.tables=[croma_table3]``)."""
    encoder = cfg.get("features_encoder") or feature_set_name(cfg.features_file)
    dataset = cfg.get("features_dataset") or Path(str(cfg.manifest_file)).stem
    return str(encoder), str(dataset)


def label_columns(stage: str, findings) -> tuple[list[str], list[str]]:
    """``(binary, categorical)``: the job's findings split into 0/1 finding columns and categorical
    labels. A stage whose default finding is the canonical categorical column ``bio_label``
    (CRoMa, the shortcut probe: ``Method.findings``) reads its findings as categorical labels (any
    strings or codes); every other stage's are 0/1 finding columns."""
    default = stages.method(stage).findings
    categorical = not isinstance(default, str) and bool(default) and set(default) <= set(mf.STRING_COLUMNS)
    names = [str(f) for f in findings]
    return ([], names) if categorical else (names, [])


def resolution(cfg: DictConfig) -> int | None:
    """The top-level ``resolution`` (``native`` or a side in pixels; one-line error otherwise)."""
    return prepared.parse_resolution(cfg.get("resolution", prepared.NATIVE))


def fixed_sample_size(cfg: DictConfig) -> int | None:
    """The top-level ``fixed_sample`` (null or a positive count; one-line error otherwise)."""
    value = cfg.get("fixed_sample")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidSetting(f"fixed_sample={value!r}: use null (every image) or the number of positives and of "
                             "negatives to draw per matched group and finding, e.g. fixed_sample=500")
    return value


def resolved_prepared_dir(cfg: DictConfig) -> Path:
    """``paths.prepared_dir``, else ``prepared`` beside the feature cache."""
    where = OmegaConf.select(cfg, "paths.prepared_dir", default=None)
    return Path(where) if where else Path(cfg.paths.cache_dir).parent / "prepared"


def _encoder_settings(cfg: DictConfig) -> EncoderSettings:
    """The options the user gave the job's ``encoder``; a generic entry is named by its resolved
    spec and carries its resolved local weights (:func:`generic_entry`)."""
    enc = cfg.encoder
    batch_size = enc.get("batch_size")
    resolved = generic_entry(cfg)
    if resolved is not None:  # the spec holds the model, preprocessing and pooling; weights: a path or None
        return EncoderSettings(resolved[0].name, weights=resolved[1], batch_size=batch_size)
    return EncoderSettings(str(enc.name), weights=enc.get("weights"), tile_weights=enc.get("tile_weights"),
                           embedding=enc.get("embedding"), batch_size=batch_size)


def _extract_options(cfg: DictConfig, here: bool = True) -> ExtractOptions:
    """``extract.*``, ``device`` and the remote-code policy, each checked (one line naming the key;
    ``here``: the job runs in this process, so a CUDA device must be here:
    :func:`robustbench_fm.core.devices.check_device`)."""
    x = cfg.extract

    def count(key: str, value, least: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int) and not str(value).strip().isdigit() \
                or int(value) < least:
            raise InvalidSetting(f"extract.{key}={value!r}: use a whole number >= {least}")
        return int(value)

    workers = x.num_workers
    if str(workers) != "auto":
        workers = count("num_workers", workers, 0)
    policy = str(x.on_bad_image)
    if policy not in BAD_IMAGE_POLICIES:
        raise InvalidSetting(f"extract.on_bad_image={policy!r}: use {' or '.join(BAD_IMAGE_POLICIES)} (stop at an "
                             "unreadable image, or leave it out and list it in skipped.csv)")
    versions = str(OmegaConf.select(cfg, "cache.on_version_change", default="reuse"))
    if versions not in VERSION_POLICIES:
        raise InvalidSetting(f"cache.on_version_change={versions!r}: use {', '.join(VERSION_POLICIES)} (stored "
                             "features made with other package or library versions: use them, use them with a "
                             "warning, or embed again)")
    return ExtractOptions(batch_size=count("batch_size", x.batch_size, 1), num_workers=workers,
                          shard_size=count("shard_size", x.shard_size, 1), on_bad_image=policy,
                          num_shards=count("num_shards", x.get("num_shards", 1), 1),
                          shard=count("shard", x.get("shard", 0), 0),
                          device=check_device(str(cfg.device)) if here else str(cfg.device),
                          allow_remote_code=bool(cfg.security.allow_remote_code), on_version_change=versions,
                          decode=check_decode(str(OmegaConf.select(cfg, "extract.decode", default=DEFAULT_DECODE))))


#: the keys of the ``stage`` node (:func:`robustbench_fm.cli.configstore.stage_node`); its ``params``
#: are checked by the stage's parameter class (:func:`robustbench_fm.methods.check`)
STAGE_KEYS = ("name", "findings", "params")
#: the keys an ``encoder`` node may hold: a registry entry's and a generic entry's (``model``,
#: ``pretrained``; robustbench_fm/cli/configstore.py) and the options :class:`EncoderSettings` reads
ENCODER_KEYS = ("name", "model", "pretrained", "weights", "tile_weights", "embedding", "batch_size")


def _leaves(node, prefix: str) -> list[str]:
    if OmegaConf.is_dict(node) and len(node):
        return [p for k in node for p in _leaves(node._get_node(k), f"{prefix}.{k}")]
    return [prefix]


def _refuse_unknown_keys(cfg: DictConfig) -> None:
    """A key under ``stage``, ``extract``, ``encoder`` or ``dataset.options`` that nothing reads
    (``+stage.parms.k=3``, the fix Hydra itself prints for a typo, adds one and the run would
    use the default): one line naming it and the closest real key. ``stage.params`` are checked
    by the stage (:func:`robustbench_fm.methods.check`), ``dataset.options`` by the adapter's
    signature (:func:`robustbench_fm.data.registry.check_options`); ``extract``'s keys are those
    of the shipped ``configs/config.yaml``, ``dataset``'s those of the shipped dataset cards."""
    import difflib

    extract_keys = tuple(OmegaConf.load(cards.CONFIG_DIR / "config.yaml").extract.keys())
    dataset_keys = tuple(sorted({str(k) for card in (cards.CONFIG_DIR / "dataset").glob("*.yaml")
                                 for k in (OmegaConf.load(card) or {})}))
    for node, known in (("stage", STAGE_KEYS), ("extract", extract_keys), ("encoder", ENCODER_KEYS),
                        ("dataset", dataset_keys)):
        value = cfg.get(node)
        if not OmegaConf.is_dict(value):
            continue
        for key in value:
            if str(key) in known:
                continue
            close = difflib.get_close_matches(str(key), known, n=1)
            # the leaf under the typo: +stage.parms.k=3 -> stage.params.k=3
            leaf = _leaves(value._get_node(key), f"{node}.{key}")[0]
            shown = OmegaConf.select(cfg, leaf, throw_on_resolution_failure=False)
            meant = (leaf.replace(f"{node}.{key}", f"{node}.{close[0]}", 1) if close else None)
            hint = (f"did you mean {meant}={shown}? (without '+': a '+' adds a key nothing reads)" if close
                    else f"{node} holds {', '.join(known)}")
            raise InvalidSetting(f"unknown setting {leaf}: the run would ignore it; {hint}")


def _param_overrides(cfg: DictConfig) -> dict[str, str]:
    """Stage parameters set through a top-level key (``sources: ${oc.select:retention_sources,[]}``)
    -> that key, for error messages that name the override to use."""
    raw = OmegaConf.to_container(cfg.stage.params, resolve=False)
    out = {}
    for name, value in raw.items():
        if isinstance(value, str):
            m = re.fullmatch(r"\$\{(?:oc\.select:)?([A-Za-z_][\w]*)(?:,.*)?\}", value)
            if m and m.group(1) in cfg:
                out[name] = m.group(1)
    return out


def _dataset_options(cfg: DictConfig) -> dict:
    return OmegaConf.to_container(cfg.dataset.get("options") or OmegaConf.create(), resolve=True)


def _config_record(cfg: DictConfig) -> dict:
    """The resolved config without Hydra's own node, secrets masked (what ``config.yaml`` holds);
    a setting that cannot be resolved is one line naming it."""
    try:
        if "hydra" not in cfg:
            return redact_config(cfg)
        return redact_config({str(k): OmegaConf.to_container(cfg[k], resolve=True) if OmegaConf.is_config(cfg[k])
                              else cfg[k] for k in cfg if k != "hydra"})
    except OmegaConfBaseException as exc:
        raise InvalidSetting(f"the config cannot be resolved: {' '.join(str(exc).split())}") from None


def _missing_root(cfg: DictConfig, name: str, root: Path) -> MissingInput:
    """A dataset root that does not exist: set ``paths.data_dir`` when the root is the dataset's
    folder under it (every dataset of an experiment is looked for there), else ``dataset.root``."""
    data_dir = OmegaConf.select(cfg, "paths.data_dir", default=None)
    fix = "set dataset.root=<folder holding the dataset>"
    if data_dir:
        try:
            below = root.relative_to(Path(str(data_dir)))
        except ValueError:
            below = None
        if below is not None and below.parts:
            fix = (f"set paths.data_dir=<folder holding {below.as_posix()}> (where every dataset's folder is "
                   "looked for) or dataset.root=<folder holding the dataset>")
    return MissingInput(f"dataset '{name}': root '{root}' does not exist; {fix}")


# ----------------------------------------------------------------- entry points: a config in

def run(cfg: DictConfig, out_dir: Path, cli_overrides: list[str] | None = None, multirun: bool = False,
        experiment: str | None = None) -> pd.DataFrame:
    """Run the job, write everything under ``out_dir`` and return the combined summary
    (:func:`plan`, then :func:`run_planned`).

    The output folder is locked for the run (a second run aimed at it fails at once). Rows that
    any encoder skipped are dropped for every encoder, so comparisons stay paired.
    ``status.json`` says ``running``, then ``done``, ``failed`` with the error (a bad option
    too) or ``interrupted`` (Ctrl-C), with the job's wall-clock ``start`` and ``end`` (a sweep's
    report takes its runtime from the earliest start to the last end); the collect step of a
    sweep lists the jobs that did not finish, and reports a ``running`` job whose process is
    gone as interrupted.
    """

    with recorded(out_dir):
        job = plan(cfg, cli_overrides, multirun=multirun, experiment=experiment)
        return run_planned(job, out_dir)


def job_manifest(cfg: DictConfig) -> pd.DataFrame:
    """The manifest of the job whose resolved config is ``cfg`` (a sweep's collect step re-scores
    cached features with it: :meth:`robustbench_fm.core.tables.SweepResults.manifest`): the
    :func:`load_manifest` of its :func:`plan`; a bring-your-own-features job's is its
    ``manifest_file``."""
    return load_manifest(plan(cfg, here=False))


# ------------------------------------------------------- the plan: the one reader of the config

def plan(cfg: DictConfig, cli_overrides: list[str] | None = None, multirun: bool = False,
         experiment: str | None = None, here: bool = True) -> Plan:
    """The job's typed run configuration: read ``cfg`` once, validating names and options
    (one-line errors) without touching data or models. ``here``: the job will run in this process
    (``device=cuda`` needs a CUDA device here); False where it runs elsewhere (a launcher's node,
    a finished job's manifest)."""

    stages.load_plugins(cfg.get("plugins") or [])  # a sweep's job processes import them again
    _require_settings(cfg)
    _refuse_encoder_field(cfg, cli_overrides)
    stages.method(cfg.stage.name)  # the name; its module (torch) is imported when the stage runs
    _refuse_unknown_keys(cfg)  # +stage.parms.k=3 would run with the default k
    findings = list(cfg.stage.findings)
    if not findings and not cfg.get("features_file"):
        _refuse_no_findings(cfg)
    params = OmegaConf.to_container(cfg.stage.params, resolve=True)
    stages.check(cfg.stage.name, params)  # names, types (k=abc: one line naming the type) and values, once
    common = dict(multirun=multirun, experiment=experiment, params=params, param_overrides=_param_overrides(cfg),
                  seed=int(cfg.seed) if cfg.get("seed") is not None else None,
                  manifest_file=Path(str(cfg.manifest_file)) if cfg.get("manifest_file") else None,
                  swept_encoders=tuple(str(e) for e in (cfg.get("encoders") or [])),
                  report=ReportOptions(tuple(str(t) for t in (OmegaConf.select(cfg, "report.tables", default=None)
                                                              or []))),
                  paths=Paths(Path(str(cfg.paths.cache_dir)), resolved_prepared_dir(cfg)),
                  extract=_extract_options(cfg, here), cli_overrides=tuple(cli_overrides or ()))
    if cfg.get("features_file"):
        encoder, dataset = features_names(cfg)
        return Plan(dataset, None, [encoder], cfg.stage.name, findings, Path(cfg.features_file),
                    config=_config_record(cfg), **common)
    data.get(cfg.dataset.name)
    data.registry.check_options(str(cfg.dataset.name), _dataset_options(cfg))  # +dataset.options.nn=3
    root = Path(cfg.dataset.root)
    generate = bool(cfg.dataset.get("generate"))
    if not root.is_dir() and not (generate and data.get(cfg.dataset.name).generate):
        raise _missing_root(cfg, str(cfg.dataset.name), root)
    extract = common["extract"]
    if extract.num_shards > 1 and any(encoders.get(n).is_slide for n in panel(cfg, cli_overrides)):
        raise InvalidSetting("extract.num_shards > 1 is for tile/image encoders; slide encoders read a complete "
                             "tile-encoder cache entry: extract the tiles sharded first, then run the slide panel")
    if extract.num_shards < 1 or not 0 <= extract.shard < extract.num_shards:
        raise InvalidSetting(f"extract.shard={extract.shard} must be in [0, extract.num_shards={extract.num_shards}); "
                             "sweep one job per part with extract.shard=range(N)")
    names = panel(cfg, cli_overrides)
    for name in names:
        encoders.get(name)
    card = cfg.dataset.get("card")
    return Plan(cfg.dataset.name, root, names, cfg.stage.name, findings, None, resolution(cfg),
                dataset_options=_dataset_options(cfg), generate=generate,
                verify_images=bool(cfg.dataset.get("verify_images", True)),
                card=OmegaConf.to_container(card, resolve=True) if card else None,
                fixed_sample=fixed_sample_size(cfg), encoder=_encoder_settings(cfg), config=_config_record(cfg),
                **common)


# ----------------------------------------------------- the steps after the plan: a Plan in

def _stage_results(job: Plan, features, manifest: pd.DataFrame, out: Path, encoder: str,
                   dataset: str, handed_over: bool = False) -> list[pd.DataFrame]:
    """Run the job's stage for every finding of the job and save its results
    (:func:`robustbench_fm.methods.run.score_and_save`; ``handed_over``: the job will not read
    ``features`` again)."""
    return score_and_save(job.stage, features, manifest, job.findings, job.params, out, encoder, dataset,
                          handed_over)


def embedder(job: Plan) -> Embedder:
    """The run's extraction service: the plan's extraction options (``extract.*``, ``device``,
    the remote-code policy), the feature cache folder, the options the user gave the chosen
    encoder (``encoder.weights``, ...) and the ``resolution`` every image is stored at first (in
    ``paths.prepared_dir``)."""
    from ..features.embed import Embedder  # lazy: imports torch

    name, options = encoder_options(job)
    x = job.extract
    return Embedder(job.paths.cache_dir, device=x.device, batch_size=x.batch_size, num_workers=x.num_workers,
                    shard_size=x.shard_size, on_bad_image=x.on_bad_image, num_shards=x.num_shards, shard=x.shard,
                    allow_remote_code=x.allow_remote_code, options={name: options}, resolution=job.resolution,
                    prepared_dir=job.paths.prepared_dir, on_version_change=x.on_version_change, decode=x.decode)


def encoder_options(job: Plan) -> tuple[str, EncoderOptions]:
    """``(name, EncoderOptions)`` of the job's ``encoder``: the options the user gave it (weights,
    embedding, batch size); a generic entry is named by its resolved spec (:func:`generic_entry`)."""
    from ..features.embed import EncoderOptions  # lazy: imports torch

    e = job.encoder
    return e.name, EncoderOptions(weights=e.weights, tile_weights=e.tile_weights, embedding=e.embedding,
                                  batch_size=e.batch_size)


def job_context(job: Plan, manifest: pd.DataFrame, out_dir: Path) -> JobContext:
    """What a ``run_job`` stage receives (:class:`robustbench_fm.methods.job.JobContext`)."""
    from ..methods.job import JobContext  # lazy: imports torch

    return JobContext(stage=job.stage, dataset=job.dataset, root=job.root, encoders=list(job.encoders),
                      findings=[str(f) for f in job.findings], params=job.params, manifest=manifest,
                      out_dir=Path(out_dir), embedder=embedder(job), seed=int(job.seed),
                      dataset_options=job.dataset_options, verify_images=job.verify_images,
                      overrides=dict(job.param_overrides), sweep_first=_sweep_first(job))


def _sweep_first(job: Plan) -> bool:
    """False in a multirun job whose encoder is not the first of the swept panel (``encoders``,
    what ``-m`` fans out: ``robustbench_fm.cli.resolvers.sweep_values``); True otherwise."""
    if not job.multirun:
        return True
    swept = list(job.swept_encoders)
    return not swept or not job.encoders or str(job.encoders[0]) == swept[0]


def read_manifest_file(job: Plan) -> pd.DataFrame:
    """The plan's ``manifest_file`` read and validated, its findings as the stage reads them
    (:func:`label_columns`)."""
    binary, labels = label_columns(job.stage, job.findings)
    return mf.read(job.manifest_file, findings=binary, labels=labels)


def load_manifest(job: Plan) -> pd.DataFrame:
    """The dataset's canonical manifest (generated first for synthetic datasets), or the one in
    ``manifest_file`` (paths relative to ``dataset.root``); counts that differ from the dataset
    card's expected ones are logged as warnings. With ``fixed_sample: N`` only the fixed sample of
    at most N positives and N negatives per matched group and finding
    (:func:`robustbench_fm.data.sample.fixed_sample`)."""
    manifest = _full_manifest(job)
    per_class = job.fixed_sample
    if per_class is None:
        return manifest
    group_col = str(job.params.get("group_col") or "acq_group")
    sampled = fixed_sample(manifest, [str(f) for f in job.findings], per_class, seed=int(job.seed),
                           group_col=group_col)
    log.info("fixed_sample=%d: %d of %d images (at most %d positives and %d negatives per %s and finding)",
             int(per_class), len(sampled), len(manifest), int(per_class), int(per_class), group_col)
    return sampled


def _full_manifest(job: Plan) -> pd.DataFrame:
    if job.manifest_file is not None:  # e.g. the manifest scripts/prepare_dataset.py wrote beside its images
        manifest = read_manifest_file(job)
        if job.features_file is None:
            log.info("dataset %s: %d rows from %s, images under %s", job.dataset, len(manifest), job.manifest_file,
                     job.root)
        return manifest
    adapter = data.get(job.dataset)
    options = job.dataset_options
    if job.generate and adapter.generate is not None:

        # parallel sweep jobs share the generated folder: one writes it, the others wait
        with FileLock(job.root.parent / f".{job.root.name}.generate.lock", timeout=None):
            adapter.generate(job.root, **options)
    manifest = data.build_manifest(job.dataset, job.root, verify_images=job.verify_images,
                                   findings=job.findings, **options)
    log.info("dataset %s: %d rows from %s", job.dataset, len(manifest), job.root)
    if job.card:
        for warning in cards.check(manifest, job.card, job.dataset):
            log.warning(warning)
    return manifest


def _extract_panel(job: Plan, manifest: pd.DataFrame,
                   service: Embedder | None = None) -> tuple[list, list[str], dict]:
    """Fill the feature cache for every encoder (only part ``extract.shard`` of
    ``extract.num_shards`` when sharded), the image encoders in one decode pass
    (:meth:`Embedder.embed_panel`); returns (encoder, cache entry, missing shards) triples,
    the sample_ids any encoder had to skip (unreadable images under ``on_bad_image=skip``) and
    the cache use per encoder (images, embedded now, read from the cache, hit, seconds).
    ``service``: the Embedder to use (a sweep's panel extraction job, :mod:`.sweeps`, gives one
    holding every encoder's options); default :func:`embedder` of the plan."""

    service = embedder(job) if service is None else service
    entries, skipped, cache = [], set(), {}
    images = manifest.drop_duplicates("sample_id")  # paired designs list an image once per subset
    # image encoders: one decode per image for the whole panel (those that fit in memory together)
    image_encoders = [name for name in job.encoders if not encoders.get(name).is_slide]
    panel = dict(zip(image_encoders, service.embed_panel(images, job.root, image_encoders, sharded=True)))
    for name in job.encoders:
        if encoders.get(name).is_slide:  # slide aggregators (croma_slides): tiles -> tile encoder -> slide embedding
            entries.append((name, service.embed_slides(images, job.root, name), []))
            continue
        feats = panel.pop(name)
        if feats.n_images_embedded:  # a full cache hit is logged by the cache ("cache hit: N rows, ...")
            log.info("%s: %d images embedded, %d forward passes, %.1f images/s, cache %s", name,
                     feats.n_images_embedded, feats.n_forward, feats.images_per_s, feats.path)
        entries.append((name, feats.path, feats.missing_shards))
        cache[name] = {"images": len(images), "embedded": feats.n_images_embedded,
                       "cached": max(len(images) - feats.n_images_embedded, 0), "hit": feats.n_forward == 0,
                       "seconds": round(feats.seconds, 3)}
        skipped.update(feats.skipped)
        del feats
    return entries, sorted(skipped), cache


@contextlib.contextmanager
def recorded(out_dir: Path, **fields):
    """A job's bookkeeping around the block: ``out_dir/.lock`` held (a second job aimed at the
    folder fails at once), ``status.json`` saying ``running``, then ``done``, ``failed`` with the
    error or ``interrupted`` (Ctrl-C), with the wall-clock ``start`` and ``end`` and ``fields``
    (e.g. a sweep's extraction job adds its pid and host). Used by :func:`run` and by a sweep's
    panel-extraction jobs (:func:`.sweeps.run_extraction`)."""
    with _folder_lock(out_dir):
        if _read_status(out_dir) == "running":  # we hold the lock, so whoever wrote that is gone
            log.warning("%s: the previous run there was interrupted; running it again", out_dir)
        started = time.time()
        write_status(out_dir, "running", start=started, **fields)
        try:
            yield
        except KeyboardInterrupt as exc:
            write_status(out_dir, "interrupted", " ".join(str(exc).split()), start=started, end=time.time(),
                         **fields)
            raise
        except BaseException as exc:
            text = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc  # KeyError's str() quotes
            write_status(out_dir, "failed", f"{type(exc).__name__}: {' '.join(str(text).split())}",
                         start=started, end=time.time(), **fields)
            raise
        write_status(out_dir, "done", start=started, end=time.time(), **fields)


@contextlib.contextmanager
def _folder_lock(out_dir: Path):
    """``out_dir/.lock``, held for the block; a folder another live run holds is one line naming
    that run and the setting that picks another folder (no wait: two runs never share a folder)."""
    lock = FileLock(out_dir / ".lock", timeout=0)
    try:
        lock.acquire()
    except LockTimeout as busy:
        holder = busy.holder.describe() if busy.holder is not None else "another run"
        raise LockTimeout(f"run folder {out_dir} is in use by {holder}: two runs never share a folder; wait for "
                          "that run to finish (then the same command resumes), or run into another folder with "
                          f"hydra.run.dir=<folder>; if that process is gone, delete {out_dir / '.lock'}",
                          busy.holder) from None
    try:
        yield
    finally:
        lock.release()


def _read_status(out_dir: Path) -> str | None:
    try:
        return json.loads((out_dir / "status.json").read_text()).get("status")
    except (OSError, ValueError, AttributeError):
        return None


def write_status(out_dir: Path, status: str, error: str = "", start: float | None = None,
                 end: float | None = None, **fields) -> None:
    """``out_dir/status.json``: the job's status (running, done, failed, interrupted), its error,
    ``fields`` and wall-clock ``start`` / ``end`` (written by :func:`recorded`, and by a sweep
    for an extraction job whose process died before it could write its own)."""
    times = {k: v for k, v in (("start", start), ("end", end)) if v is not None}
    write_text_atomic(out_dir / "status.json",
                      json.dumps({"status": status, "error": error, **fields, **times}) + "\n")

def run_stage_on_entries(job: Plan, manifest: pd.DataFrame, entries, skipped: list[str],
                         out_dir: Path) -> list[pd.DataFrame]:
    """Run the stage on complete cache entries ``[(encoder, entry folder), ...]`` of one manifest,
    after dropping for every encoder the rows any encoder skipped (listed in ``skipped.csv``)."""
    from ..features.load import align_features, load_features  # lazy: imports torch

    if skipped:
        log.warning("%d unreadable images skipped for every encoder (listed in %s)", len(skipped),
                    out_dir / "skipped.csv")
        write_text_atomic(out_dir / "skipped.csv", pd.DataFrame({"sample_id": skipped}).to_csv(index=False))
        manifest = manifest[~manifest["sample_id"].isin(skipped)].reset_index(drop=True)
    summaries = []
    for name, entry in entries:
        ids, emb = load_features(entry)
        features = align_features(ids, emb, manifest, str(entry))
        del ids, emb  # the stage may overwrite the one copy held (Method.overwrites_features)
        summaries += _stage_results(job, features, manifest, out_dir, name, job.dataset, handed_over=True)
        del features
    return summaries


def run_planned(job: Plan, out_dir: Path) -> pd.DataFrame:
    """The work of planned job ``job`` (:func:`plan`) under ``out_dir`` (held by :func:`recorded`)."""
    write_text_atomic(out_dir / "config.yaml", job.config_yaml)
    if job.cli_overrides:
        write_text_atomic(out_dir / "overrides.yaml", redacted_yaml(OmegaConf.create(list(job.cli_overrides))))
    started = time.perf_counter()
    if job.features_file is not None:
        manifest = read_manifest_file(job)
        _check_scorable(job, manifest)
        # entries.json names the user's features, so a collect step can re-score them (CRoMa's panel k)
        _record_entries(out_dir, job, [(job.encoders[0], job.features_file, [])], {})
        summaries = _stage_results(job, str(job.features_file), manifest, out_dir, encoder=job.encoders[0],
                                   dataset=job.dataset)
    else:

        manifest = load_manifest(job)
        _check_scorable(job, manifest)  # before any image is read
        module = stages.get(job.stage)
        if hasattr(module, "run_job"):  # the stage drives the encoder itself (methods/__init__.py)
            summaries = module.run_job(job_context(job, manifest, out_dir))
            _tables_after_run(job, out_dir)
        else:
            entries, skipped, cache = _extract_panel(job, manifest)
            if job.extract.num_shards > 1:
                return _record_part(job, entries, out_dir)
            _record_entries(out_dir, job, entries, cache)
            summaries = run_stage_on_entries(job, manifest, [(n, e) for n, e, _ in entries], skipped, out_dir)
    summary = pd.concat(summaries, ignore_index=True)
    write_atomic(out_dir / "summary.parquet", lambda f: summary.to_parquet(f, index=False))
    table = console_table(summary, job.stage)
    write_text_atomic(out_dir / "summary.md", table)
    comparisons = build_comparisons(out_dir)  # two or more encoders: which one, and is the difference real
    seconds = time.perf_counter() - started
    report = _write_report(job, summary, out_dir, seconds)
    which = "".join(f"- {line}\n" for line in verdict(comparisons))
    print(f"\n{job.stage} on {job.dataset or job.features_file} ({seconds:.1f} s) -> {out_dir}\n\n{table}"
          + (f"\nWhich encoder (paired, {out_dir / 'comparisons.csv'}):\n{which}" if which else "")
          + f"\nreport: {report}")
    _refuse_all_blank(job.stage, summary)  # after the table, its reasons and the report are out
    return summary


#: at most this many "not scored" lines under the console table (all of them are in the report)
MAX_REASONS = 20


def _tables_after_run(job: Plan, out_dir: Path) -> None:
    """A stage whose method sets ``tables_after_run`` (SPAR) builds the experiment's
    ``report.tables`` at the end of a single run; a sweep's collect step builds them over every job."""
    tables = list(job.report.tables)
    if tables and not job.multirun and methods.method(job.stage).tables_after_run:
        build_tables(tables, SweepResults(out_dir, load_manifest=job_manifest), out_dir / "tables")


def console_table(summary: pd.DataFrame, stage: str) -> str:
    """The console's (and ``summary.md``'s) table: the stage's ``console_columns``, pooled
    rows only where they pool two or more matched groups, then one line per row the stage left
    blank, with its ``reason`` (:func:`.results.not_scored`)."""

    shown = without_single_group_pools(summary)
    columns = methods.method(stage).console_columns if stage in methods.names() else ()
    table = to_markdown(shown[[c for c in (columns or shown.columns) if c in shown.columns]])
    reasons = not_scored(summary)
    blank = without_interval(summary)
    if blank:
        table += (f"\nWithout an interval ({len(blank)} row{'s' if len(blank) != 1 else ''}):\n"
                  + "".join(f"- {line}\n" for line in blank[:MAX_REASONS]))
    if reasons:
        rows = f"{len(reasons)} row" + ("s" if len(reasons) != 1 else "")
        table += (f"\nNot scored ({rows}, blank above):\n"
                  + "".join(f"- {line}\n" for line in reasons[:MAX_REASONS])
                  + (f"- ... and {len(reasons) - MAX_REASONS} more (report.md, summary.parquet column reason)\n"
                     if len(reasons) > MAX_REASONS else ""))
    return table


def _check_scorable(job: Plan, manifest: pd.DataFrame) -> None:
    """The stage's ``check_manifest(manifest, findings, **params)`` (CANDOR: a k no matched group
    can satisfy) refuses a run whose every row would be blank, before any image is read."""

    check = getattr(stages.get(job.stage), "check_manifest", None)
    if check is not None:
        check(manifest, [str(f) for f in job.findings], **job.params)


def _refuse_all_blank(stage: str, summary: pd.DataFrame) -> None:
    """A run none of whose rows could be scored (every ``reason`` set and every headline metric
    blank) fails with one line naming the first row's reason, after the summary, its table and
    the report are written. A row with a reason that keeps some headline metrics is scored in
    part (CRoMa refused on a collapsed embedding, its RI and MaRI reported), so it does not fail."""
    if summary.empty or "reason" not in summary.columns:
        return
    reasons = summary["reason"].fillna("").astype(str)
    if (reasons == "").any():
        return
    headline = [m.name for m in methods.method(stage).headline] if stage in methods.names() else []
    kept = [c for c in headline if c in summary.columns]
    if kept and summary[kept].apply(pd.to_numeric, errors="coerce").notna().to_numpy().any():
        return
    first = summary.iloc[0]
    where = ", ".join(f"{c} '{first[c]}'" for c in ("encoder", "finding", "acq_group")
                      if c in summary.columns and pd.notna(first[c]))
    raise InvalidSetting(f"{stage}: none of the {len(summary)} result rows could be scored; {where}: "
                         f"{reasons.iloc[0]}; check stage.params and stage.findings")


def _write_report(job: Plan, summary: pd.DataFrame, out_dir: Path, seconds: float) -> Path:
    """``results_long.parquet``/``.csv`` (:mod:`.report.long_format`) and ``report.md`` /
    ``report.html`` (:mod:`.report.html`) of this run; returns the HTML path."""

    long = to_long(summary, job.stage, OmegaConf.create(job.config), out_dir.name)
    write_atomic(out_dir / "results_long.parquet", lambda f: long.to_parquet(f, index=False))
    write_text_atomic(out_dir / "results_long.csv", long.to_csv(index=False))
    return write_report(run_report(out_dir, job.config_yaml, long, seconds, experiment=job.experiment),
                        out_dir)[1]


def _record_entries(out_dir: Path, job: Plan, entries, cache: dict) -> None:
    """``entries.json``: the cache entry of every encoder of this job, so a sweep's collect step
    can re-score the same features (e.g. CRoMa's panel median-k) without re-extracting, and the
    feature-cache use of the extraction (the reports' "Feature cache" table)."""
    record = {"dataset": job.dataset, "stage": job.stage,
              "entries": [{"encoder": n, "entry": str(e), "cache": cache.get(n)} for n, e, _ in entries]}
    write_text_atomic(out_dir / "entries.json", json.dumps(record, indent=1) + "\n")


def _record_part(job: Plan, entries, out_dir: Path) -> pd.DataFrame:
    """A sharded-extraction job stops after its part: ``extracted.json`` names the cache
    entries; the sweep's collect step runs the stage once every part is in."""
    x = job.extract
    record = {"dataset": job.dataset, "stage": job.stage, "part": x.shard, "num_parts": x.num_shards,
              "entries": [{"encoder": n, "entry": str(e), "missing_shards": m} for n, e, m in entries]}
    write_text_atomic(out_dir / "extracted.json", json.dumps(record, indent=1) + "\n")
    for name, entry, missing in entries:
        print(f"{name}: part {x.shard} of {x.num_shards} extracted into {entry}; "
              + (f"{len(missing)} shards still missing (other parts)" if missing else "entry complete"))
    return pd.DataFrame()
