"""Planning one job: its resolved config (a Hydra ``DictConfig``) -> :class:`Plan`.

:func:`plan` is the one place that reads a job's config (docs/architecture.md, "One run"). It
checks it once, without touching data or models (one-line errors naming the key), and returns the
job's typed run configuration, :class:`Plan`: what to read, which encoders with which of the
user's options, which stage with which parameters, where the caches are, how features are
extracted, what the report builds, and how the job runs (alone or as one job of a sweep, under
which experiment). The functions above :func:`plan` read the config for it; running the plan is
:mod:`.job`'s. Imports no Hydra and no torch.
"""
from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .. import data, encoders
from .. import methods as stages
from ..core.devices import check_device
from ..core.errors import InvalidSetting, MissingInput, UnknownName, message
from ..core.redact import redact_config
from ..data import cards, prepared
from ..data import manifest as mf
from ..data.csv_manifest import no_findings_reason
from ..encoders import generic
from ..encoders.options import EncoderOptions
from ..features.options import CONFIG_KEYS, DEFAULTS, ExtractOptions
from ..methods.params import StageParams, as_config

# ----------------------------------------------------------------------------- the typed plan

@dataclass(frozen=True)
class Paths:
    """Where the job's caches live: ``paths.cache_dir`` (the feature cache) and the store of
    images prepared at ``resolution`` (``paths.prepared_dir``, else ``prepared`` beside the
    feature cache: :func:`resolved_prepared_dir`)."""

    cache_dir: Path
    prepared_dir: Path


#: the options the user gave the job's ``encoder`` (one type with the Embedder's, torch-free)
EncoderSettings = EncoderOptions


@dataclass(frozen=True)
class ReportOptions:
    """What the report builds: the paper tables of ``report.tables``; ``scan``: whether a single run
    also scans the manifest's columns (``report.scan``: auto = True, false = False; :func:`.job.scan`)."""

    tables: tuple[str, ...] = ()
    scan: bool = False


@dataclass(frozen=True)
class Plan:
    """The typed run configuration of one job, built once from the resolved config (:func:`plan`)
    and checked before any heavy step starts; everything after :func:`plan` reads it, not the config.

    ``dataset``: the dataset name (with ``features_file``: the name of the user's data, see
    :func:`features_names`); ``encoders``: the panel (with ``features_file``: the feature set's
    name); ``multirun``: one job of a sweep or of an experiment run as a unit (its paper tables
    wait for the collect step); ``experiment``: the experiment's name for the report.
    ``params``: the stage's parameters, the typed object its parameter class parsed from the
    config (:class:`robustbench_fm.methods.params.StageParams`, checked once here and handed to the
    stage as it is; a mapping for a stage without a parameter class; ``param_overrides``: parameter
    -> the top-level key that sets it, for error messages); ``manifest_file``: a manifest to read instead of the
    dataset's (``dataset_options``, ``generate``, ``verify_images``, ``card``: how the dataset's is
    built); ``fixed_sample`` and ``seed``: the fixed draw of :func:`.job.load_manifest`;
    ``swept_encoders``: the panel a ``-m`` sweep fans out (``encoders``); ``encoder``: the user's
    options of the chosen encoder; ``config``: the resolved config, secrets masked, as
    ``config.yaml`` holds it (its hash keys the results; ``encoders``: the encoders that ran, or the panel a
    sweep's job belongs to); ``cli_overrides``: the command line's
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
    params: StageParams | dict = field(default_factory=dict)
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
                ("params", ", ".join(f"{k}={v}" for k, v in as_config(self.params).items())),
                ("images", "native (the files as shipped)" if self.resolution is None else
                 f"stored at {self.resolution} x {self.resolution} px once in {self.paths.prepared_dir}, then "
                 "each encoder's own resize (resolution=native reads the files as shipped)"),
                ("cache", str(self.paths.cache_dir)),
                ("device", self.extract.device)]
        return "\n".join(["plan (dry_run=true: nothing was read, embedded or written):"]
                         + [f"  {k:9s}{v}" for k, v in rows])

    def without_experiment_notes(self) -> Plan:
        """This plan without its experiment's ``report.notes`` (in the report and in ``config.yaml``):
        for a run that replaced the default experiment's data or stage, about which they were written."""
        report = self.config.get("report")
        if not isinstance(report, dict) or not report.get("notes"):
            return self
        return dataclasses.replace(self, config={**self.config, "report": {**report, "notes": []}})

    @property
    def config_yaml(self) -> str:
        """``config.yaml``: :attr:`config` as YAML (the text ``redacted_yaml`` of the config gives)."""
        return OmegaConf.to_yaml(OmegaConf.create(self.config))


# ------------------------------------------------- reading the config (called by plan() only)

def panel(cfg: DictConfig, cli_overrides: list[str] | None = None) -> list[str]:
    """The encoders of this job: an explicit ``encoder=`` override wins over a panel. A generic
    entry (``encoder=timm|hf|open_clip encoder.model=...``) is named by its resolved spec
    (:func:`generic_entry`)."""
    return [_resolved_name(cfg, n) for n in panel_entries(cfg, cli_overrides)]


def panel_entries(cfg: DictConfig, cli_overrides: list[str] | None = None) -> list[str]:
    """The encoder entries of this job as the config names them (:func:`panel` before a generic
    entry is resolved): what ``config.yaml`` records as ``encoders``, so that the saved config
    names the encoders that ran and plans the same panel again."""
    if cli_overrides and any(o.split("=")[0].lstrip("+~") == "encoder" for o in cli_overrides):
        return [str(cfg.encoder.name)]
    return [str(n) for n in cfg.encoders] if cfg.get("encoders") else [str(cfg.encoder.name)]


def _refuse_repeated_encoders(names: list[str], entries: list[str]) -> None:
    """A panel that names an encoder twice (``encoders=[a,a]``): one line naming ``encoders`` and the
    panel with each encoder once, before any data is read (the extraction would refuse it only
    after reading the manifest)."""
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        once = list(dict.fromkeys(entries))
        raise InvalidSetting(f"encoders=[{','.join(entries)}] names {', '.join(repeated)} more than once; list each "
                             f"encoder once: encoders=[{','.join(once)}]")


def _typed_keys(text: str, param_overrides: dict[str, str]) -> str:
    """A stage-parameter error as the user typed it: ``stage.params.seed=abc`` becomes ``seed=abc``
    where ``stage.params.seed`` takes its value from the top-level ``seed`` (:func:`_param_overrides`)."""
    for param, key in param_overrides.items():
        text = text.replace(f"stage.params.{param}=", f"{key}=")
    return text


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
    from ..features.entry import is_entry  # the entry format's one reader of meta.json (torch-free)

    p = Path(str(path))
    if p.is_dir() and is_entry(p):
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
    """The run's extraction options (:class:`robustbench_fm.features.options.ExtractOptions`): each
    field read from its config key (:data:`~robustbench_fm.features.options.CONFIG_KEYS`: ``extract.*``,
    ``device``, ``security.allow_remote_code``, ``cache.on_version_change``; a key the config lacks
    keeps the option's default) and checked by the options, an error naming the key. ``here``: the
    job runs in this process, so a CUDA device must be here
    (:func:`robustbench_fm.core.devices.check_device`)."""
    given = {name: OmegaConf.select(cfg, key, default=getattr(DEFAULTS, name)) for name, key in CONFIG_KEYS.items()}
    given["device"] = check_device(str(given["device"])) if here else str(given["device"])
    given["allow_remote_code"] = bool(given["allow_remote_code"])
    for name in ("on_bad_image", "on_version_change", "decode", "duplicates"):
        given[name] = str(given[name])
    return ExtractOptions.named(CONFIG_KEYS.__getitem__, **given)


#: the keys of the ``stage`` node (:func:`robustbench_fm.pipeline.configstore.stage_node`); its ``params``
#: are checked by the stage's parameter class (:func:`robustbench_fm.methods.check`)
STAGE_KEYS = ("name", "findings", "params")
#: the keys an ``encoder`` node may hold: a registry entry's and a generic entry's (``model``,
#: ``pretrained``; robustbench_fm/pipeline/configstore.py) and the options :class:`EncoderSettings` reads
ENCODER_KEYS = ("name", "model", "pretrained", "weights", "tile_weights", "embedding", "batch_size")


def _leaves(node, prefix: str) -> list[str]:
    if OmegaConf.is_dict(node) and len(node):
        return [p for k in node for p in _leaves(node._get_node(k), f"{prefix}.{k}")]
    return [prefix]


@functools.lru_cache(maxsize=1)
def _shipped_keys() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``extract``'s keys in the shipped ``configs/config.yaml`` and every key of the shipped
    dataset cards: read once per process (the shipped files do not change under a running process;
    an experiment's dry run plans each of its jobs and paid ~30 YAML parses per job otherwise)."""
    extract_keys = tuple(str(k) for k in OmegaConf.load(cards.CONFIG_DIR / "config.yaml").extract.keys())
    dataset_keys = tuple(sorted({str(k) for card in (cards.CONFIG_DIR / "dataset").glob("*.yaml")
                                 for k in (OmegaConf.load(card) or {})}))
    return extract_keys, dataset_keys


def _refuse_unknown_keys(cfg: DictConfig) -> None:
    """A key under ``stage``, ``extract``, ``encoder`` or ``dataset.options`` that nothing reads
    (``+stage.parms.k=3``, the fix Hydra itself prints for a typo, adds one and the run would
    use the default): one line naming it and the closest real key. ``stage.params`` are checked
    by the stage (:func:`robustbench_fm.methods.check`), ``dataset.options`` by the adapter's
    signature (:func:`robustbench_fm.data.registry.check_options`); ``extract``'s keys are those
    of the shipped ``configs/config.yaml``, ``dataset``'s those of the shipped dataset cards."""
    import difflib

    extract_keys, dataset_keys = _shipped_keys()
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


# ------------------------------------------------------- the plan: the one reader of the config

def _scan_option(cfg: DictConfig) -> bool:
    """``report.scan``: ``auto`` (or absent: a config of an earlier release) is True, ``false`` False."""
    value = OmegaConf.select(cfg, "report.scan", default="auto")
    if value in ("auto", True):
        return True
    if value is False or value == "false":
        return False
    raise InvalidSetting(f"report.scan={value!r} is not auto or false; set report.scan=auto (scan the manifest's "
                         "columns after the stage) or report.scan=false")


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
    if not findings and not cfg.get("features_file") and not stages.method(cfg.stage.name).findings_optional:
        _refuse_no_findings(cfg)
    params = OmegaConf.to_container(cfg.stage.params, resolve=True)
    param_overrides = _param_overrides(cfg)
    try:  # names, types (k=abc: one line naming the type) and values, once: the object the stage receives
        typed = stages.check(cfg.stage.name, params)
    except InvalidSetting as exc:  # seed=abc names seed, the key typed, not stage.params.seed
        raise InvalidSetting(_typed_keys(message(exc), param_overrides)) from None
    if typed is not None:
        params = typed
    common = dict(multirun=multirun, experiment=experiment, params=params, param_overrides=param_overrides,
                  seed=int(cfg.seed) if cfg.get("seed") is not None else None,
                  manifest_file=Path(str(cfg.manifest_file)) if cfg.get("manifest_file") else None,
                  swept_encoders=tuple(str(e) for e in (cfg.get("encoders") or [])),
                  report=ReportOptions(tuple(str(t) for t in (OmegaConf.select(cfg, "report.tables", default=None)
                                                              or [])), _scan_option(cfg)),
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
    _refuse_repeated_encoders(names, panel_entries(cfg, cli_overrides))
    for name in names:
        spec = encoders.get(name)
        if here:  # a job that will run in this process: a hub-code entry is refused before any data is read
            encoders.check_remote_code(spec, extract.allow_remote_code)  # (a collect step's re-plan extracts none)
    card = cfg.dataset.get("card")
    config = _config_record(cfg)
    if not multirun:  # config.yaml names the encoders that ran (encoder= replaces the experiment's panel); a
        config["encoders"] = panel_entries(cfg, cli_overrides)  # sweep's job keeps the panel it fans out
    return Plan(cfg.dataset.name, root, names, cfg.stage.name, findings, None, resolution(cfg),
                dataset_options=_dataset_options(cfg), generate=generate,
                verify_images=bool(cfg.dataset.get("verify_images", True)),
                card=OmegaConf.to_container(card, resolve=True) if card else None,
                fixed_sample=fixed_sample_size(cfg), encoder=_encoder_settings(cfg), config=config,
                **common)
