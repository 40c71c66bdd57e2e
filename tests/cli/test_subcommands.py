"""Issue 56: the subcommands are declared once, by an argparse parser (``cli.main.parser``), instead
of comparisons of ``sys.argv[1]``: each one's arguments, help and handler; a word meant as a
subcommand that is none, or a missing or extra argument, is one line and exit 2."""
import sys

import pytest

from robustbench_fm.cli import main as cli

NAMES = ["list", "doctor", "verify", "collect", "compare", "rank"]


def run_main(monkeypatch, *argv) -> int:
    monkeypatch.setattr(sys, "argv", ["robustbench_fm", *argv])
    with pytest.raises(SystemExit) as done:
        cli.main()
    return done.value.code


def test_the_parser_declares_every_subcommand_with_its_arguments():
    parser = cli.parser()
    assert list(parser.subcommands) == NAMES
    args = parser.parse_args(["collect", "--compare", "sweeps/a"])
    assert (args.command, args.sweep_dir, args.compare) == ("collect", "sweeps/a", True)
    args = parser.parse_args(["verify", "entry", "m.csv"])
    assert (args.path, args.manifest) == ("entry", "m.csv")
    assert parser.parse_args(["doctor", "a", "b"]).encoders == ["a", "b"]
    assert parser.parse_args(["list"]).section is None
    lines = cli.subcommand_help().splitlines()  # what --help lists (configs/config.yaml: ${subcommands:})
    assert [line.split()[0] for line in lines] == NAMES
    assert lines[-1].startswith("  rank <run folder or sweep folder>   ")


def test_a_subcommand_runs_its_handler(monkeypatch, capsys):
    assert run_main(monkeypatch, "list", "stages") == 0
    assert capsys.readouterr().out == cli.listing("stages") + "\n"


def test_an_unknown_subcommand_is_one_line_with_the_closest_one(monkeypatch, capsys):
    assert run_main(monkeypatch, "lst", "stages") == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: 'lst' is no subcommand; did you mean 'list'? the subcommands: list, doctor, verify, collect, "
        "compare, rank; a run takes Hydra overrides (key=value)"]


@pytest.mark.parametrize("argv, line", [
    (["rank"], "error: rank: the following arguments are required: <run folder or sweep folder> "
               "(usage: python -m robustbench_fm rank [-h] <run folder or sweep folder>)"),
    (["collect", "a", "b"], "error: collect: unrecognized arguments: b "
                            "(usage: python -m robustbench_fm collect [-h] [--compare] [<sweep folder>])"),
    (["compare", "a", "--fast"], "error: compare: unrecognized arguments: --fast "
                                 "(usage: python -m robustbench_fm compare [-h] <sweep folder or run folder>)"),
    (["list", "nosuch"], "error: list: unknown section 'nosuch'; choose one of encoders, datasets, stages, "
                         "experiments, panels"),
])
def test_a_wrong_argument_is_one_line_and_exit_2(monkeypatch, capsys, argv, line):
    assert run_main(monkeypatch, *argv) == 2
    assert capsys.readouterr().err.splitlines() == [line]
