"""Command line: ``python -m robustbench_fm [hydra overrides]`` runs a job (default
``experiment=demo``); a first word that is a subcommand (:func:`parser`, the one place they are
declared) runs it instead: ``python -m robustbench_fm list [encoders|datasets|stages|experiments|panels]``
lists what is registered; ``python -m robustbench_fm verify <cache entry or root> [manifest]``
re-checks feature-cache shards against their checksums, row counts and the manifest;
``python -m robustbench_fm doctor [encoder ...]`` reports whether each encoder can run offline;
``python -m robustbench_fm collect <sweep dir> [--compare]`` (or ``experiment=collect
sweep_dir=<sweep dir> [compare=true]``) merges a multirun's results (run automatically when a
multirun ends) and with ``--compare`` prints its paper tables beside the published values;
``python -m robustbench_fm compare <sweep dir>`` only rebuilds that comparison;
``python -m robustbench_fm rank <run or sweep dir>`` rebuilds the paired comparisons between its encoders
(``comparisons.csv``, ``ranking.csv``) from finished results."""
from __future__ import annotations

import argparse
import logging
import re
import sys
from pathlib import Path

from .. import data, encoders, methods
from .. import methods as stages
from ..core.errors import UnknownName, message
from ..core.redact import install_log_redaction, redacted_yaml
from ..core.tables import SweepResults
from ..data import cards
from ..encoders import generic
from ..pipeline import configstore
from ..pipeline.configstore import GROUPS, group_options
from ..pipeline.experiment import JobsRefused, bug_line, check_jobs, expand, is_unit, log_traceback, run_jobs
from ..pipeline.plan import resolved_prepared_dir
from ..report.compare import to_markdown, write_compare
from ..report.comparisons import build as build_comparisons
from ..report.comparisons import verdict
from ..report.tables import get
from .sweeps import REFUSED_FOLDERS, collect_and_report, dry_run_sweep

#: the shipped configs: the source tree's ``configs/`` or the installed package data (data.cards.config_dir)
CONFIG_DIR = cards.CONFIG_DIR


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    """Rows as left-aligned columns (the last column is not padded)."""
    if not rows:
        return []
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join([c.ljust(w) for c, w in zip(r, widths)] + [r[-1]]).rstrip() for r in rows]


def _yaml_title(path: Path) -> str:
    """The first line of a config file's leading comment (after ``# @package``)."""
    for line in path.read_text().splitlines():
        if line.startswith("#") and not line.startswith("# @package"):
            return line.lstrip("# ").strip()
    return ""


def _panel_line(path: Path) -> str:
    from omegaconf import OmegaConf

    names = [str(n) for n in OmegaConf.load(path).get("encoders") or []]
    shown = ", ".join(names)
    return f"{len(names)}: " + (shown if len(shown) <= 90 else shown[:89] + "…")


SECTIONS = ("encoders", "datasets", "stages", "experiments", "panels")


def listing(what: str | None = None) -> str:
    """Registered encoders, datasets, stages, shipped experiments and panels, aligned, one per
    line with what each is. Imports no torch (the registries hold specs only). An unknown
    section is an :class:`~robustbench_fm.core.errors.UnknownName` naming the sections."""
    if what is not None and what not in SECTIONS:
        raise UnknownName(f"list: unknown section '{what}'; choose one of {', '.join(SECTIONS)}")

    def encoder_rows():
        for n in encoders.names():
            spec = encoders.get(n)
            yield n, spec.library, f"{spec.params_m:g}M" if spec.params_m else "", spec.hub_id
        for kind, library in generic.GENERIC.items():  # a model id instead of an entry (encoders/generic.py)
            yield kind, library, "", f"generic: encoder.model={generic.MODEL_HINT[kind]}"

    makers = {
        "encoders": lambda: [("name", "library", "params", "weights (hub id)"), *encoder_rows()],
        "datasets": lambda: [("name", "access / what it is")]
        + [(n, data.get(n).access or data.get(n).description) for n in data.names()],
        "stages": lambda: [("name", "what it measures")] + [(n, d) for n, d in stages.descriptions().items()],
        "experiments": lambda: [("name", "what it reproduces")]
        + [(p.stem, _yaml_title(p)) for p in sorted((CONFIG_DIR / "experiment").glob("*.yaml"))],
        "panels": lambda: [("name", "encoders")]
        + [(p.stem, _panel_line(p)) for p in sorted((CONFIG_DIR / "panel").glob("*.yaml"))],
    }
    keys = [what] if what else list(SECTIONS)
    return "\n\n".join(f"{k}:\n" + "\n".join(f"  {line}" for line in _table(makers[k]())) for k in keys)


def verify(path: str, manifest: str | None = None) -> int:
    """Print one line per cache entry (plus its problems and notes); 1 when any entry is bad."""
    from ..features import verify_cache, verify_entry  # lazy: imports torch

    target = Path(path)
    reports = [verify_entry(target, manifest)] if manifest else verify_cache(target)  # an entry: itself
    if not reports:
        print(f"{target}: no cache entry found")
        return 1
    for report in reports:
        print(report.summary())
        for line in report.problems:
            print(f"  problem: {line}")
        for line in report.notes:
            print(f"  note: {line}")
    return 0 if all(r.ok for r in reports) else 1


def collect(sweep_dir: str, show_compare: bool = False) -> int:
    """Merge a sweep's results (``combined.parquet``, ``results_long.parquet``, tables, report);
    with ``show_compare`` print ``compare.md``; 1 with a one-line summary when jobs did not
    finish, 2 with a one-line error when incomplete."""

    result = collect_and_report(sweep_dir)
    if result is None or result.problems:
        return 2
    rc = 1 if result.unfinished or result.table_errors else 0
    if show_compare:
        shown = Path(sweep_dir) / "compare.md"
        print(shown.read_text() if shown.exists() else "compare: the sweep's experiment lists no paper tables "
              "(report.tables); nothing to compare")
    return rc


def newest_sweep(root: Path = Path("outputs") / "multirun") -> str | None:
    """The newest sweep folder ``<root>/<date>/<time>`` (the default output layout, relative to
    the current directory), announced on stdout; None with a one-line error when there is none."""
    sweeps = sorted(p for p in root.glob("*/*") if p.is_dir()) if root.is_dir() else []
    if not sweeps:
        print(f"error: collect: no sweep under '{root}'; pass the sweep folder: "
              "python -m robustbench_fm collect <multirun folder>", file=sys.stderr)
        return None
    print(f"collect: the newest sweep, {sweeps[-1]}")
    return str(sweeps[-1])


def compare(sweep_dir: str) -> int:
    """Rebuild the sweep's paper tables (``report.tables``) and print them beside the published
    values (``compare.md`` / ``compare.csv`` in the sweep folder); 2 with a one-line error."""
    from ..pipeline.job import job_manifest  # lazy: imports torch

    results = SweepResults(sweep_dir, load_manifest=job_manifest)
    if not results.root.is_dir() or results.config is None:
        print(f"error: compare: '{sweep_dir}' holds no finished run; pass a multirun or run folder", file=sys.stderr)
        return 2
    names = list((results.config.get("report") or {}).get("tables") or [])
    if not names:
        print(f"error: compare: the experiment of '{sweep_dir}' lists no paper tables; set report.tables",
              file=sys.stderr)
        return 2
    print(to_markdown(write_compare([t for name in names for t in get(name)(results)], results.root)))
    return 0


def _remove_dry_run_folder(out: Path, output_root: Path) -> None:
    """Hydra made the run folder (and its empty job log) before the job ran; a dry run (and an
    experiment none of whose jobs ran: a job's plan failed) leaves nothing behind, nor the empty
    date folders above it, up to (not including) ``paths.output_root``."""
    for handler in list(logging.root.handlers):
        if isinstance(handler, logging.FileHandler) and Path(handler.baseFilename).parent == out:
            handler.close()
            logging.root.removeHandler(handler)
    if not out.is_dir() or any(not (p.is_file() and p.suffix == ".log") for p in out.iterdir()):
        return
    for p in out.iterdir():
        p.unlink()
    folder = out
    while folder != output_root and output_root in folder.parents and not any(folder.iterdir()):
        folder.rmdir()
        folder = folder.parent


def unit_config(cfg):
    """The job's config with its ``hydra`` node when it is an experiment run as a unit without
    ``-m`` (:func:`robustbench_fm.pipeline.experiment.is_unit`), else None (one job, as always)."""
    import copy

    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    if HydraConfig.get().runtime.choices.get("experiment") == "collect":
        return None
    full = copy.deepcopy(cfg)
    with open_dict(full):
        full.hydra = HydraConfig.get()
    return full if is_unit(full) else None


def run_unit(full, cfg, run_dir: Path) -> int:
    """Run an experiment's jobs here (:func:`robustbench_fm.pipeline.experiment.run_jobs`) into
    ``run_dir``, or with ``dry_run=true`` list them; the exit code: 0, 1 when a job failed or a
    requested table could not be built, 2 when a job's plan fails (each distinct problem printed
    once with the jobs it stops; nothing runs and no run folder is left) or nothing could be
    collected."""
    if cfg.dry_run:
        rc = dry_run_sweep(full, unit_dir=run_dir)
        _remove_dry_run_folder(run_dir, Path(cfg.paths.output_root))
        return rc
    jobs = expand(full, with_configs=True)
    if jobs is None:
        print(f"error: the sweeper {full.hydra.sweeper.get('_target_')} lists its jobs only under -m; "
              "run the experiment with -m", file=sys.stderr)
        return 2
    try:  # every job's names, data folders and options before the first one runs
        check_jobs(jobs, run_dir)
    except JobsRefused as exc:
        for line in exc.lines:
            print(f"error: {line}", file=sys.stderr)
        print(f"error: {exc.summary}", file=sys.stderr)
        _remove_dry_run_folder(run_dir, Path(cfg.paths.output_root))
        return 2
    name = full.hydra.runtime.choices.get("experiment")
    print(f"experiment {name}: {len(jobs)} jobs, one after another in this process, then the collect step, "
          f"into {run_dir} (-m fans them out onto a launcher)", flush=True)
    result = run_jobs(jobs, run_dir, debug=bool(cfg.get("debug")))
    if result.collected is None:
        return 2
    return 0 if result.ok else 1


def _log_traceback(out_dir: Path, hc) -> Path | None:
    """The exception being handled, with its traceback, written to the job's log file (Hydra's
    ``<run folder>/<job name>.log``, else ``<run folder>/traceback.log``) and not to the console;
    returns the file."""
    import logging as _logging

    files = [h for h in _logging.root.handlers if isinstance(h, _logging.FileHandler)]
    handler = files[0] if files else None
    try:
        if handler is None:
            out_dir.mkdir(parents=True, exist_ok=True)
            handler = _logging.FileHandler(out_dir / "traceback.log")
            log_traceback(handler, f"{hc.job.name} failed with a bug")
            handler.close()
        else:
            log_traceback(handler, f"{hc.job.name} failed with a bug")
            handler.flush()
    except OSError:
        return None
    return Path(handler.baseFilename)


def doctor(selected: list[str]) -> int:
    """Print the doctor's report; 2 with a one-line error for an unknown encoder name."""
    from .doctor import report  # lazy: imports torch

    try:
        text = report(selected)
    except KeyError as exc:
        print(f"error: doctor: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 2
    print(text)
    return 0


def _settings() -> tuple[set[str], list[str]]:
    """The top-level names an override may start with (config.yaml's keys, the config groups,
    the keys the ``@package _global_`` configs add, ``hydra``) and every setting as a dotted path
    (``stage.params.k``), read from the YAML files alone (no composition)."""
    import yaml

    def leaves(node, prefix: str) -> list[str]:
        if not isinstance(node, dict) or not node:  # an empty mapping ({}) takes keys below it
            return [prefix]
        return [p for k, v in node.items() if k != "defaults" for p in leaves(v, f"{prefix}.{k}" if prefix else k)]


    roots, paths = {"hydra", *configstore.GROUPS}, []
    for path in [CONFIG_DIR / "config.yaml", *sorted(CONFIG_DIR.glob("*/*.yaml"))]:
        tree = yaml.safe_load(path.read_text()) or {}
        glob = path.parent == CONFIG_DIR or "@package _global_" in path.read_text().split("\n", 1)[0]
        if glob:
            roots |= set(tree)
        else:
            roots.add(path.parent.name)
        paths += leaves(tree, "" if glob else path.parent.name)
    paths += [p for group in configstore.GROUPS for tree in configstore.nodes(group).values()
              for p in leaves(tree, group)]
    return roots, sorted({p for p in paths if not p.startswith("hydra.") and not set(p) & set("+~@/")})


def user_config_dirs(argv: list[str]) -> list[Path]:
    """The user's own config folders on the command line: ``--config-dir``/``-cd <dir>`` and the
    ``file://`` entries of ``hydra.searchpath=[...]`` (Hydra's standard mechanisms)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    dirs: list[Path] = []
    for i, text in enumerate(argv):
        if text in ("--config-dir", "-cd") and i + 1 < len(argv):
            dirs.append(Path(argv[i + 1]))
        elif text.startswith(("--config-dir=", "-cd=")):
            dirs.append(Path(text.split("=", 1)[1]))
        elif text.lstrip("+").startswith("hydra.searchpath="):
            try:
                value = OverridesParser.create().parse_override(text).value()
            except HydraException:
                continue
            for entry in value if isinstance(value, list) else [value]:
                if str(entry).startswith("file://"):
                    dirs.append(Path(str(entry)[len("file://"):]))
    return dirs


def _unknown_group_option(key: str, override, extra_dirs: list[Path] = ()) -> str | None:
    """``encoder=planted_sharpp`` (an option of a config group that has no file): one line with the
    closest options, instead of Hydra's 60-line list of every option."""
    import difflib


    options = None if "." in key or "/" in key else group_options(CONFIG_DIR, key, extra_dirs)
    if options is None:
        return None
    values = list(override.sweep_string_iterator()) if override.is_sweep_override() else [override.value()]
    for value in values:
        if value is None or str(value) in options or str(value) == "null":
            continue
        close = difflib.get_close_matches(str(value), options, n=3)
        hint = f"did you mean {', '.join(close)}?" if close else f"run 'python -m robustbench_fm list {key}s'"
        noun = key[:-1] if key.endswith("s") else key
        return f"unknown {noun} '{value}'; {hint}"
    return None


def load_plugins(argv: list[str]) -> list[str]:
    """Import the modules the command line names in ``plugins=[...]`` (each registers its
    methods; docs/architecture.md, "Adding a method"); returns their names."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException


    names: list[str] = []
    parser = OverridesParser.create()
    for text in argv:
        if not text.lstrip("+~").startswith("plugins="):
            continue
        try:
            value = parser.parse_override(text).value()
        except HydraException:
            continue  # check_overrides reports it
        names += [str(v) for v in (value if isinstance(value, list) else [value]) if v]
    methods.load_plugins(names)
    if names:

        configstore.register()  # the plugins' stage=<name> configs
    return names


def check_overrides(argv: list[str]) -> str | None:
    """Why Hydra would refuse the command line's overrides, as one line with the fix, else None.

    A value Hydra's grammar cannot read (a space the shell split on, a non-ASCII letter,
    parentheses) gets the quoting that works in bash; a top-level name that is no setting
    (``k=1000``) gets the setting it most likely means (``stage.params.k``), instead of Hydra's
    traceback or its ``+k=1000`` advice (which would add an unused key)."""
    import difflib
    import shlex

    import yaml
    from hydra._internal.utils import get_args_parser
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType
    from hydra.errors import HydraException

    try:
        overrides = get_args_parser().parse_known_args(argv)[0].overrides or []
    except SystemExit:  # a malformed flag: Hydra reports it itself
        return None
    parser, roots, paths = OverridesParser.create(), None, None
    extra_dirs = user_config_dirs(argv)

    groups = {"hydra", *GROUPS, *(p.name for p in CONFIG_DIR.iterdir() if p.is_dir()),
              *(p.name for d in extra_dirs if d.is_dir() for p in d.iterdir() if p.is_dir()),
              *yaml.safe_load((CONFIG_DIR / "config.yaml").read_text())}
    for i, text in enumerate(overrides):
        try:
            override = parser.parse_override(text)
        except HydraException:
            # the shell split an unquoted value at its spaces: the pieces without '=' belong to it
            j, k = i, i
            while j > 0 and "=" not in overrides[j]:
                j -= 1
            while k + 1 < len(overrides) and "=" not in overrides[k + 1]:
                k += 1
            text = " ".join(overrides[j:k + 1]) if "=" in overrides[j] else text
            key, _, value = text.partition("=")
            inner = f"{key}='{value}'" if '"' in value else f'{key}="{value}"'
            return (f"could not parse override '{text}': quote values with spaces or special characters: "
                    f"{shlex.quote(inner)}")
        if override.type != OverrideType.CHANGE:  # +key / ++key / ~key: Hydra's own checks
            continue
        key = override.key_or_group
        unknown = _unknown_group_option(key, override, extra_dirs)
        if unknown is not None:
            return f"{unknown} (in override '{text}')"
        top = key.split("@")[0].split("/")[0].split(".")[0]
        value = text.partition("=")[2]
        if top in groups:  # most overrides: no YAML read
            if "." not in key or top == "hydra" or extra_dirs or "@" in key or "/" in key:
                continue
            if roots is None:
                roots, paths = _settings()
            if _known_path(key, paths):
                continue
            # Hydra would print "Could not override ... To append to your config use +key=value": a
            # key nothing reads. The real key: the same last part, the closest path.
            last = key.split(".")[-1]
            same = [p for p in paths if p.split(".")[-1] == last]
            close = difflib.get_close_matches(key, same, n=1, cutoff=0) if same else \
                difflib.get_close_matches(key, paths, n=1)
            hint = f"did you mean {close[0]}={value}?" if close else "print the settings with dry_run=true"
            return f"there is no setting '{key}' (in override '{text}'); {hint}"
        if roots is None:
            roots, paths = _settings()
        if top in roots:
            continue
        hint = _top_level_hint(key, value, override, paths, extra_dirs)
        return f"there is no setting '{key}' (in override '{text}'); {hint}"
    return None


#: the ``launcher=`` options (configs/launcher/) and Hydra's ``hydra/launcher=`` options that need a
#: Hydra launcher plugin: (the module that registers its configs, what it needs, the extra installing both)
LAUNCHER_PLUGINS = {
    "slurm": ("hydra_plugins.hydra_submitit_launcher.config", "submitit", "slurm"),
    "submitit_local": ("hydra_plugins.hydra_submitit_launcher.config", "submitit", "slurm"),
    "submitit_slurm": ("hydra_plugins.hydra_submitit_launcher.config", "submitit", "slurm"),
    "joblib": ("hydra_plugins.hydra_joblib_launcher.config", "joblib", "joblib"),
}


def missing_launcher(argv: list[str]) -> str | None:
    """A ``launcher=slurm`` (``submitit_local``, ``joblib``; or ``hydra/launcher=...``) whose Hydra
    plugin is not installed: one line naming the extra that installs it, instead of Hydra's "Could
    not find 'hydra/launcher/submitit_slurm'"; None when it is installed or no such launcher is named."""
    import importlib.util

    for text in argv:
        key, _, value = text.lstrip("+").partition("=")
        if key not in ("launcher", "hydra/launcher") or value not in LAUNCHER_PLUGINS:
            continue
        plugin, needs, extra = LAUNCHER_PLUGINS[value]
        for module in (plugin, needs):
            try:
                found = importlib.util.find_spec(module) is not None
            except ImportError:  # its parent package is missing
                found = False
            if not found:
                package = plugin.split(".")[1].replace("_", "-")
                return (f"{key}={value} needs the Hydra launcher plugin {package}, which is not installed here: "
                        f"pip install 'robustbench_fm[{extra}]'")
    return None


def rank(folder: str) -> int:
    """Rebuild the paired comparisons, the ranking and the report's "Which encoder" of a finished run or
    sweep from its saved results, without re-running anything (``comparisons.csv``, ``ranking.csv``,
    ``ranking_overall.csv``; :mod:`robustbench_fm.report.comparisons`); print the verdict. 2 with a one-line
    error when the folder holds no finished run or fewer than two encoders to compare."""
    results = SweepResults(folder)
    if not results.root.is_dir() or not results.job_dirs:
        print(f"error: rank: '{folder}' holds no finished run; pass a run folder (outputs/runs/<date>/<time>) or a "
              "multirun folder", file=sys.stderr)
        return 2
    found = build_comparisons(folder)
    if found.empty and found.notes:  # encoders to compare, but no metric that may be compared: say why
        print(f"error: rank: nothing in '{folder}' is compared: {found.notes[0]}", file=sys.stderr)
        for line in found.notes[1:]:
            print(f"note: {line}", file=sys.stderr)
        return 2
    if found.empty:
        print(f"error: rank: '{folder}' holds no two encoders scored on the same items by a stage that offers "
              "comparisons (CANDOR, heads, CRoMa, SPAR); run two or more encoders, e.g. encoders=[a,b]",
              file=sys.stderr)
        return 2
    for line in verdict(found):
        print(f"- {line}")
    for line in found.notes:
        print(f"note: {line}")
    print(f"rank: {len(found.pairs)} paired comparisons -> {Path(folder) / 'comparisons.csv'}, "
          f"{Path(folder) / 'ranking.csv'}")
    return 0


def _known_path(key: str, paths: list[str]) -> bool:
    """Whether ``key`` is a setting of the shipped configs: a leaf, a node above leaves, or a key
    below a leaf that holds a mapping, a list or null (``stage.params.transfer.<cohort>``)."""
    return any(p == key or p.startswith(key + ".") or key.startswith(p + ".") for p in paths)


def _top_level_hint(key: str, value: str, override, paths: list[str], extra_dirs: list[Path]) -> str:
    """The fix for a top-level name that is no setting: a config group whose option ``value`` is
    (``encodr=planted_sharp``: ``encoder=planted_sharp``) first, else settings ending in the same
    name or spelled alike."""
    import difflib

    last = key.split(".")[-1]
    if "." not in key:
        for group in difflib.get_close_matches(key, sorted({*GROUPS, *(p.name for p in CONFIG_DIR.iterdir()
                                                                        if p.is_dir())}), n=3):
            options = group_options(CONFIG_DIR, group, extra_dirs) or []
            if override.is_sweep_override() or str(override.value()) in options:
                return f"did you mean {group}={value}?"
    close = [p for p in paths if p.split(".")[-1] == last] or difflib.get_close_matches(key, paths, n=3)
    return f"did you mean {' or '.join(f'{c}={value}' for c in close[:3])}?" if close else \
        "print the settings with dry_run=true"


def _cli_folders(cfg, out_dir: Path) -> list:
    """The folders a job of ``cfg`` writes (:func:`robustbench_fm.pipeline.job.run_folders`)."""
    from omegaconf import OmegaConf

    from ..pipeline.job import run_folders  # lazy: imports torch

    return run_folders(out_dir, OmegaConf.select(cfg, "paths.output_root", default=None), cfg.paths.cache_dir,
                       resolved_prepared_dir(cfg))


def quiet_full_log_files() -> None:
    """A log file on a full disk stops taking records, instead of ``logging`` printing a
    ``--- Logging error ---`` traceback for each one; the run's own first write on that disk is
    then the one line naming the folder (:func:`robustbench_fm.pipeline.job.full_disk_line`). Any
    other failure of a log file is reported as ``logging`` does."""
    from ..pipeline.job import FULL_DISK  # lazy: imports torch

    for handler in logging.root.handlers:
        if not isinstance(handler, logging.FileHandler):
            continue

        def handle_error(record, handler=handler, report=handler.handleError):
            exc = sys.exc_info()[1]
            if isinstance(exc, OSError) and exc.errno in FULL_DISK:
                handler.setLevel(logging.CRITICAL + 1)  # no record reaches it any more
                return
            report(record)

        handler.handleError = handle_error


def stop_on_ctrl_c() -> None:
    """Ctrl-C (SIGINT) stops a run wherever it is (extraction, a stage, the report): exit 130, its
    ``status.json`` saying ``interrupted``, finished cache shards kept. Python raises
    ``KeyboardInterrupt`` on SIGINT only where the process did not start with SIGINT ignored; a
    command started in the background of a script (``cmd &``) or by a tool does, and the run would
    finish as if nothing happened, so a run takes SIGINT back (its decode workers still ignore it:
    :func:`robustbench_fm.features.engine.panel._init_worker`)."""
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


PROG = "python -m robustbench_fm"
#: a first word that can only be meant as a subcommand: no Hydra override (``key=value``, ``+key=``,
#: ``~key``) and no flag (``-m``, ``--help``, ``-cd``) looks like it
WORD = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")


class _Parser(argparse.ArgumentParser):
    """argparse with the command line's one-line errors: ``error: <subcommand>: <what> (usage:
    <its usage>)`` on stderr, exit 2 (a user error). ``subcommands``: the top parser's subcommand
    parsers by name, in the order :func:`parser` declares them."""

    subcommands: dict[str, argparse.ArgumentParser] = {}

    def error(self, message: str):
        name = self.prog.removeprefix(PROG).strip()
        usage = " ".join(self.format_usage().split()).removeprefix("usage: ")
        self.exit(2, f"error: {name + ': ' if name else ''}{message} (usage: {usage})\n")


def _list(args) -> int:
    try:
        text = listing(args.section)
    except UnknownName as exc:
        print(f"error: {message(exc)}", file=sys.stderr)
        return 2
    print(text)
    return 0


def _collect(args) -> int:
    sweep = args.sweep_dir or newest_sweep()
    return collect(sweep, args.compare) if sweep else 2


def parser() -> _Parser:
    """The subcommands, each with its arguments, what it does and the function that runs it
    (``handler``): the one place they are declared. ``python -m robustbench_fm <subcommand> --help``
    prints one's help; the Hydra app's ``--help`` lists them all from here (:func:`subcommand_help`).
    A command line whose first word is no subcommand is the Hydra app's (:func:`main`)."""
    top = _Parser(prog=PROG, description="The subcommands; a run takes Hydra overrides instead "
                  f"({PROG} --help).")
    sub = top.add_subparsers(dest="command", metavar="<subcommand>", required=True, parser_class=_Parser)

    def add(name: str, description: str, handler, *arguments: tuple[tuple, dict]) -> None:
        command = sub.add_parser(name, help=description, description=description)
        for names, options in arguments:
            command.add_argument(*names, **options)
        command.set_defaults(handler=handler)

    add("list", "what is registered, one line each", _list,
        (("section",), dict(nargs="?", metavar="|".join(SECTIONS), help="one section (default: all)")))
    add("doctor", "can each encoder run offline here? (packages, weights, access)",
        lambda a: doctor(a.encoders),
        (("encoders",), dict(nargs="*", metavar="encoder", help="registry names (default: every entry)")))
    add("verify", "re-hash cached feature shards (checksums, row counts, manifest)",
        lambda a: verify(a.path, a.manifest),
        (("path",), dict(metavar="<cache entry or cache root>")),
        (("manifest",), dict(nargs="?", help="the manifest the entry should cover")))
    add("collect", "merge a sweep again (default: the newest under outputs/multirun)", _collect,
        (("sweep_dir",), dict(nargs="?", metavar="<sweep folder>")),
        (("--compare",), dict(action="store_true", help="print its paper tables beside the published values")))
    add("compare", "its paper tables beside the published values", lambda a: compare(a.sweep_dir),
        (("sweep_dir",), dict(metavar="<sweep folder or run folder>")))
    add("rank", "its encoders' paired comparisons and ranking, rebuilt from finished results",
        lambda a: rank(a.folder), (("folder",), dict(metavar="<run folder or sweep folder>")))
    top.subcommands = sub.choices
    return top


def subcommand_help() -> str:
    """The subcommands as the Hydra app's ``--help`` lists them (``${subcommands:}`` in the help
    template of configs/config.yaml): each one's usage and what it does, from :func:`parser`."""
    rows = [(" ".join(p.format_usage().split()).removeprefix(f"usage: {PROG} ").replace(" [-h]", ""),
             p.description) for p in parser().subcommands.values()]
    width = max(len(usage) for usage, _ in rows)
    return "\n".join(f"  {usage.ljust(width)}   {text}" for usage, text in rows)


def run_subcommand(argv: list[str]) -> int:
    """Parse ``argv`` (its first word a subcommand, or a word meant as one) and run it; the exit
    code. An unknown word is one line with the closest subcommand, an argument the subcommand does
    not take one line with its usage (exit 2)."""
    import difflib

    top = parser()
    names = list(top.subcommands)
    if argv[0] not in names:
        close = difflib.get_close_matches(argv[0], names, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        top.exit(2, f"error: '{argv[0]}' is no subcommand; {hint}the subcommands: {', '.join(names)}; a run takes "
                 "Hydra overrides (key=value)\n")
    args, extra = top.parse_known_args(argv)
    if extra:
        top.subcommands[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    return args.handler(args)


def main() -> None:
    # where Hydra is used: the configs' resolvers and the generated encoder= / stage= options (importing
    # the package registers nothing); the subcommands read finished runs' configs with them too, as before
    configstore.register()
    if len(sys.argv) > 1 and WORD.fullmatch(sys.argv[1]):
        sys.exit(run_subcommand(sys.argv[1:]))
    import traceback

    stop_on_ctrl_c()
    import hydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import DictConfig, OmegaConf

    OmegaConf.register_new_resolver("subcommands", subcommand_help, replace=True)  # ${subcommands:} of --help

    @hydra.main(config_path=str(CONFIG_DIR), config_name="config", version_base="1.3")
    def _job(cfg: DictConfig) -> None:
        from ..pipeline.job import FULL_DISK, USER_ERRORS, RunFolderTaken, full_disk_line  # lazy: imports torch
        from ..pipeline.plan import plan  # lazy: as the job
        from .app import run  # lazy: imports torch

        install_log_redaction()
        quiet_full_log_files()
        hc = HydraConfig.get()
        overrides = list(hc.overrides.task)
        if hc.runtime.choices.get("experiment") == "collect":
            if cfg.get("sweep_dir") is None:
                print("error: experiment=collect needs sweep_dir=<multirun folder>", file=sys.stderr)
                sys.exit(2)
            rc = collect(str(cfg.sweep_dir), bool(cfg.get("compare")))
            if rc:
                sys.exit(rc)
            return
        # In a multirun a failed job is recorded (status.json) and the sweep goes on to the next
        # job; its collect step lists the failures and sets the exit code (sweeps.CollectCallback).
        multirun = hc.mode == RunMode.MULTIRUN
        out_dir = Path(hc.runtime.output_dir)
        where = f"job {out_dir.name}: " if multirun else ""
        unit = None if multirun else unit_config(cfg)
        try:
            if unit is not None:  # an experiment without -m: its jobs here, one after another
                sys.exit(run_unit(unit, cfg, out_dir))
            if cfg.dry_run:
                print(redacted_yaml(cfg))
                print(plan(cfg, overrides).describe())
                _remove_dry_run_folder(Path(hc.runtime.output_dir), Path(cfg.paths.output_root))
                return
            run(cfg, out_dir, overrides)
        except KeyboardInterrupt as exc:
            if cfg.get("debug"):
                traceback.print_exc()
            saved = f"{exc}; " if str(exc) else f"run folder {out_dir}; finished feature-cache shards are kept; "
            how = (f"re-run it with hydra.run.dir={out_dir} to resume (finished jobs are skipped)" if unit is not None
                   else "re-run the same command to resume")
            print(f"interrupted: {saved}{how}", file=sys.stderr)
            if multirun:
                print(f"the sweep stopped at {out_dir.name}; python -m robustbench_fm collect {hc.sweep.dir} "
                      "merges the jobs that finished", file=sys.stderr)
            sys.exit(130)
        except USER_ERRORS as exc:
            if cfg.get("debug"):
                if not multirun:
                    raise
                traceback.print_exc()
            if multirun and isinstance(exc, RunFolderTaken):  # the sweep fails: its folder holds another run
                REFUSED_FOLDERS.append(message(exc))
            print(f"error: {where}{message(exc)}", file=sys.stderr)
            if not multirun:
                sys.exit(2)
        except Exception as exc:  # a bug, not the user's input: one line, the traceback in the log
            if isinstance(exc, OSError) and exc.errno in FULL_DISK:  # the lock, a log: outside the run's own writes
                print(f"error: {where}{full_disk_line(exc, _cli_folders(cfg, out_dir))}", file=sys.stderr)
                if not multirun:
                    sys.exit(2)
                return
            if cfg.get("debug") and not multirun:
                raise
            log_file = _log_traceback(out_dir, hc)
            if cfg.get("debug"):
                traceback.print_exc()
            print(bug_line(exc, log_file, where), file=sys.stderr)
            if not multirun:
                sys.exit(1)

    logging.getLogger("robustbench_fm").setLevel(logging.INFO)
    try:
        load_plugins(sys.argv[1:])  # before Hydra composes: a plugin's stage must be a `stage=` option
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    problem = check_overrides(sys.argv[1:]) or missing_launcher(sys.argv[1:])  # before Hydra: its errors are tracebacks
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        sys.exit(2)
    try:
        _job()
    except KeyboardInterrupt:  # outside a job (composing the config, a sweep's collect step)
        print("interrupted", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
