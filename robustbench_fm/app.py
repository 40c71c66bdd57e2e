"""What one Hydra job does: dataset → manifest → (per encoder) features → stage → results.

Kept apart from ``__main__`` so tests can compose a config and call :func:`plan` / :func:`run`.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from . import manifest as mf
from .atomic import write_atomic, write_text_atomic
from .errors import UserError
from .redact import redacted_yaml
from .results import to_markdown

log = logging.getLogger("robustbench_fm")

#: Errors caused by the user's input (names, files, options): the CLI prints them as one line;
#: anything else is a bug and keeps its traceback (``debug=true`` shows it for these too).
USER_ERRORS = (UserError, KeyError, ValueError, FileNotFoundError, PermissionError)

#: Columns the console table shows for each stage (all columns are saved).
CONSOLE_COLUMNS = {
    "candor": ["encoder", "finding", "acq_group", "n_queries", "bank_size", "d", "d_sd", "d_ci_low",
               "d_ci_high", "d_all", "margin_auroc"],
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


def panel(cfg: DictConfig, cli_overrides: list[str] | None = None) -> list[str]:
    """The encoders of this job: an explicit ``encoder=`` override wins over a panel."""
    if cli_overrides and any(o.split("=")[0].lstrip("+~") == "encoder" for o in cli_overrides):
        return [cfg.encoder.name]
    return list(cfg.encoders) if cfg.get("encoders") else [cfg.encoder.name]


def plan(cfg: DictConfig, cli_overrides: list[str] | None = None) -> Plan:
    """Validate names and options (one-line errors) without touching data or models."""
    from . import data, encoders, stages

    stage = stages.get(cfg.stage.name)
    findings = list(cfg.stage.findings)
    stage.check_params(**OmegaConf.to_container(cfg.stage.params, resolve=True))
    if cfg.get("features_file"):
        return Plan(None, None, [], cfg.stage.name, findings, Path(cfg.features_file))
    data.get(cfg.dataset.name)
    root = Path(cfg.dataset.root)
    if not root.is_dir() and not (cfg.dataset.get("generate") and data.get(cfg.dataset.name).generate):
        raise FileNotFoundError(f"dataset '{cfg.dataset.name}': root '{root}' does not exist; "
                                "set dataset.root=<folder holding the dataset>")
    names = panel(cfg, cli_overrides)
    for name in names:
        encoders.get(name)
    return Plan(cfg.dataset.name, root, names, cfg.stage.name, findings, None)


def _stage_results(stage: str, features, manifest: pd.DataFrame, cfg: DictConfig, out: Path,
                   encoder: str, dataset: str) -> list[pd.DataFrame]:
    from .api import evaluate

    params = OmegaConf.to_container(cfg.stage.params, resolve=True)
    summaries = []
    for finding in cfg.stage.findings:
        res = evaluate(stage, features, manifest, finding=finding, **params)
        res.summary.insert(0, "encoder", encoder)
        res.summary.insert(1, "dataset", dataset)
        res.save(out / "results" / encoder / dataset / stage / str(finding))
        summaries.append(res.summary)
    return summaries


def _extract_panel(job: Plan, cfg: DictConfig, manifest: pd.DataFrame) -> tuple[list, list[str]]:
    """Fill the feature cache for every encoder; returns (encoder, cache entry) pairs and the
    sample_ids any encoder had to skip (unreadable images under ``on_bad_image=skip``)."""
    from . import encoders
    from .features import extract

    entries, skipped = [], set()
    for name in job.encoders:
        enc_cfg = cfg.encoder if name == cfg.encoder.name else {}
        encoder = encoders.load(name, weights=enc_cfg.get("weights"), device=cfg.device,
                                allow_remote_code=cfg.security.allow_remote_code)
        feats = extract(encoder, manifest, job.root, cfg.paths.cache_dir,
                        batch_size=enc_cfg.get("batch_size") or cfg.extract.batch_size,
                        num_workers=cfg.extract.num_workers, shard_size=cfg.extract.shard_size,
                        on_bad_image=cfg.extract.on_bad_image)
        log.info("%s: %d images embedded, %d forward passes, %.1f images/s, cache %s", name,
                 feats.n_images_embedded, feats.n_forward, feats.images_per_s, feats.path)
        entries.append((name, feats.path))
        skipped.update(feats.skipped)
        del encoder, feats
    return entries, sorted(skipped)


def run(cfg: DictConfig, out_dir: Path, cli_overrides: list[str] | None = None) -> pd.DataFrame:
    """Run the job, write everything under ``out_dir`` and return the combined summary.

    The output folder is locked for the run (a second run aimed at it fails at once). Rows that
    any encoder skipped are dropped for every encoder, so comparisons stay paired.
    """
    from .locks import FileLock

    job = plan(cfg, cli_overrides)
    with FileLock(out_dir / ".lock", timeout=0):
        return _run(job, cfg, out_dir, cli_overrides)


def _run(job: Plan, cfg: DictConfig, out_dir: Path, cli_overrides) -> pd.DataFrame:
    write_text_atomic(out_dir / "config.yaml", redacted_yaml(cfg))
    if cli_overrides:
        write_text_atomic(out_dir / "overrides.yaml", redacted_yaml(OmegaConf.create(cli_overrides)))
    started = time.perf_counter()
    summaries = []
    if job.features_file is not None:
        manifest = mf.read(cfg.manifest_file, findings=job.findings)
        summaries += _stage_results(job.stage, str(job.features_file), manifest, cfg, out_dir,
                                    encoder=job.features_file.stem, dataset=Path(cfg.manifest_file).stem)
    else:
        from . import data
        from .api import align_features
        from .features import load_features

        adapter = data.get(job.dataset)
        options = OmegaConf.to_container(cfg.dataset.get("options") or {}, resolve=True)
        if cfg.dataset.get("generate") and adapter.generate is not None:
            adapter.generate(job.root, **options)
        manifest = data.build_manifest(job.dataset, job.root, verify_images=cfg.dataset.verify_images,
                                       **options)
        log.info("dataset %s: %d rows from %s", job.dataset, len(manifest), job.root)
        entries, skipped = _extract_panel(job, cfg, manifest)
        if skipped:
            log.warning("%d unreadable images skipped for every encoder (listed in %s)", len(skipped),
                        out_dir / "skipped.csv")
            write_text_atomic(out_dir / "skipped.csv",
                              pd.DataFrame({"sample_id": skipped}).to_csv(index=False))
            manifest = manifest[~manifest["sample_id"].isin(skipped)].reset_index(drop=True)
        for name, entry in entries:
            ids, emb = load_features(entry)
            features = align_features(ids, emb, manifest, str(entry))
            summaries += _stage_results(job.stage, features, manifest, cfg, out_dir, name, job.dataset)
    summary = pd.concat(summaries, ignore_index=True)
    write_atomic(out_dir / "summary.parquet", lambda f: summary.to_parquet(f, index=False))
    shown = summary[[c for c in CONSOLE_COLUMNS.get(job.stage, summary.columns) if c in summary.columns]]
    table = to_markdown(shown)
    write_text_atomic(out_dir / "summary.md", table)
    print(f"\n{job.stage} on {job.dataset or job.features_file} "
          f"({time.perf_counter() - started:.1f} s) -> {out_dir}\n\n{table}")
    return summary
