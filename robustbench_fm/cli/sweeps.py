"""Multirun support: the panel fan-out and the collect step that ends every sweep.

``-m`` fans out one job per encoder of the job's panel (``hydra.sweeper.params.encoder`` is
``${sweep_values:${encoders},${encoder.name}}``); with ``extract.num_shards=N`` and
``extract.shard=range(N)`` each (encoder, part) is a job that only extracts its part.

With ``extract.panel_jobs=N`` (one decode for a whole panel: a panel experiment runs as one
extraction job per device followed by the stage jobs over cached features, on the local
launcher and on Slurm through submitit), :class:`CollectCallback` first embeds the sweep's
image encoders in at most N extraction jobs (:func:`extraction_jobs`: encoders dealt round-robin
by weight size, so the jobs' panels are of like size; each job runs the pipeline's panel
extraction, ``pipeline.job.extract_panel`` -> ``Embedder.embed_panel``, which decodes every image
once per pass). They run in the submitting process on Hydra's basic and joblib launchers, and as
submitit jobs built from the sweep's ``hydra.launcher`` settings on the submitit launchers (``launcher=slurm``,
``launcher=submitit_local``); the callback waits for them, then the launcher starts the usual
per-encoder stage jobs, which find settled cache entries and only score. A failed extraction job
is one ``warning:`` line naming its log; its stage jobs extract what is missing themselves. The
extraction jobs live in ``<sweep>/extract/<i>/`` (``status.json``, ``panel.json`` with each
entry's cache use, ``extract.log``) and are listed under ``extraction`` in ``jobs.json``; collect
lists a failed one in ``missing.txt`` without failing the sweep (nothing is lost). A stage that
drives the encoder itself (``run_job``), a slide encoder, a sharded extraction
(``extract.num_shards>1``) or a job from ``features_file`` keeps today's path.

:func:`collect` (run by :class:`CollectCallback` when a multirun ends, and by
``python -m robustbench_fm collect <sweep dir>``) reads every job folder of a sweep:

* jobs whose ``status.json`` is not ``done`` are listed in ``missing.txt`` with their error:
  ``failed``, ``interrupted`` (Ctrl-C, or a ``running`` job whose process is gone: its lock is
  abandoned), ``running``, and ``never started``: the sweep writes the list of its jobs to
  ``jobs.json`` when it starts (:class:`CollectCallback`), so jobs that never got a folder are
  listed too;
* sharded extractions: once every part of a cache entry is in, the stage runs here on the
  complete entries (``collect/<dataset>-<stage>/``); an entry with missing shards is refused,
  naming the shards, in ``missing.txt`` and in the :class:`IncompleteSweep` error;
* every summary (jobs' and collected) goes into ``combined.parquet`` / ``combined.csv`` with the
  job folder in column ``job``, and in long format (:mod:`.report.long_format`: encoder,
  dataset, task, stage, group, metric, value, ci_low, ci_high, n, seed, config_hash, job) into
  ``results_long.parquet`` / ``results_long.csv``. Numbers stay numbers;
* the paper tables of the experiment's ``report.tables`` go to ``tables/``, their comparison
  with the published values to ``compare.md`` / ``compare.csv``, and ``report.md`` /
  ``report.html`` sum the sweep up (:mod:`.report.html`).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from .. import encoders
from .. import methods as stages
from ..core.atomic import write_text_atomic
from ..core.errors import UserError, message
from ..core.redact import redacted_yaml
from ..pipeline.collect import (  # noqa: F401  (the collect step; importable from here as before)
    EXTRACT_DIR,
    JOBS_FILE,
    Collected,
    IncompleteSweep,
    _extraction_problems,
    _job_dirs,
    _short,
    collect,
    collect_and_report,
    collect_sweep,
    job_state,
)
from ..pipeline.experiment import expand, is_unit, problem_lines  # noqa: F401  (importable from here)
from ..pipeline.resolvers import sweep_values  # noqa: F401  (kept importable from here)

log = logging.getLogger("robustbench_fm")

#: the one-line refusals of this sweep's jobs whose folder holds another run (a reused
#: ``hydra.sweep.dir``; :class:`robustbench_fm.pipeline.job.RunFolderTaken`): each such folder keeps
#: the other run's results, so the sweep fails (:meth:`CollectCallback.on_multirun_end`)
REFUSED_FOLDERS: list[str] = []


def plan_jobs(config: DictConfig, with_configs: bool = False) -> list[dict] | None:
    """The jobs Hydra's basic sweeper launches for the multirun config ``config``, in launch
    order (:func:`robustbench_fm.pipeline.experiment.expand`): number, folder
    (``hydra.sweep.subdir``, relative to the sweep folder) and overrides (with ``with_configs``,
    also each job's composed ``config``); None for another sweeper."""
    return expand(config, with_configs)


#: launcher settings a dry run of a sweep shows (where the launcher has them)
LAUNCHER_SETTINGS = ("partition", "account", "qos", "gpus_per_node", "cpus_per_task", "mem_gb", "timeout_min",
                     "array_parallelism", "n_jobs")


def dry_run_sweep(config: DictConfig, unit_dir: Path | None = None) -> int:
    """``-m ... dry_run=true`` (and an experiment's run as a unit without ``-m``, ``unit_dir``: its
    run folder): print the jobs the sweep would launch, both ways to run them (one after another
    in this process without ``-m``, or fanned out with ``-m`` onto the launcher, with its
    settings), each job's plan checked (:func:`robustbench_fm.pipeline.plan.plan`: names, data folders, options) and its
    verdict, then each distinct problem once with the jobs it stops (:func:`problem_lines`: a
    missing dataset folder is one line, not one per job); launch nothing and write nothing.
    Returns the exit code: 0, or 2 when a job's plan fails."""
    from ..pipeline import job as pipeline_job  # lazy: imports torch
    from ..pipeline import plan as pipeline_plan  # lazy: as the job

    jobs = plan_jobs(config, with_configs=True)
    launcher = config.hydra.launcher
    settings = ", ".join(f"{k}={launcher[k]}" for k in LAUNCHER_SETTINGS if launcher.get(k) is not None)
    kind = str(launcher.get("_target_", "?")).rsplit(".", 1)[-1]
    if jobs is None:
        print(f"dry run: the sweeper {config.hydra.sweeper.get('_target_')} lists its jobs only when it runs")
        return 0
    args = [a for a in OmegaConf.to_container(config.hydra.overrides.task, resolve=False) if a != "dry_run=true"]
    command = " ".join(["python -m robustbench_fm", *args])
    if unit_dir is not None:
        print(f"dry run of an experiment: {len(jobs)} jobs, run one after another in this process, then the "
              f"collect step, into {unit_dir}")
    else:
        print(f"dry run of a sweep: {len(jobs)} jobs with {kind}" + (f" ({settings})" if settings else "")
              + f" into {config.hydra.sweep.dir}")
    if unit_dir is not None or is_unit(config):  # an experiment: both ways to run its jobs
        print(f"  in this process: {command}\n  fanned out onto the launcher ({kind}): "
              f"{command.replace('python -m robustbench_fm', 'python -m robustbench_fm -m', 1)}")
    try:
        n = panel_jobs(config)
    except UserError as exc:
        print(f"error: {exc}")
        return 2
    for job in extraction_jobs(jobs, n) if n else []:
        print(f"  {job['dir']}: panel extraction first ({_describe(job)})")
    problems: dict[str, list[int]] = {}  # one-line error -> the jobs it stops, in launch order
    for job in jobs:
        try:
            pipeline_plan.plan(job["config"], job["overrides"],
                               here="submitit" not in str(launcher.get("_target_", "")))
            verdict = "ok"
        except pipeline_job.USER_ERRORS as exc:
            stopped = problems.setdefault(message(exc), [])
            stopped.append(job["num"])
            verdict = f"error (problem {list(problems).index(message(exc)) + 1})"
        print(f"  #{job['num']} {job['dir']}: {verdict}")
    for line in problem_lines(problems):
        print(line)
    bad = sum(len(nums) for nums in problems.values())
    if not bad:
        print("nothing was launched (dry_run=true); every job's names, data folders and options check out")
        return 0
    distinct = f"{len(problems)} distinct problem{'s' if len(problems) != 1 else ''} above"
    print(f"nothing was launched (dry_run=true); {bad} of {len(jobs)} jobs would fail their checks ({distinct})")
    return 2


def panel_jobs(config: DictConfig) -> int:
    """``extract.panel_jobs`` of a multirun config: 0 (off) or the number of extraction jobs;
    a one-line error for anything else."""
    value = config.extract.panel_jobs
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UserError(f"extract.panel_jobs={value!r}: use 0 (each stage job extracts its own encoder) or the "
                        "number of panel-extraction jobs to run first, one per device, e.g. extract.panel_jobs=1")
    return value


def _settings(cfg: DictConfig) -> dict:
    """A job's config without ``hydra``, resolved to plain values (an extraction job rebuilds its
    config from it, in this process or in a submitit job's)."""
    return {str(k): OmegaConf.to_container(cfg[k], resolve=True) if OmegaConf.is_config(cfg[k]) else cfg[k]
            for k in cfg if k != "hydra"}


def extraction_jobs(jobs: list[dict], n_jobs: int) -> list[dict]:
    """The panel-extraction jobs of a sweep (``extract.panel_jobs=n_jobs``) whose stage jobs are
    ``jobs`` (:func:`plan_jobs` with configs). The stage jobs that embed images with an image
    encoder (no ``run_job`` stage, no slide encoder, no ``features_file``, ``extract.num_shards=1``,
    a plan that checks out: a job whose plan fails reports it itself) are grouped by what decides
    their manifest and entries (:func:`_extraction_identity`: one panel); each panel's
    encoders are dealt to at most ``n_jobs`` jobs in turn, largest weights (``params_m``) first,
    so every job gets a like share of the weights and each job's panel fits where the whole might
    not (within a job, :meth:`Embedder.panel_groups` splits further passes if needed). Returns
    ``[{"num", "dir", "panels": [{"settings", "encoders": [[name, encoder node]], "dataset",
    "stage"}]}]``; [] when no job qualifies."""
    from ..pipeline import job as pipeline_job  # lazy: imports torch
    from ..pipeline import plan as pipeline_plan  # lazy: as the job

    groups: dict[str, dict] = {}
    for job in jobs:
        cfg = job["config"]
        if cfg.get("features_file") or int(cfg.extract.get("num_shards", 1)) > 1:
            continue
        try:
            plan = pipeline_plan.plan(cfg, job["overrides"], here=False)
        except pipeline_job.USER_ERRORS:
            continue
        if hasattr(stages.get(plan.stage), "run_job"):  # the stage drives the encoder itself
            continue
        names = [n for n in plan.encoders if not encoders.get(n).is_slide]
        if not names:
            continue
        settings = _settings(cfg)
        key = json.dumps(_extraction_identity(settings), sort_keys=True, default=str)
        group = groups.setdefault(key, {"settings": settings, "encoders": {}, "dataset": plan.dataset,
                                        "stage": plan.stage})
        for name in names:
            group["encoders"].setdefault(name, settings["encoder"])
    out: list[dict] = []
    turn = 0
    for group in groups.values():
        ranked = sorted(group["encoders"], key=lambda n: (-float(encoders.get(n).params_m or 0), n))
        for name in ranked:
            i = turn % n_jobs
            turn += 1
            while len(out) <= i:
                out.append({"num": len(out), "dir": f"{EXTRACT_DIR}/{len(out)}", "panels": []})
            panels = out[i]["panels"]
            if not panels or panels[-1]["group"] is not group:
                panels.append({"group": group, "settings": group["settings"], "encoders": [],
                               "dataset": group["dataset"], "stage": group["stage"]})
            panels[-1]["encoders"].append([name, group["encoders"][name]])
    for job in out:
        for panel in job["panels"]:
            del panel["group"]
    return out


def _extraction_identity(settings: dict) -> dict:
    """What decides a job's manifest and cache entries: its settings without the encoder, the
    report's and console's settings and the stage's parameters (``stage.params.k=5,10`` sweeps one
    panel), keeping ``group_col`` (``fixed_sample`` draws per group). Jobs that this puts apart
    but that share an entry find it settled; jobs it puts together wrongly would extract their own
    entries (never a wrong one: the cache is content-keyed)."""
    out = {k: v for k, v in settings.items() if k not in ("encoder", "report", "debug", "dry_run")}
    stage = dict(out.get("stage") or {})
    stage["params"] = {"group_col": (stage.get("params") or {}).get("group_col")}
    return {**out, "stage": stage}


def _describe(job: dict) -> str:
    """``planted_blur, planted_sharp on planted`` (each panel of an extraction job)."""
    return "; ".join(f"{', '.join(n for n, _ in p['encoders'])} on {p['dataset']}" for p in job["panels"])


def run_extraction(job: dict, sweep_dir: str) -> list[dict]:
    """One panel-extraction job (:func:`extraction_jobs`), in this process or a submitit job's:
    every panel's encoders embedded through the pipeline's extraction (``pipeline.job.extract_panel`` ->
    ``Embedder.embed_panel``: one decode per image per pass; each entry the one the stage job
    would write itself, byte for byte), each encoder with the options its own stage job has.
    Writes ``<sweep>/extract/<i>/``: ``status.json`` (running with pid and host, then done or
    failed with the error), ``config.yaml`` (redacted), ``extract.log`` and ``panel.json`` (per
    panel: dataset, stage and each encoder's entry and cache use, as a job's ``entries.json``).
    Returns the ``panel.json`` records; raises what the extraction raised."""
    from ..pipeline import job as pipeline_job  # lazy: imports torch

    out = Path(sweep_dir) / job["dir"]
    out.mkdir(parents=True, exist_ok=True)
    logger = logging.getLogger("robustbench_fm")
    handler = logging.FileHandler(out / "extract.log")
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        with pipeline_job.recorded(out, pid=os.getpid(), host=socket.gethostname()):
            write_text_atomic(out / "config.yaml", redacted_yaml(OmegaConf.create(
                [p["settings"] for p in job["panels"]] if len(job["panels"]) > 1 else job["panels"][0]["settings"])))
            try:
                records = [_extract(panel) for panel in job["panels"]]
            except BaseException:
                log.error("extraction job %s failed", job["dir"], exc_info=True)
                raise
            write_text_atomic(out / "panel.json", json.dumps({"panels": records}, indent=1) + "\n")
        return records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        handler.close()


def _extract(panel: dict) -> dict:
    """One panel of an extraction job: its manifest (as its stage jobs build it) and its encoders'
    entries (``pipeline.job.extract_panel`` with an Embedder holding each encoder's own options)."""
    from ..pipeline import job as pipeline_job  # lazy: imports torch
    from ..pipeline import plan as pipeline_plan  # lazy: as the job

    names = [name for name, _ in panel["encoders"]]
    configs = [OmegaConf.create({**panel["settings"], "encoder": node}) for _, node in panel["encoders"]]
    plans = [pipeline_plan.plan(c, [f"encoder={c.encoder.name}"]) for c in configs]  # each encoder's own options
    plan = dataclasses.replace(plans[0], encoders=names)
    manifest = pipeline_job.load_manifest(plan)
    service = dataclasses.replace(pipeline_job.embedder(plan),
                                  options=dict(pipeline_job.encoder_options(p) for p in plans))
    log.info("panel extraction of %d encoders (%s) on %s", len(names), ", ".join(names), plan.dataset)
    entries, skipped, cache = pipeline_job.extract_panel(plan, manifest, service)
    return {"dataset": plan.dataset, "stage": plan.stage, "skipped": len(skipped),
            "entries": [{"encoder": n, "entry": str(e), "cache": cache.get(n)} for n, e, _ in entries]}


#: hydra-submitit-launcher's launcher classes -> submitit's cluster name
SUBMITIT_CLUSTERS = {"SlurmLauncher": "slurm", "LocalLauncher": "local"}


def _submitit_cluster(config: DictConfig) -> str | None:
    """``slurm`` or ``local`` for the submitit launchers, None for a launcher that runs jobs here."""
    target = str(config.hydra.launcher.get("_target_", ""))
    if not target.startswith("hydra_plugins.hydra_submitit_launcher."):
        return None
    return SUBMITIT_CLUSTERS.get(target.rsplit(".", 1)[-1])


def _executor(config: DictConfig, cluster: str):
    """A ``submitit.AutoExecutor`` with the sweep's ``hydra.launcher`` settings, mapped as
    hydra-submitit-launcher maps them (folder, partition, gpus_per_node, cpus_per_task, mem_gb,
    timeout_min, setup, account, qos, ...; unset ones left to submitit)."""
    import submitit  # lazy: only the submitit launchers need it
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf  # lazy: an optional plugin

    params = {k: v for k, v in OmegaConf.to_container(config.hydra.launcher, resolve=True).items()
              if k != "_target_" and v is not None}
    folder = params.pop("submitit_folder")
    init = {f"{cluster}_max_num_timeout": params.pop("max_num_timeout")} if "max_num_timeout" in params else {}
    executor = submitit.AutoExecutor(folder=folder, cluster=cluster, **init)
    base = set(OmegaConf.structured(BaseQueueConf).keys())
    params["name"] = f"{params.get('name') or 'robustbench_fm'}-extract"
    executor.update_parameters(**{k if k in base else f"{cluster}_{k}": v for k, v in params.items()})
    return executor


def _failed(sweep_dir: Path, job: dict, exc: BaseException, log_file: Path) -> None:
    """One ``warning:`` line for a failed extraction job (its error, its log) and its
    ``status.json`` set to failed where the job could not say so itself (killed, never started)."""
    out = sweep_dir / job["dir"]
    try:
        record = json.loads((out / "status.json").read_text())
    except (OSError, ValueError):
        record = {}
    error = record.get("error") if record.get("status") == "failed" else None
    if not error:
        lines = [line for line in str(exc).splitlines() if line.strip()]
        error = f"{type(exc).__name__}: {_short(' '.join(lines[0].split()) if lines else '', 200)}"
        out.mkdir(parents=True, exist_ok=True)
        from ..pipeline.job import write_status  # lazy: imports torch

        write_status(out, "failed", error, end=time.time(),
                     **{k: v for k, v in record.items() if k in ("pid", "host", "start")})
    print(f"warning: panel extraction job {job['dir']} ({_describe(job)}) failed: {error}; log: {log_file}; "
          "its stage jobs extract what is missing themselves", file=sys.stderr)


def extract_first(config: DictConfig, sweep_dir: Path, jobs: list[dict]) -> None:
    """Run the extraction jobs ``jobs`` (:func:`extraction_jobs`) and wait for them: here on the
    basic and joblib launchers, as submitit jobs on the submitit launchers. A failed job is one
    line (:func:`_failed`); the sweep goes on."""
    cluster = _submitit_cluster(config)
    print(f"extract.panel_jobs={panel_jobs(config)}: {len(jobs)} panel extraction job"
          f"{'s' if len(jobs) != 1 else ''} first"
          + (f" (submitit, {cluster})" if cluster else " (in this process)") + ": "
          + " | ".join(f"{j['dir']}: {_describe(j)}" for j in jobs), flush=True)
    if cluster is None:
        for job in jobs:
            try:
                run_extraction(job, str(sweep_dir))
            except Exception as exc:  # noqa: BLE001  (one line; the stage jobs extract what is missing)
                _failed(sweep_dir, job, exc, sweep_dir / job["dir"] / "extract.log")
        return
    executor = _executor(config, cluster)
    submitted = executor.map_array(run_extraction, jobs, [str(sweep_dir)] * len(jobs))
    for job, sub in zip(jobs, submitted):
        try:
            sub.result()
        except Exception as exc:  # noqa: BLE001  (one line; the stage jobs extract what is missing)
            _failed(sweep_dir, job, exc, Path(sub.paths.stderr))



class CollectCallback(Callback):
    """Hydra callback: when a multirun starts, write its job list (``jobs.json``); when it ends,
    run :func:`collect` on the sweep folder and exit non-zero if any job did not finish (the
    jobs themselves record a failure and return, so every job of the sweep runs)."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if config.get("dry_run"):
            raise SystemExit(dry_run_sweep(config))
        try:
            n = panel_jobs(config)
        except UserError as exc:
            print(f"error: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
        try:
            jobs = plan_jobs(config, with_configs=n > 0)
        except Exception as exc:  # noqa: BLE001  (bookkeeping never stops a sweep; the sweeper reports bad configs)
            log.warning("could not list the sweep's jobs (%s: %s); collect lists only the jobs that start",
                        type(exc).__name__, exc)
            return
        if jobs is None:
            return
        sweep_dir = Path(str(config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        extraction = extraction_jobs(jobs, n) if n else []
        record = {"jobs": [{k: v for k, v in job.items() if k != "config"} for job in jobs]}
        if extraction:
            record["extraction"] = [{"num": j["num"], "dir": j["dir"],
                                     "panels": [{"dataset": p["dataset"], "stage": p["stage"],
                                                 "encoders": [name for name, _ in p["encoders"]]}
                                                for p in j["panels"]]} for j in extraction]
        write_text_atomic(sweep_dir / JOBS_FILE, json.dumps(record, indent=1) + "\n")
        if extraction:
            extract_first(config, sweep_dir, extraction)
        elif n:
            print(f"extract.panel_jobs={n}: no job of this sweep embeds images with an image encoder here "
                  "(a run_job stage, slide encoders, sharded or from features); nothing to extract first")

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if REFUSED_FOLDERS:  # collecting would report the other run's results as this sweep's
            print(f"error: {len(REFUSED_FOLDERS)} job folders of {config.hydra.sweep.dir} hold another run; "
                  "run this sweep into another folder with hydra.sweep.dir=<folder>", file=sys.stderr)
            raise SystemExit(2)
        result = collect_and_report(str(config.hydra.sweep.dir))
        # a sweep of some parts of a sharded extraction (the rest run elsewhere) is fine: the
        # error names the missing shards, and `collect` exits 2 until they are in; a paper table
        # the experiment asks for that cannot be built fails the sweep (its one line is out)
        if result is None or result.unfinished or result.table_errors:
            raise SystemExit(1)
