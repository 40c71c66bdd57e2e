"""An experiment as one unit: every job its ``-m`` sweep would launch, one after another in this
process, then the collect step.

:func:`expand` lists the jobs exactly as Hydra's basic sweeper does (the experiment's
``hydra.sweeper.params``, then the command line; each job's config composed with its overrides by
Hydra's config loader, which also resolves its folder name ``hydra.sweep.subdir``);
:func:`run_jobs` runs them under ``<run dir>/<job folder>/`` (the multirun layout, so
:func:`.collect.collect_sweep` and ``python -m robustbench_fm collect`` work unchanged), skips the
jobs whose ``status.json`` says ``done`` (a resumed run), records a failed job and goes on, and
ends with the collect step: the same tables, file for file, as ``-m`` with the local launcher.

A run is an experiment unit (:func:`is_unit`) when its experiment lists paper tables
(``report.tables``) or sweeps settings of its own (``hydra.sweeper.params`` beyond the encoder
fan-out every config has); a plain run (the demo, ``encoder=x dataset=y``) stays one job.

Of Hydra only the compose API is used here (the config loader, the override parser and the basic
sweeper's argument splitting): the experiments are Hydra config files. ``hydra.main``, the
callbacks and the launchers stay in :mod:`robustbench_fm.cli`.
"""
from __future__ import annotations

import copy
import json
import logging
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from hydra import compose, initialize_config_dir
from hydra._internal.config_repository import CachingConfigRepository
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from .. import methods
from ..core.atomic import write_text_atomic
from ..core.errors import UserError, message
from ..data.cards import CONFIG_DIR
from ..report.comparisons import read as read_comparisons
from ..report.comparisons import verdict
from . import configstore
from . import job as pipeline_job
from .collect import JOBS_FILE, Collected, collect_and_report, job_state
from .plan import plan

log = logging.getLogger("robustbench_fm")

#: the sweeper parameter every config has (config.yaml: one job per encoder of the panel)
FAN_OUT = "encoder"


def is_unit(config: DictConfig) -> bool:
    """Whether ``config`` (with its ``hydra`` node) is an experiment run as a unit (module doc). A
    stage that builds the paper tables at the end of its own run (``Method.tables_after_run``:
    SPAR, whose one job runs the whole panel) stays one job unless the experiment sweeps more."""
    tables = OmegaConf.select(config, "report.tables", default=None) or []
    params = OmegaConf.select(config, "hydra.sweeper.params", default=None) or {}
    own = set(params) - {FAN_OUT}
    stage = OmegaConf.select(config, "stage.name", default=None)
    if not own and stage in methods.names() and methods.method(stage).tables_after_run:
        return False
    return bool(len(tables)) or bool(own)


class _FilesReadOnce(CachingConfigRepository):
    """Hydra's config repository that keeps what it read across the jobs of one sweep: each job's
    composition reads the same ~18 files, and Hydra's own cache lives for one composition (each
    composition deep-copies its repository, so the kept results are shared by reference through
    the copies). Each caller gets a deep copy of a kept result (composition merges into and edits
    what it loads), about a fifth of a YAML parse."""

    def __init__(self, delegate, kept: dict | None = None):
        super().__init__(delegate)
        self.cache = {} if kept is None else kept

    def __deepcopy__(self, memo):
        return _FilesReadOnce(self.delegate, self.cache)

    def load_config(self, config_path: str):
        return copy.deepcopy(super().load_config(config_path))


def expand(config: DictConfig, with_configs: bool = False) -> list[dict] | None:
    """The jobs Hydra's basic sweeper launches for ``config`` (the composed config with its
    ``hydra`` node, in a process where Hydra is initialised), in launch order: ``num``, ``dir``
    (``hydra.sweep.subdir``, relative to the sweep folder) and ``overrides``; with
    ``with_configs`` also each job's composed ``config`` (with its ``hydra`` node). None for
    another sweeper."""
    sweeper = config.hydra.sweeper
    if sweeper.get("_target_") != f"{BasicSweeper.__module__}.{BasicSweeper.__name__}":
        return None
    loader = GlobalHydra.instance().config_loader()
    arguments = [f"{k}={v}" for k, v in (sweeper.get("params") or {}).items()]
    arguments += OmegaConf.to_container(config.hydra.overrides.task, resolve=False)
    overrides = OverridesParser.create(config_loader=loader).parse_overrides(arguments)
    batches = BasicSweeper.split_arguments(overrides, sweeper.get("max_batch_size"))
    jobs = []
    repository, loader.repository = loader.repository, _FilesReadOnce(loader.repository)
    try:
        for num, overrides in enumerate(job for batch in batches for job in batch):
            job_cfg = loader.load_sweep_config(config, list(overrides))
            with open_dict(job_cfg):
                job_cfg.hydra.job.id = job_cfg.hydra.job.num = num
            jobs.append({"num": num, "dir": str(job_cfg.hydra.sweep.subdir), "overrides": list(overrides),
                         **({"config": job_cfg} if with_configs else {})})
    finally:
        loader.repository = repository
    return jobs


def task_config(job_cfg: DictConfig) -> tuple[DictConfig, str | None, str]:
    """``(config without hydra, experiment name, job name)`` of a composed job config, as Hydra
    hands a job its config (``hydra.core.utils.run_job``)."""
    experiment = OmegaConf.select(job_cfg, "hydra.runtime.choices.experiment", default=None)
    name = str(OmegaConf.select(job_cfg, "hydra.job.name", default=None) or "job")
    cfg = copy.deepcopy(job_cfg)
    with read_write(cfg), open_dict(cfg):
        del cfg["hydra"]
    return cfg, experiment, name


@dataclass
class UnitResult:
    """What :func:`run_jobs` did: the run folder, the jobs run now / skipped as done, the failed
    ones' one-line errors, and the collect step's outcome (None when nothing could be collected)."""

    run_dir: Path
    ran: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    collected: Collected | None = None

    @property
    def ok(self) -> bool:
        c = self.collected
        return c is not None and not (c.unfinished or c.problems or c.table_errors or self.errors)


def _job_log(out: Path, name: str) -> logging.Handler:
    """The job's own log file ``<job folder>/<job name>.log``, as a multirun job has."""
    handler = logging.FileHandler(out / f"{name}.log")
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
    logging.getLogger().addHandler(handler)
    return handler


def run_jobs(jobs: list[dict], run_dir: str | Path, debug: bool = False) -> UnitResult:
    """Run ``jobs`` (:func:`expand` with configs) one after another under ``run_dir``, then the
    collect step (module doc). A job that fails is recorded (``status.json``) and the next one
    runs: a user error is one line naming the job; any other error is a bug, one line naming the
    job's log with the traceback (``debug=true``: printed too). Ctrl-C stops the run (finished
    jobs are kept: the same command with ``hydra.run.dir=<run dir>`` resumes)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(run_dir / JOBS_FILE, json.dumps(
        {"jobs": [{k: v for k, v in j.items() if k != "config"} for j in jobs]}, indent=1) + "\n")
    result = UnitResult(run_dir)
    for job in jobs:
        out = run_dir / job["dir"]
        if job_state(out)[0] == "done":
            result.skipped.append(job["dir"])
            continue
        cfg, experiment, name = task_config(job["config"])
        out.mkdir(parents=True, exist_ok=True)
        print(f"job {job['num'] + 1} of {len(jobs)}: {job['dir']} ({' '.join(job['overrides'])})", flush=True)
        handler = _job_log(out, name)
        try:
            pipeline_job.run(cfg, out, list(job["overrides"]), multirun=True, experiment=experiment)
            result.ran.append(job["dir"])
        except pipeline_job.USER_ERRORS as exc:
            result.errors.append(f"job {job['dir']}: {message(exc)}")
            print(f"error: job {job['dir']}: {message(exc)}", file=sys.stderr)
        except Exception as exc:  # noqa: BLE001  (a bug in one job: recorded, the next job runs)
            log_file = Path(handler.baseFilename)
            log_traceback(handler, f"job {job['dir']} failed with a bug")
            if debug:
                traceback.print_exc()
            line = bug_line(exc, log_file, where=f"job {job['dir']}: ")
            result.errors.append(line)
            print(line, file=sys.stderr)
        finally:
            logging.getLogger().removeHandler(handler)
            handler.close()
    if result.skipped:
        print(f"{len(result.skipped)} of {len(jobs)} jobs already done in {run_dir} (skipped)")
    result.collected = collect_and_report(run_dir)
    return result


#: at most this many runs of job numbers are listed per problem (the count is always exact)
MAX_RUNS = 12


def problem_lines(problems: dict[str, list[int]]) -> list[str]:
    """One line per distinct problem of a set of jobs, in the order first met: its number (a dry
    run's job lines say ``error (problem N)``), how many jobs it stops and which (runs of job
    numbers: ``#0-2, #6-8``), and the one-line error itself, once."""
    lines = []
    for i, (text, nums) in enumerate(problems.items(), 1):
        runs: list[list[int]] = []
        for n in sorted(nums):
            if runs and n == runs[-1][1] + 1:
                runs[-1][1] = n
            else:
                runs.append([n, n])
        shown = [f"#{a}" if a == b else f"#{a}-{b}" for a, b in runs[:MAX_RUNS]]
        more = f", ... ({len(runs) - MAX_RUNS} more runs)" if len(runs) > MAX_RUNS else ""
        jobs = f"{len(nums)} job{'s' if len(nums) != 1 else ''}"
        lines.append(f"problem {i}, {jobs} ({', '.join(shown)}{more}): {text}")
    return lines


class JobsRefused(UserError):
    """Some jobs of an experiment fail their plan (:func:`check_jobs`): nothing ran. ``lines``: each
    distinct problem once with the jobs it stops (:func:`problem_lines`); the message is one line
    holding them all."""

    def __init__(self, problems: dict[str, list[int]], n_jobs: int):
        self.problems = problems
        self.lines = problem_lines(problems)
        bad = sum(len(v) for v in problems.values())
        self.summary = (f"nothing was run: {bad} of {n_jobs} jobs fail their checks ({len(problems)} distinct "
                        f"problem{'s' if len(problems) != 1 else ''}); dry_run=true lists every job")
        super().__init__(f"{self.summary}: " + "; ".join(self.lines))


def check_jobs(jobs: list[dict], run_dir: Path | None = None) -> None:
    """Every job's plan (names, data folders, options: :func:`.plan.plan`) before the first one runs;
    the jobs ``run_dir`` already holds as done are skipped (a resumed run does not run them again),
    once their folder is known to hold this job (a job folder of another run,
    :func:`.job.folder_conflict`, is a problem too: skipped as done or run over, it would mix two runs).
    Raises :class:`JobsRefused` naming each distinct problem once with the jobs it stops (a missing
    dataset folder is one line, not one per job)."""
    problems: dict[str, list[int]] = {}
    for job in jobs:
        out = Path(run_dir) / job["dir"] if run_dir is not None else None
        done = out is not None and job_state(out)[0] == "done"
        cfg, _, _ = task_config(job["config"])
        try:
            planned = plan(cfg, list(job["overrides"]))
        except pipeline_job.USER_ERRORS as exc:
            if not done:  # a job done before is not run again: only its folder is checked
                problems.setdefault(message(exc), []).append(job["num"])
            continue
        conflict = pipeline_job.folder_conflict(out, planned) if out is not None else None
        if conflict is not None:  # another run's job folder: skipped as done or run over, it would mix two runs
            problems.setdefault(f"run folder {run_dir} holds the jobs of another run ({job['dir']}: {conflict}); "
                                "run this one into another folder with hydra.run.dir=<folder>", []).append(job["num"])
    if problems:
        raise JobsRefused(problems, len(jobs))


def log_traceback(handler: logging.Handler, text: str) -> None:
    """The exception being handled, with its traceback, written to ``handler`` alone (a log file;
    the console gets the one line)."""
    handler.handle(logging.LogRecord(log.name, logging.ERROR, __file__, 0, text, (), sys.exc_info()))


def bug_line(exc: BaseException, log_file: Path | None, where: str = "") -> str:
    """The one line of an error that is not the user's: a bug, with the log holding its traceback."""
    logged = f"the full traceback is in {log_file}" if log_file else "no log file holds its traceback"
    return (f"error: {where}{type(exc).__name__}: {message(exc)}; this is a bug in robustbench_fm, not in your "
            f"input: {logged}; rerun with debug=true to print it")


def tables_of(collected: Collected | None) -> dict[str, pd.DataFrame]:
    """The built paper tables by name."""
    return {t.name: t.frame for t in (collected.tables if collected is not None else [])}


@dataclass
class Outcome:
    """What :func:`run_experiment` returns (``robustbench_fm.run``): the run folder, the paper
    tables by name, the combined summary of every job, and the one-line errors (empty: all done)."""

    run_dir: Path
    tables: dict[str, pd.DataFrame]
    summary: pd.DataFrame
    errors: list[str]

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def comparisons(self) -> pd.DataFrame:
        """The paired comparisons of the encoders (``<run>/comparisons.csv``; empty with fewer than two
        encoders): :mod:`robustbench_fm.report.comparisons`."""
        return read_comparisons(self.run_dir).pairs

    @property
    def ranking(self) -> pd.DataFrame:
        """The encoders ranked per metric, finding and row, with the best set (``<run>/ranking.csv``)."""
        return read_comparisons(self.run_dir).ranking

    @property
    def verdict(self) -> list[str]:
        """The report's "Which encoder" sentences, one per finding."""
        return verdict(read_comparisons(self.run_dir))


def run_experiment(experiment: str, overrides: list[str] | tuple[str, ...] = (), config_dir: str | Path | None = None,
                   run_dir: str | Path | None = None) -> Outcome:
    """The pipeline from Python (``robustbench_fm.run``): compose ``experiment=<experiment>`` with
    ``overrides`` from the shipped configs (``config_dir``: a folder of your own configs searched
    first) exactly as the command line does, then run it as the command line without ``-m`` does:
    an experiment unit's jobs one after another and the collect step (:func:`run_jobs`), a plain
    run as one job, into ``run_dir`` (default: the command line's ``hydra.run.dir``,
    ``outputs/runs/<date>/<time>``). Bad input raises :class:`~robustbench_fm.core.errors.UserError`
    before anything runs (the plan of every job is checked first); a job that fails later is
    listed in ``errors``."""
    args = [f"experiment={experiment}", *overrides]
    if config_dir is not None:
        args.append(f"hydra.searchpath=[file://{Path(config_dir).resolve()}]")
    configstore.register()  # the resolvers and the encoder= / stage= options (importing the package did not)
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        full = compose("config", overrides=args, return_hydra_config=True)
        target = Path(run_dir) if run_dir is not None else Path(str(full.hydra.run.dir))
        if not is_unit(full):
            cfg, name, _ = task_config(full)
            plan(cfg, args)
            target.mkdir(parents=True, exist_ok=True)
            summary = pipeline_job.run(cfg, target, args, experiment=name)
            tables = {p.stem: pd.read_csv(p) for p in sorted((target / "tables").glob("*.csv"))}
            return Outcome(target, tables, summary, [])
        jobs = expand(full, with_configs=True)
    check_jobs(jobs, target)  # every job's names, data folders and options, before the first one runs
    result = run_jobs(jobs, target)
    collected = result.collected
    errors = list(result.errors)
    if collected is None:
        errors.append(f"collect: nothing could be collected from {target}")
    else:
        errors += [f"{n} ({status})" for n, status, _ in collected.unfinished if not any(n in e for e in errors)]
        errors += collected.problems + collected.table_errors
    combined = collected.combined if collected is not None else pd.DataFrame()
    return Outcome(target, tables_of(collected), combined, errors)
