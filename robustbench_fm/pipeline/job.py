"""Running one job: a :class:`.plan.Plan` -> manifest -> (per encoder) features -> stage -> results -> report.

The pipeline below the command line (docs/architecture.md, "One run"). :func:`.plan.plan` reads
the job's config once into a :class:`~.plan.Plan`; every step here (manifest, extraction
service, stage, results, report) takes the Plan, never the config: :func:`run_planned` does the
work. The entry points :func:`run` (a config in: :func:`.plan.plan`, then :func:`run_planned`)
and :func:`job_manifest` (a finished job's manifest, for a sweep's collect step) are the only
functions here that take a config, and they hand it to :func:`.plan.plan`. The command line
(:mod:`robustbench_fm.cli`) parses, composes the config with Hydra and prints; a sweep's or an
experiment's jobs come here one by one (:mod:`.experiment`). Imports no Hydra.
"""
from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

if TYPE_CHECKING:  # the feature engine imports torch: a plan, a dry run and its one-line errors do not
    from ..features.embed import Embedder
    from ..methods.job import JobContext

from .. import data, encoders, methods
from .. import methods as stages
from ..core.atomic import write_atomic, write_text_atomic
from ..core.errors import InvalidSetting, UserError, message
from ..core.locking import FileLock, LockTimeout
from ..core.redact import redacted_yaml
from ..core.results import not_scored, to_markdown, without_interval, without_single_group_pools
from ..core.tables import SweepResults
from ..data import cards
from ..data import manifest as mf
from ..data.sample import fixed_sample
from ..encoders.options import EncoderOptions
from ..features.store import apply_duplicates
from ..methods.params import as_config, with_params
from ..methods.run import score_and_save
from ..report.comparisons import build as build_comparisons
from ..report.comparisons import verdict
from ..report.html import run_report, write_report
from ..report.long_format import config_hash, to_long
from ..report.neighbours import FROM_FEATURES
from ..report.tables import build_tables
from .plan import Plan, label_columns, plan

log = logging.getLogger("robustbench_fm")

#: Errors caused by the user's input (names, files, options, an unreadable folder): the CLI prints
#: them as one line; anything else is a bug: one line saying so, the traceback in the log file
#: (``debug=true`` shows it on the console too).
USER_ERRORS = (UserError, PermissionError)


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

    with recorded(out_dir) as record:
        job = record.claim(plan(cfg, cli_overrides, multirun=multirun, experiment=experiment))
        return run_planned(job, out_dir)


def job_manifest(cfg: DictConfig) -> pd.DataFrame:
    """The manifest of the job whose resolved config is ``cfg`` (a sweep's collect step re-scores
    cached features with it: :meth:`robustbench_fm.core.tables.SweepResults.manifest`): the
    :func:`load_manifest` of its :func:`plan`; a bring-your-own-features job's is its
    ``manifest_file``."""
    return load_manifest(plan(cfg, here=False))


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
    the remote-code policy: :class:`robustbench_fm.features.options.ExtractOptions`, handed over
    unchanged), the feature cache folder, the options the user gave the chosen
    encoder (``encoder.weights``, ...) and the ``resolution`` every image is stored at first (in
    ``paths.prepared_dir``)."""
    from ..features.embed import Embedder  # lazy: imports torch

    name, options = encoder_options(job)
    return Embedder(job.paths.cache_dir, job.extract, options={name: options}, resolution=job.resolution,
                    prepared_dir=job.paths.prepared_dir)


def encoder_options(job: Plan) -> tuple[str, EncoderOptions]:
    """``(name, EncoderOptions)`` of the job's ``encoder``: the options the user gave it (weights,
    embedding, batch size); a generic entry is named by its resolved spec (:func:`generic_entry`)."""
    return job.encoder.name, job.encoder


def job_context(job: Plan, manifest: pd.DataFrame, out_dir: Path) -> JobContext:
    """What a ``run_job`` stage receives (:class:`robustbench_fm.methods.job.JobContext`)."""
    from ..methods.job import JobContext  # lazy: imports torch

    return JobContext(stage=job.stage, dataset=job.dataset, root=job.root, encoders=list(job.encoders),
                      findings=[str(f) for f in job.findings], params=job.params, manifest=manifest,
                      out_dir=Path(out_dir), embedder=embedder(job), seed=int(job.seed),
                      dataset_options=job.dataset_options, verify_images=job.verify_images,
                      overrides=dict(job.param_overrides), sweep_first=sweep_first(job))


def sweep_first(job: Plan) -> bool:
    """False in a multirun job whose encoder is not the first of the swept panel (``encoders``,
    what ``-m`` fans out: ``robustbench_fm.pipeline.resolvers.sweep_values``); True otherwise."""
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
    manifest = _duplicates(job, _full_manifest(job))
    per_class = job.fixed_sample
    if per_class is None:
        return manifest
    group_col = str(as_config(job.params).get("group_col") or "acq_group")
    sampled = fixed_sample(manifest, [str(f) for f in job.findings], per_class, seed=int(job.seed),
                           group_col=group_col)
    log.info("fixed_sample=%d: %d of %d images (at most %d positives and %d negatives per %s and finding)",
             int(per_class), len(sampled), len(manifest), int(per_class), int(per_class), group_col)
    return sampled


def _duplicates(job: Plan, manifest: pd.DataFrame) -> pd.DataFrame:
    """``extract.duplicates`` applied to the manifest's images (an image listed under two sample_ids:
    refused, dropped or kept, :func:`robustbench_fm.features.store.apply_duplicates`); a slide job
    embeds tiles, not its rows' files, a run from a features file embeds nothing (its encoders are the
    features' names), and a plan built by hand without extraction options is left as it is."""
    if job.extract is None or job.paths is None or job.features_file is not None \
            or any(encoders.get(n).is_slide for n in job.encoders):
        return manifest
    source = job.manifest_file or job.dataset_options.get("manifest") or f"dataset {job.dataset}"
    return apply_duplicates(manifest, job.root, job.paths.cache_dir, job.extract.duplicates, str(source))


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


def extract_panel(job: Plan, manifest: pd.DataFrame,
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


class RunFolderTaken(InvalidSetting):
    """The run folder holds the outputs of another run (:func:`folder_conflict`): nothing of it is
    changed; the message names the folder, what differs and ``hydra.run.dir``."""


#: settings a run resumed in its folder may change: where the caches are, how fast it runs and what
#: it prints; never what it computes (:func:`folder_conflict`)
RESUME_FREE = ("paths", "hydra", "debug", "dry_run", "extract.batch_size", "extract.num_workers",
               "encoder.batch_size", "report.notes")


def _flat(node, prefix: str = "") -> dict:
    if isinstance(node, dict) and node:
        return {k: v for key, value in node.items() for k, v in _flat(value, f"{prefix}{key}.").items()}
    return {prefix[:-1]: node}


def _settings(config: dict) -> dict:
    """``config`` as dotted keys, without :data:`RESUME_FREE` and ``encoders`` (compared as the
    encoders that ran)."""
    return {k: v for k, v in _flat(config).items()
            if k != "encoders" and not any(k == f or k.startswith(f + ".") for f in RESUME_FREE)}


def _shown(value) -> str:
    text = "[" + ",".join(map(str, value)) + "]" if isinstance(value, list) else str(value)
    return text if len(text) <= 60 else text[:59] + "…"


def folder_conflict(out_dir: Path, job: Plan, status: str | None = None) -> str | None:
    """What makes the run that ``out_dir`` holds another run than ``job``, as one clause (its config
    hash, then the first settings that differ), or None: an empty folder, or the same run
    (resumed: only :data:`RESUME_FREE` settings may differ). The held run is its ``config.yaml``
    and the encoders its ``status.json`` (``status``: its text, where this run has written its own since)
    or, written before that, its ``entries.json`` names."""
    try:
        held = OmegaConf.to_container(OmegaConf.load(out_dir / "config.yaml"), resolve=False)
    except (OSError, ValueError, OmegaConfBaseException):
        return None  # no run wrote its config there (a fresh folder, a plan that failed)
    if not isinstance(held, dict):
        return None
    before, now = _settings(held), _settings(job.config)
    # a setting one of the two configs lacks (added or removed by another release) is not compared
    differ = [k for k in before if k in now and before[k] != now[k]]
    ran = _held_encoders(out_dir, status)
    if ran is not None and ran != list(job.encoders):
        differ = ["encoders", *(k for k in differ if k != "encoder.name")]  # the encoder chosen: in encoders
        before["encoders"], now["encoders"] = ran, list(job.encoders)
    if not differ:
        return None
    shown = "; ".join(f"{k} {_shown(before[k])} there, {_shown(now[k])} here" for k in differ[:3])
    more = f"; {len(differ) - 3} more settings differ" if len(differ) > 3 else ""
    hashes = (config_hash(held), config_hash(job.config))
    which = f"config hash {hashes[0]} there, {hashes[1]} here: " if hashes[0] != hashes[1] else ""
    return which + shown + more


def _held_encoders(out_dir: Path, status: str | None = None) -> list[str] | None:
    """The encoders of the run ``out_dir`` holds: its ``status.json``'s ``encoders`` (``status``: that
    file's text), else (a folder written before status.json named them) its ``entries.json``'s; None
    when neither says."""
    try:
        named = json.loads(status if status is not None else (out_dir / "status.json").read_text()).get("encoders")
        if isinstance(named, list):
            return [str(n) for n in named]
    except (OSError, ValueError, AttributeError):
        pass
    try:
        return [str(e["encoder"]) for e in json.loads((out_dir / "entries.json").read_text())["entries"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


class _Record:
    """What :func:`recorded` yields: :meth:`claim` checks that the folder holds no other run before
    the job writes anything there."""

    def __init__(self, out_dir: Path, before: str | None, started: float, fields: dict):
        self.out_dir, self.before, self.started, self.fields = out_dir, before, started, fields
        self.claimed, self.job = False, None

    def claim(self, job: Plan) -> Plan:
        """``job`` may write into the folder: it is empty or holds the same run (resumed); else
        :class:`RunFolderTaken`, one line naming the folder, what differs and ``hydra.run.dir``
        (the folder, its ``status.json`` included, is left as it was). Returns ``job``."""
        conflict = folder_conflict(self.out_dir, job, self.before or "{}")
        if conflict is not None:
            raise RunFolderTaken(
                f"run folder {self.out_dir} holds another run ({conflict}); run this one into another folder "
                f"with hydra.run.dir=<folder>, or delete {self.out_dir} to replace that run")
        self.fields = {**self.fields, "encoders": list(job.encoders)}
        self.claimed, self.job = True, job
        with _naming_full_disk(job, self.out_dir):
            write_status(self.out_dir, "running", start=self.started, **self.fields)
        return job


@contextlib.contextmanager
def recorded(out_dir: Path, **fields):
    """A job's bookkeeping around the block: ``out_dir/.lock`` held (a second job aimed at the
    folder fails at once), ``status.json`` saying ``running``, then ``done``, ``failed`` with the
    error or ``interrupted`` (Ctrl-C), with the wall-clock ``start`` and ``end`` and ``fields``
    (e.g. a sweep's extraction job adds its pid and host). Used by :func:`run` and by a sweep's
    panel-extraction jobs (:func:`.sweeps.run_extraction`).

    Yields a record whose ``claim(plan)`` refuses a folder that holds another run
    (:func:`folder_conflict`) and adds the plan's encoders to ``status.json``. A folder that held a
    finished run keeps its ``status.json`` when the block fails before its claim (a refused folder,
    a plan with a bad option): nothing of that run was changed."""
    with _folder_lock(out_dir):
        before = _status_text(out_dir)
        previous = _read_status(out_dir)
        if previous == "running":  # we hold the lock, so whoever wrote that is gone
            log.warning("%s: the previous run there was interrupted; running it again", out_dir)
        started = time.time()
        record = _Record(out_dir, before, started, fields)
        try:
            write_status(out_dir, "running", start=started, **fields)
        except OSError as exc:  # a full disk: the claim writes it again, naming the folder's setting
            if exc.errno not in FULL_DISK:
                raise
        try:
            yield record
        except BaseException as exc:
            if not record.claimed and (previous == "done" or isinstance(exc, RunFolderTaken)):
                _restore_status(out_dir, before)  # the record of the run the folder holds, as it was
                raise
            text = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc  # KeyError's str() quotes
            interrupted = isinstance(exc, KeyboardInterrupt)
            try:
                write_status(out_dir, "interrupted" if interrupted else "failed",
                             " ".join(str(exc).split()) if interrupted else
                             f"{type(exc).__name__}: {' '.join(str(text).split())}",
                             start=started, end=time.time(), **record.fields)
            except OSError as unwritten:  # a full disk: the error the run met is the one to tell
                log.debug("%s: status.json not updated (%s)", out_dir, unwritten)
            raise
        try:
            write_status(out_dir, "done", start=started, end=time.time(), **record.fields)
        except OSError as exc:
            if exc.errno not in FULL_DISK or record.job is None:
                raise
            raise disk_full(exc, record.job, out_dir) from exc


def _restore_status(out_dir: Path, text: str | None) -> None:
    try:
        if text is None:
            (out_dir / "status.json").unlink(missing_ok=True)
        else:
            write_text_atomic(out_dir / "status.json", text)
    except OSError as exc:  # a full disk: the error being raised is the one to tell
        log.debug("%s: status.json not restored (%s)", out_dir, exc)


def _status_text(out_dir: Path) -> str | None:
    try:
        return (out_dir / "status.json").read_text()
    except (OSError, UnicodeDecodeError):
        return None


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


class DiskFull(UserError):
    """A write of the run failed for want of room (``ENOSPC``, ``EDQUOT``): the message names the
    folder whose disk is full and the setting that moves it (:func:`disk_full`)."""


#: the errors of a write on a full disk: no space left on the device, disk quota exceeded
FULL_DISK = (errno.ENOSPC, errno.EDQUOT)
#: with no file named by the error, a folder whose disk has less room than this is the full one
FULL_BELOW_BYTES = 16 << 20


def run_folders(out_dir: Path, output_root, cache_dir, prepared_dir, generated=None) -> list[tuple[Path, str, str]]:
    """The folders a run writes, the most specific first, each as (folder, what it is, the setting
    that moves it): the prepared-image store, the feature cache, a generated dataset's folder
    (``generated``), the run folder (``paths.output_root`` when it lies under it, else ``hydra.run.dir``)."""
    inside = output_root is not None and Path(out_dir).resolve().is_relative_to(Path(str(output_root)).resolve())
    folders = [(Path(str(f)), what, key) for f, what, key in (
        (prepared_dir, "the prepared-image store", "paths.prepared_dir"),
        (cache_dir, "the feature cache", "paths.cache_dir")) if f is not None]
    if generated is not None:
        folders.append((Path(str(generated)), "the generated dataset", "dataset.root"))
    return [*folders, (Path(out_dir), "the run folder", "paths.output_root" if inside else "hydra.run.dir")]


def _folders(job: Plan, out_dir: Path) -> list[tuple[Path, str, str]]:
    paths = job.paths
    return run_folders(out_dir, (job.config.get("paths") or {}).get("output_root"), paths and paths.cache_dir,
                       paths and paths.prepared_dir, job.root if job.generate else None)


def _room(folder: Path) -> int | None:
    """Free bytes on the disk of ``folder`` (of its nearest existing parent); None if unknown."""
    for path in (Path(folder), *Path(folder).parents):
        if path.exists():
            try:
                return shutil.disk_usage(path).free
            except OSError:
                return None
    return None


def disk_full(exc: OSError, job: Plan, out_dir: Path, writing: str = "the run folder") -> DiskFull:
    """:func:`full_disk_line` of the folders job ``job`` writes, as a :class:`DiskFull`."""
    return DiskFull(full_disk_line(exc, _folders(job, out_dir), writing))


def full_disk_line(exc: OSError, folders: list[tuple[Path, str, str]], writing: str = "the run folder") -> str:
    """The one line of a write refused for want of room (``exc``: ``ENOSPC`` or ``EDQUOT``): which of
    ``folders`` (:func:`run_folders`) has the full disk (the one holding the file the error names;
    else one whose disk has under :data:`FULL_BELOW_BYTES` free; else the one being written,
    ``writing``), the setting that moves it, and that nothing written before is lost (every file is
    written whole or not at all, :mod:`robustbench_fm.core.atomic`: finished cache shards stay and
    the same command resumes)."""
    named = [Path(os.fsdecode(n)) for n in (exc.filename, exc.filename2) if n]
    full = next((f for n in named for f in folders if n.resolve().is_relative_to(Path(f[0]).resolve())), None)
    if full is None:
        short = [f for f in folders if (_room(f[0]) or FULL_BELOW_BYTES) < FULL_BELOW_BYTES]
        full = next((f for f in short if f[1] == writing), short[0] if short else None)
    if full is None:
        full = next((f for f in folders if f[1] == writing), folders[-1])
    folder, what, key = full
    reason = " ".join((exc.strerror or str(exc)).split())
    return (f"no space left on the disk of {folder} ({what}: {reason}); free space there or move it with "
            f"{key}=<a folder on a disk with room>; nothing written before is lost (finished feature-cache shards "
            "are kept and the same command resumes)")


@contextlib.contextmanager
def _naming_full_disk(job: Plan, out_dir: Path, writing: str = "the run folder"):
    """A full disk inside the block is :func:`disk_full`'s one line (``writing``: what the block writes)."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in FULL_DISK:
            raise
        raise disk_full(exc, job, out_dir, writing) from exc


#: the stage a single run's ``report.scan`` adds after its own (:func:`scan`)
SCAN = "confounders"


def scan(job: Plan, manifest: pd.DataFrame, sources, skipped: list[str], out_dir: Path) -> pd.DataFrame | None:
    """The confounder scan of a single run (``report.scan: auto``, :class:`.plan.ReportOptions`):
    stage ``confounders`` with its default parameters (the run's ``seed`` and ``device``) on the
    features of every ``(encoder, cache entry or features file)`` of ``sources``, read again from
    the cache (the stage may have overwritten its copy), over ``manifest`` less the ``skipped``
    rows; its results are saved as a stage's (:func:`score_and_save`). None where it does not
    apply: a sweep's job (a sweep scans as one of its stages), the scan itself, a stage that drives
    its encoder (``run_job``), or a manifest with no column besides the findings to scan; a scan the
    manifest cannot satisfy (k more images than it has) is left out with one logged line, after the
    stage's own results are saved."""
    if not job.report.scan or job.multirun or job.stage == SCAN or not sources:
        return None
    from ..methods.confounders.stage import metadata_columns  # lazy: the stage imports torch

    if skipped:
        manifest = manifest[~manifest["sample_id"].isin(skipped)].reset_index(drop=True)
    columns = metadata_columns(manifest, job.findings)
    if not columns:
        return None
    params = {"device": job.extract.device, **({} if job.seed is None else {"seed": int(job.seed)})}
    try:
        stages.get(SCAN).check_manifest(manifest, job.findings, **params)
    except UserError as exc:
        log.warning("confounder scan of %s left out: %s (report.scan=false turns it off)", ", ".join(columns),
                    message(exc))
        return None
    parts = []
    for name, source in sources:
        parts += score_and_save(SCAN, str(source), manifest, job.findings, params, out_dir, name, job.dataset)
    return pd.concat(parts, ignore_index=True)


def run_planned(job: Plan, out_dir: Path) -> pd.DataFrame:
    """The work of planned job ``job`` (:func:`plan`) under ``out_dir`` (held by :func:`recorded`); a
    full disk is one line naming the folder and the setting that moves it (:func:`disk_full`)."""
    with _naming_full_disk(job, out_dir):
        return _run_planned(job, out_dir)


def _run_planned(job: Plan, out_dir: Path) -> pd.DataFrame:
    write_text_atomic(out_dir / "config.yaml", job.config_yaml)
    if job.cli_overrides:
        write_text_atomic(out_dir / "overrides.yaml", redacted_yaml(OmegaConf.create(list(job.cli_overrides))))
    started = time.perf_counter()
    sources, skipped = [], []  # (encoder, its features) and the rows every encoder skipped, for the scan
    if job.features_file is not None:
        sources = [(job.encoders[0], job.features_file)]
        manifest = read_manifest_file(job)
        _check_scorable(job, manifest)
        # entries.json names the user's features, so a collect step can re-score them (CRoMa's panel k)
        record_entries(out_dir, job, [(job.encoders[0], job.features_file, [])], {})
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
            with _naming_full_disk(job, out_dir, "the feature cache"):
                entries, skipped, cache = extract_panel(job, manifest)
            if job.extract.num_shards > 1:
                return _record_part(job, entries, out_dir)
            record_entries(out_dir, job, entries, cache)
            sources = [(n, e) for n, e, _ in entries]
            summaries = run_stage_on_entries(job, manifest, [(n, e) for n, e, _ in entries], skipped, out_dir)
    scanned = scan(job, manifest, sources, skipped, out_dir)  # report.scan: what else the neighbourhoods follow
    summary = pd.concat(summaries, ignore_index=True)
    write_atomic(out_dir / "summary.parquet", lambda f: summary.to_parquet(f, index=False))
    table = console_table(summary, job.stage)
    write_text_atomic(out_dir / "summary.md", table)
    comparisons = build_comparisons(out_dir)  # two or more encoders: which one, and is the difference real
    seconds = time.perf_counter() - started
    report = _write_report(job, summary, out_dir, seconds, manifest, scanned)
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
    """The stage's ``check_manifest(manifest, findings, params)`` (the plan's typed parameters:
    :func:`~robustbench_fm.methods.params.with_params`; CANDOR: a k no matched group
    can satisfy) refuses a run whose every row would be blank, before any image is read."""

    check = getattr(stages.get(job.stage), "check_manifest", None)
    if check is not None:
        with_params(check, job.params, manifest, [str(f) for f in job.findings])


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


def _write_report(job: Plan, summary: pd.DataFrame, out_dir: Path, seconds: float,
                  manifest: pd.DataFrame | None = None, scanned: pd.DataFrame | None = None) -> Path:
    """``results_long.parquet``/``.csv`` (:mod:`.report.long_format`) and ``report.md`` /
    ``report.html`` (:mod:`.report.html`) of this run (``scanned``: the confounder scan's summary,
    :func:`scan`), its images (``manifest`` under the dataset root) in the neighbourhood section;
    returns the HTML path."""

    config = OmegaConf.create(job.config)
    long = to_long(summary, job.stage, config, out_dir.name)
    if scanned is not None and len(scanned):
        long = pd.concat([long, to_long(scanned, SCAN, config, out_dir.name)], ignore_index=True)
    write_atomic(out_dir / "results_long.parquet", lambda f: long.to_parquet(f, index=False))
    write_text_atomic(out_dir / "results_long.csv", long.to_csv(index=False))
    from_file = job.features_file is not None  # a features file: no images to show
    return write_report(run_report(out_dir, job.config_yaml, long, seconds, experiment=job.experiment,
                                   manifest=None if from_file else manifest, image_root=job.root,
                                   no_images=FROM_FEATURES if from_file else ""), out_dir)[1]


def record_entries(out_dir: Path, job: Plan, entries, cache: dict) -> None:
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
