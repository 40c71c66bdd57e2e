"""The command line's own help, listings and dry run, as a newcomer first meets them."""
import re
import subprocess
import sys
from pathlib import Path

import cli_process
import pytest

from robustbench_fm import methods as stages
from robustbench_fm.cli.main import SECTIONS, listing

pytestmark = pytest.mark.slow  # command-line subprocesses: the full suite runs them

ROOT = Path(__file__).resolve().parents[2]


def run(*args, cwd=ROOT, check=True):
    proc = cli_process.run(["-m", "robustbench_fm", *args], cwd=cwd, timeout=300,
                           env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"})
    if check:
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc


def test_help_lists_the_subcommands_and_groups():
    out = run("--help").stdout
    for sub in ("list", "doctor", "verify", "collect", "compare"):
        assert re.search(rf"^  {sub}\b", out, re.M), sub
    for group in ("dataset", "encoder", "stage", "experiment", "panel", "launcher"):
        assert re.search(rf"^{group}: ", out, re.M), group
    assert "is powered by Hydra" not in out and "== Config ==" not in out
    assert "planted_blur" in out and "chest_candor" in out  # the group options themselves


def test_help_lists_each_subcommand_as_the_parser_declares_it():
    """Issue 56: the Hydra app's --help lists the subcommands from the one parser (``rank`` too),
    each with its usage and what it does."""
    from robustbench_fm.cli.main import parser, subcommand_help

    out = run("--help").stdout
    assert subcommand_help() in out
    for name in parser().subcommands:
        assert re.search(rf"^  {name}\b", out, re.M), name
    assert re.search(r"^  rank <run folder or sweep folder> +its encoders' paired comparisons", out, re.M)


def test_list_imports_no_torch():
    code = ("import sys; from robustbench_fm.cli.main import listing; listing(); "
            "print(sorted(m for m in ('torch', 'torchvision', 'timm') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


@pytest.mark.parametrize("section", SECTIONS)
def test_list_columns_are_aligned(section):
    lines = listing(section).splitlines()
    assert lines[0] == f"{section}:"
    rows = lines[1:]
    assert len(rows) >= 3
    # the second column starts at the same offset on every row (header included)
    starts = {re.match(r"  \S+\s+", row).end() for row in rows}
    assert len(starts) == 1, rows[:5]


def test_every_stage_has_a_description():
    lines = listing("stages").splitlines()[2:]
    assert [line.split()[0] for line in lines] == stages.names()
    assert all(len(line.split(None, 1)[1]) > 20 for line in lines)
    assert "discordance" in dict(line.split(None, 1) for line in lines)["candor"]


def test_every_experiment_and_panel_has_a_title():
    for section in ("experiments", "panels"):
        rows = [line.split(None, 1) for line in listing(section).splitlines()[2:]]
        assert all(len(r) == 2 and len(r[1]) > 5 for r in rows), rows
    panels = dict(line.split(None, 1) for line in listing("panels").splitlines()[2:])
    assert panels["demo"] == "3: planted_blur, planted_sharp, random_vit_s"


def test_list_unknown_section_is_one_line():
    proc = run("list", "nosuch", check=False)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines() == [
        "error: list: unknown section 'nosuch'; choose one of encoders, datasets, stages, experiments, panels"]


def test_dry_run_prints_the_plan_in_words_and_leaves_no_folder(tmp_path):
    out = run("experiment=demo", "dry_run=true", f"paths.output_root={tmp_path}").stdout
    plan = out[out.index("plan (dry_run=true"):]
    assert "  encoders planted_blur, planted_sharp, random_vit_s (3)" in plan
    assert "  stage    candor on marker" in plan
    assert "k=5" in plan and "Plan(" not in out
    assert tmp_path.is_dir() and not list(tmp_path.rglob("*")), list(tmp_path.rglob("*"))  # no run folder, no data


def test_collect_without_a_folder_takes_the_newest_sweep(tmp_path):
    proc = run("collect", cwd=tmp_path, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: collect: no sweep under 'outputs/multirun'; pass the sweep folder: "
        "python -m robustbench_fm collect <multirun folder>"]
    for name in ("2026-11-30/09-00-00", "2026-12-01/08-00-00"):
        (tmp_path / "outputs" / "multirun" / name).mkdir(parents=True)
    proc = run("collect", cwd=tmp_path, check=False)
    assert "collect: the newest sweep, outputs/multirun/2026-12-01/08-00-00" in proc.stdout


@pytest.mark.parametrize("override, line", [
    ("encoder=planted_sharpp",
     "error: unknown encoder 'planted_sharpp'; did you mean planted_sharp, planted_blur? "
     "(in override 'encoder=planted_sharpp')"),
    ("encoder=planted_blur,plantd_sharp",
     "error: unknown encoder 'plantd_sharp'; did you mean planted_sharp, planted_blur? "
     "(in override 'encoder=planted_blur,plantd_sharp')"),
    ("experiment=nothing",
     "error: unknown experiment 'nothing'; run 'python -m robustbench_fm list experiments' "
     "(in override 'experiment=nothing')"),
])
def test_an_unknown_group_option_is_one_line_with_the_closest_names(override, line, tmp_path):
    proc = run("-m" if "," in override else "dry_run=true", override, cwd=tmp_path, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [line]  # not Hydra's list of all 48 encoders
    assert not list(tmp_path.iterdir())
