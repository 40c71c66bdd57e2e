"""What one Hydra job does: dataset → manifest → (per encoder) features → stage → results.

Kept apart from ``__main__`` so tests can compose a config and call :func:`plan` / :func:`run`.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from ..core.atomic import write_atomic, write_text_atomic
from ..core.errors import UserError
from ..core.redact import redact_config, redacted_yaml
from ..core.results import not_scored, to_markdown, without_single_group_pools
from ..data import manifest as mf

log = logging.getLogger("robustbench_fm")

#: Errors caused by the user's input (names, files, options): the CLI prints them as one line;
#: anything else is a bug and keeps its traceback (``debug=true`` shows it for these too).
USER_ERRORS = (UserError, KeyError, ValueError, FileNotFoundError, PermissionError)

#: Columns the console table shows for each stage (all columns are saved).
CONSOLE_COLUMNS = {
    "candor": ["encoder", "finding", "acq_group", "target", "n_queries", "bank_size", "d", "d_sd", "d_ci_low",
               "d_ci_high", "d_all", "margin_auroc"],
    "croma": ["encoder", "dataset", "finding", "bio_knn_bacc", "conf_knn_bacc", "ri", "mari", "croma", "f0",
              "ltm", "support", "k"],
    "retention": ["encoder", "dataset", "finding", "n", "retention", "retention_ci_low", "retention_ci_high",
                  "retention_std", "retention_control", "control_minus_box", "c"],
    "linear_head": ["encoder", "finding", "auroc", "auroc_ci_low", "auroc_ci_high", "threshold", "test_sensitivity",
                    "test_specificity", "n"],
    "mlp_head": ["encoder", "finding", "auroc", "auroc_ci_low", "auroc_ci_high", "threshold", "test_sensitivity",
                 "test_specificity", "n"],
    "error_detection": ["encoder", "finding", "stratum", "method", "auroc", "diff_vs_msp", "q_value", "n", "n_errors"],
    "candor_heads": ["encoder", "finding", "auroc", "d", "miss_discordant", "miss_other", "fpr_near", "fpr_far", "n"],
    "logme": ["encoder", "finding", "logme", "n"],
    "shortcut": ["encoder", "benchmark", "test_set", "apd", "nipd", "acc_balanced", "acc_confounded"],
}


@dataclass(frozen=True)
class Plan:
    """The resolved work of one job, checked before any heavy step starts."""

    dataset: str | None
    root: Path | None
    encoders: list[str]
    stage: str
    findings: list[str]
    features_file: Path | None

    def describe(self, cfg: DictConfig) -> str:
        """The plan in words, as ``dry_run=true`` prints it."""
        params = OmegaConf.to_container(cfg.stage.params, resolve=True)
        if self.features_file is not None:
            source = f"features {self.features_file}, manifest {cfg.manifest_file}"
        else:
            generated = "" if self.root.is_dir() else " (generated on the first run)"
            source = f"{self.dataset} at {self.root}{generated}"
        rows = [("data", source),
                ("encoders", f"{', '.join(self.encoders)} ({len(self.encoders)})" if self.encoders else "-"),
                ("stage", f"{self.stage} on {', '.join(self.findings)}"),
                ("params", ", ".join(f"{k}={v}" for k, v in params.items())),
                ("cache", str(cfg.paths.cache_dir)),
                ("device", str(cfg.device))]
        return "\n".join(["plan (dry_run=true: nothing was read, embedded or written):"]
                         + [f"  {k:9s}{v}" for k, v in rows])


def panel(cfg: DictConfig, cli_overrides: list[str] | None = None) -> list[str]:
    """The encoders of this job: an explicit ``encoder=`` override wins over a panel."""
    if cli_overrides and any(o.split("=")[0].lstrip("+~") == "encoder" for o in cli_overrides):
        return [cfg.encoder.name]
    return list(cfg.encoders) if cfg.get("encoders") else [cfg.encoder.name]


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
        raise UserError(f"{key} is not set: {hint}")


def _refuse_encoder_field(cfg: DictConfig, cli_overrides: list[str] | None) -> None:
    """``encoder.name=<x>`` does not choose the encoder (the group does, and only ``encoder=``
    overrides an experiment's panel): one line saying to use ``encoder=<x>``, with the registry's
    closest names when <x> is unknown."""
    if not any(o.split("=")[0].lstrip("+~") == "encoder.name" for o in cli_overrides or ()):
        return
    from .. import encoders

    name = str(cfg.encoder.name)
    try:
        encoders.get(name)
    except KeyError as exc:
        import difflib

        close = difflib.get_close_matches(name, encoders.names(), n=1)
        how = f" Choose it with encoder={close[0]}" if close else " and choose one with encoder=<name>"
        raise UserError(f"encoder.name={name}: {exc.args[0]}{how}, not encoder.name=") from None
    raise UserError(f"encoder.name={name} does not choose the encoder (the experiment's panel would run); "
                    f"use encoder={name}")


def plan(cfg: DictConfig, cli_overrides: list[str] | None = None) -> Plan:
    """Validate names and options (one-line errors) without touching data or models."""
    from .. import data, encoders
    from .. import methods as stages

    _require_settings(cfg)
    _refuse_encoder_field(cfg, cli_overrides)
    stage = stages.get(cfg.stage.name)
    findings = list(cfg.stage.findings)
    params = OmegaConf.to_container(cfg.stage.params, resolve=True)
    stages.check_param_types(cfg.stage.name, params)  # k=abc: one line naming the type, not a TypeError
    stage.check_params(**params)
    if cfg.get("features_file"):
        return Plan(None, None, [], cfg.stage.name, findings, Path(cfg.features_file))
    data.get(cfg.dataset.name)
    root = Path(cfg.dataset.root)
    if not root.is_dir() and not (cfg.dataset.get("generate") and data.get(cfg.dataset.name).generate):
        raise FileNotFoundError(f"dataset '{cfg.dataset.name}': root '{root}' does not exist; "
                                "set dataset.root=<folder holding the dataset>")
    shards, shard = int(cfg.extract.get("num_shards", 1)), int(cfg.extract.get("shard", 0))
    if shards > 1 and any(encoders.get(n).is_slide for n in panel(cfg, cli_overrides)):
        raise ValueError("extract.num_shards > 1 is for tile/image encoders; slide encoders read a complete "
                         "tile-encoder cache entry: extract the tiles sharded first, then run the slide panel")
    if shards < 1 or not 0 <= shard < shards:
        raise ValueError(f"extract.shard={shard} must be in [0, extract.num_shards={shards}); "
                         "sweep one job per part with extract.shard=range(N)")
    names = panel(cfg, cli_overrides)
    for name in names:
        encoders.get(name)
    return Plan(cfg.dataset.name, root, names, cfg.stage.name, findings, None)


def _stage_results(stage: str, features, manifest: pd.DataFrame, cfg: DictConfig, out: Path,
                   encoder: str, dataset: str) -> list[pd.DataFrame]:
    """Run ``stage`` for every finding and save ``results/<encoder>/<dataset>/<stage>/<finding>/``.

    A stage whose module sets ``MULTI_FINDING`` gets all findings in one call (CANDOR shares one
    similarity pass per matched group across them); its results are saved per finding alike.
    """
    from .. import methods as stages
    from ..api import evaluate
    from ..core.results import Results

    params = OmegaConf.to_container(cfg.stage.params, resolve=True)
    findings = [str(f) for f in cfg.stage.findings]
    if getattr(stages.get(stage), "MULTI_FINDING", False):
        res = evaluate(stage, features, manifest, finding=findings, **params)
        # rows pooled across findings (e.g. CANDOR's severity-weighted chest rate) keep their own name
        findings = findings + sorted(set(res.summary["finding"].astype(str)) - set(findings))
        parts = [(f, Results(summary=res.summary[res.summary["finding"] == f].reset_index(drop=True),
                             per_sample=None if res.per_sample is None else
                             res.per_sample[res.per_sample["finding"] == f].reset_index(drop=True),
                             params={**res.params, "finding": f})) for f in findings]
    else:
        parts = [(f, evaluate(stage, features, manifest, finding=f, **params)) for f in findings]
    summaries = []
    for finding, res in parts:
        res.summary.insert(0, "encoder", encoder)
        res.summary.insert(1, "dataset", dataset)
        res.save(out / "results" / encoder / dataset / stage / finding)
        summaries.append(res.summary)
    return summaries


def load_manifest(job: Plan, cfg: DictConfig) -> pd.DataFrame:
    """The dataset's canonical manifest (generated first for synthetic datasets), or the one in
    ``manifest_file`` (paths relative to ``dataset.root``); counts that differ from the dataset
    card's expected ones are logged as warnings."""
    from .. import data
    from ..data import cards

    if cfg.get("manifest_file"):  # e.g. the manifest scripts/prepare_dataset.py wrote beside its images
        manifest = mf.read(cfg.manifest_file, findings=job.findings)
        log.info("dataset %s: %d rows from %s, images under %s", job.dataset, len(manifest), cfg.manifest_file,
                 job.root)
        return manifest
    adapter = data.get(job.dataset)
    options = OmegaConf.to_container(cfg.dataset.get("options") or OmegaConf.create(), resolve=True)
    if cfg.dataset.get("generate") and adapter.generate is not None:
        from ..core.locking import FileLock

        # parallel sweep jobs share the generated folder: one writes it, the others wait
        with FileLock(job.root.parent / f".{job.root.name}.generate.lock", timeout=None):
            adapter.generate(job.root, **options)
    manifest = data.build_manifest(job.dataset, job.root, verify_images=cfg.dataset.verify_images,
                                   findings=job.findings, **options)
    log.info("dataset %s: %d rows from %s", job.dataset, len(manifest), job.root)
    card = cfg.dataset.get("card")
    if card:
        for warning in cards.check(manifest, OmegaConf.to_container(card, resolve=True), job.dataset):
            log.warning(warning)
    return manifest


def _extract_panel(job: Plan, cfg: DictConfig, manifest: pd.DataFrame) -> tuple[list, list[str], dict]:
    """Fill the feature cache for every encoder (only part ``extract.shard`` of
    ``extract.num_shards`` when sharded); returns (encoder, cache entry, missing shards) triples,
    the sample_ids any encoder had to skip (unreadable images under ``on_bad_image=skip``) and
    the cache use per encoder (images, embedded now, read from the cache, hit, seconds)."""
    from .. import encoders
    from ..features import extract

    entries, skipped, cache = [], set(), {}
    images = manifest.drop_duplicates("sample_id")  # paired designs list an image once per subset
    for name in job.encoders:
        enc_cfg = cfg.encoder if name == cfg.encoder.name else {}
        spec = encoders.get(name)
        if spec.is_slide:  # slide aggregators (croma_slides): tiles -> tile encoder -> slide embedding
            from ..features.slides import extract_slides

            path = extract_slides(name, images, job.root, cfg.paths.cache_dir, weights=enc_cfg.get("weights"),
                                  tile_weights=enc_cfg.get("tile_weights"), device=cfg.device,
                                  batch_size=enc_cfg.get("batch_size") or cfg.extract.batch_size,
                                  num_workers=cfg.extract.num_workers, shard_size=cfg.extract.shard_size,
                                  on_bad_image=cfg.extract.on_bad_image,
                                  allow_remote_code=cfg.security.allow_remote_code)
            entries.append((name, path, []))
            continue
        if enc_cfg.get("embedding") and enc_cfg.embedding != spec.embedding:  # e.g. the CLS vs patch-mean ablation
            spec = dataclasses.replace(spec, embedding=enc_cfg.embedding)
        encoder = encoders.load(spec, weights=enc_cfg.get("weights"), device=cfg.device,
                                allow_remote_code=cfg.security.allow_remote_code)
        feats = extract(encoder, images, job.root, cfg.paths.cache_dir,
                        batch_size=enc_cfg.get("batch_size") or cfg.extract.batch_size,
                        num_workers=cfg.extract.num_workers, shard_size=cfg.extract.shard_size,
                        on_bad_image=cfg.extract.on_bad_image, num_shards=cfg.extract.num_shards,
                        shard=cfg.extract.shard, read=False)
        if feats.n_images_embedded:  # a full cache hit is logged by the cache ("cache hit: N rows, ...")
            log.info("%s: %d images embedded, %d forward passes, %.1f images/s, cache %s", name,
                     feats.n_images_embedded, feats.n_forward, feats.images_per_s, feats.path)
        entries.append((name, feats.path, feats.missing_shards))
        cache[name] = {"images": len(images), "embedded": feats.n_images_embedded,
                       "cached": max(len(images) - feats.n_images_embedded, 0), "hit": feats.n_forward == 0,
                       "seconds": round(feats.seconds, 3)}
        skipped.update(feats.skipped)
        del encoder, feats
    return entries, sorted(skipped), cache


def run(cfg: DictConfig, out_dir: Path, cli_overrides: list[str] | None = None) -> pd.DataFrame:
    """Run the job, write everything under ``out_dir`` and return the combined summary.

    The output folder is locked for the run (a second run aimed at it fails at once). Rows that
    any encoder skipped are dropped for every encoder, so comparisons stay paired.
    ``status.json`` says ``running``, then ``done``, ``failed`` with the error (a bad option
    too) or ``interrupted`` (Ctrl-C), with the job's wall-clock ``start`` and ``end`` (a sweep's
    report takes its runtime from the earliest start to the last end); the collect step of a
    sweep lists the jobs that did not finish, and reports a ``running`` job whose process is
    gone as interrupted.
    """
    from ..core.locking import FileLock

    with FileLock(out_dir / ".lock", timeout=0):
        if _read_status(out_dir) == "running":  # we hold the lock, so whoever wrote that is gone
            log.warning("%s: the previous run there was interrupted; running it again", out_dir)
        started = time.time()
        _status(out_dir, "running", start=started)
        try:
            job = plan(cfg, cli_overrides)
            summary = _run(job, cfg, out_dir, cli_overrides)
        except KeyboardInterrupt as exc:
            _status(out_dir, "interrupted", " ".join(str(exc).split()), start=started, end=time.time())
            raise
        except BaseException as exc:
            text = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc  # KeyError's str() quotes
            _status(out_dir, "failed", f"{type(exc).__name__}: {' '.join(str(text).split())}", start=started,
                    end=time.time())
            raise
        _status(out_dir, "done", start=started, end=time.time())
        return summary


def _read_status(out_dir: Path) -> str | None:
    try:
        return json.loads((out_dir / "status.json").read_text()).get("status")
    except (OSError, ValueError, AttributeError):
        return None


def _status(out_dir: Path, status: str, error: str = "", start: float | None = None,
            end: float | None = None) -> None:
    times = {k: v for k, v in (("start", start), ("end", end)) if v is not None}
    write_text_atomic(out_dir / "status.json", json.dumps({"status": status, "error": error, **times}) + "\n")


def run_stage_on_entries(job: Plan, cfg: DictConfig, manifest: pd.DataFrame, entries, skipped: list[str],
                         out_dir: Path) -> list[pd.DataFrame]:
    """Run the stage on complete cache entries ``[(encoder, entry folder), ...]`` of one manifest,
    after dropping for every encoder the rows any encoder skipped (listed in ``skipped.csv``)."""
    from ..api import align_features
    from ..features import load_features

    if skipped:
        log.warning("%d unreadable images skipped for every encoder (listed in %s)", len(skipped),
                    out_dir / "skipped.csv")
        write_text_atomic(out_dir / "skipped.csv", pd.DataFrame({"sample_id": skipped}).to_csv(index=False))
        manifest = manifest[~manifest["sample_id"].isin(skipped)].reset_index(drop=True)
    summaries = []
    for name, entry in entries:
        ids, emb = load_features(entry)
        features = align_features(ids, emb, manifest, str(entry))
        summaries += _stage_results(job.stage, features, manifest, cfg, out_dir, name, job.dataset)
    return summaries


def _run(job: Plan, cfg: DictConfig, out_dir: Path, cli_overrides) -> pd.DataFrame:
    write_text_atomic(out_dir / "config.yaml", redacted_yaml(cfg))
    if cli_overrides:
        write_text_atomic(out_dir / "overrides.yaml", redacted_yaml(OmegaConf.create(cli_overrides)))
    started = time.perf_counter()
    if job.features_file is not None:
        manifest = mf.read(cfg.manifest_file, findings=job.findings)
        _check_scorable(job, cfg, manifest)
        summaries = _stage_results(job.stage, str(job.features_file), manifest, cfg, out_dir,
                                   encoder=job.features_file.stem, dataset=Path(cfg.manifest_file).stem)
    else:
        from .. import methods as stages

        manifest = load_manifest(job, cfg)
        _check_scorable(job, cfg, manifest)  # before any image is read
        module = stages.get(job.stage)
        if hasattr(module, "run_job"):  # the stage drives the encoder itself (stages/__init__.py)
            summaries = module.run_job(job, cfg, manifest, out_dir)
        else:
            entries, skipped, cache = _extract_panel(job, cfg, manifest)
            if cfg.extract.num_shards > 1:
                return _record_part(job, cfg, entries, out_dir)
            _record_entries(out_dir, job, entries, cache)
            summaries = run_stage_on_entries(job, cfg, manifest, [(n, e) for n, e, _ in entries], skipped,
                                             out_dir)
    summary = pd.concat(summaries, ignore_index=True)
    write_atomic(out_dir / "summary.parquet", lambda f: summary.to_parquet(f, index=False))
    table = console_table(summary, job.stage)
    write_text_atomic(out_dir / "summary.md", table)
    seconds = time.perf_counter() - started
    report = _write_report(job, cfg, summary, out_dir, seconds)
    print(f"\n{job.stage} on {job.dataset or job.features_file} ({seconds:.1f} s) -> {out_dir}\n\n{table}"
          f"\nreport: {report}")
    _refuse_all_blank(job.stage, summary)  # after the table, its reasons and the report are out
    return summary


#: at most this many "not scored" lines under the console table (all of them are in the report)
MAX_REASONS = 20


def console_table(summary: pd.DataFrame, stage: str) -> str:
    """The console's (and ``summary.md``'s) table: the stage's :data:`CONSOLE_COLUMNS`, pooled
    rows only where they pool two or more matched groups, then one line per row the stage left
    blank, with its ``reason`` (:func:`.results.not_scored`)."""
    shown = without_single_group_pools(summary)
    table = to_markdown(shown[[c for c in CONSOLE_COLUMNS.get(stage, shown.columns) if c in shown.columns]])
    reasons = not_scored(summary)
    if reasons:
        rows = f"{len(reasons)} row" + ("s" if len(reasons) != 1 else "")
        table += (f"\nNot scored ({rows}, blank above):\n"
                  + "".join(f"- {line}\n" for line in reasons[:MAX_REASONS])
                  + (f"- ... and {len(reasons) - MAX_REASONS} more (report.md, summary.parquet column reason)\n"
                     if len(reasons) > MAX_REASONS else ""))
    return table


def _check_scorable(job: Plan, cfg: DictConfig, manifest: pd.DataFrame) -> None:
    """The stage's ``check_manifest(manifest, findings, **params)`` (CANDOR: a k no matched group
    can satisfy) refuses a run whose every row would be blank, before any image is read."""
    from .. import methods as stages

    check = getattr(stages.get(job.stage), "check_manifest", None)
    if check is not None:
        check(manifest, [str(f) for f in job.findings], **OmegaConf.to_container(cfg.stage.params, resolve=True))


def _refuse_all_blank(stage: str, summary: pd.DataFrame) -> None:
    """A run none of whose rows could be scored (every ``reason`` set) fails with one line naming
    the first row's reason, after the summary, its table and the report are written."""
    if summary.empty or "reason" not in summary.columns:
        return
    reasons = summary["reason"].fillna("").astype(str)
    if (reasons == "").any():
        return
    first = summary.iloc[0]
    where = ", ".join(f"{c} '{first[c]}'" for c in ("encoder", "finding", "acq_group")
                      if c in summary.columns and pd.notna(first[c]))
    raise UserError(f"{stage}: none of the {len(summary)} result rows could be scored; {where}: {reasons.iloc[0]}; "
                    "check stage.params and stage.findings")


def _write_report(job: Plan, cfg: DictConfig, summary: pd.DataFrame, out_dir: Path, seconds: float) -> Path:
    """``results_long.parquet``/``.csv`` (:mod:`.report.long_format`) and ``report.md`` /
    ``report.html`` (:mod:`.report.html`) of this run; returns the HTML path."""
    from ..report.html import run_report, write_report
    from ..report.long_format import to_long

    long = to_long(summary, job.stage, OmegaConf.create(redact_config(cfg)), out_dir.name)
    write_atomic(out_dir / "results_long.parquet", lambda f: long.to_parquet(f, index=False))
    write_text_atomic(out_dir / "results_long.csv", long.to_csv(index=False))
    from hydra.core.hydra_config import HydraConfig

    experiment = HydraConfig.get().runtime.choices.get("experiment") if HydraConfig.initialized() else None
    return write_report(run_report(out_dir, redacted_yaml(cfg), long, seconds, experiment=experiment), out_dir)[1]


def _record_entries(out_dir: Path, job: Plan, entries, cache: dict) -> None:
    """``entries.json``: the cache entry of every encoder of this job, so a sweep's collect step
    can re-score the same features (e.g. CRoMa's panel median-k) without re-extracting, and the
    feature-cache use of the extraction (the reports' "Feature cache" table)."""
    record = {"dataset": job.dataset, "stage": job.stage,
              "entries": [{"encoder": n, "entry": str(e), "cache": cache.get(n)} for n, e, _ in entries]}
    write_text_atomic(out_dir / "entries.json", json.dumps(record, indent=1) + "\n")


def _record_part(job: Plan, cfg: DictConfig, entries, out_dir: Path) -> pd.DataFrame:
    """A sharded-extraction job stops after its part: ``extracted.json`` names the cache
    entries; the sweep's collect step runs the stage once every part is in."""
    record = {"dataset": job.dataset, "stage": job.stage, "part": cfg.extract.shard,
              "num_parts": cfg.extract.num_shards,
              "entries": [{"encoder": n, "entry": str(e), "missing_shards": m} for n, e, m in entries]}
    write_text_atomic(out_dir / "extracted.json", json.dumps(record, indent=1) + "\n")
    for name, entry, missing in entries:
        print(f"{name}: part {cfg.extract.shard} of {cfg.extract.num_shards} extracted into {entry}; "
              + (f"{len(missing)} shards still missing (other parts)" if missing else "entry complete"))
    return pd.DataFrame()
