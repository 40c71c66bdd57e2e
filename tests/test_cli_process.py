"""The suite's fork server for command-line runs (tests/fixtures/cli_process.py) gives what a fresh
``python -m robustbench_fm`` gives: the same stdout, stderr and exit status, in the working directory,
environment and ``PYTHONPATH`` it is handed, and a timeout that kills the command."""
import os
import subprocess
import sys

import cli_process
import pytest


def _both(args, **kwargs):
    real = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, **kwargs)
    return real, cli_process.run(args, **kwargs)


@pytest.mark.parametrize("args", [["-m", "robustbench_fm", "list", "datasets"],
                                  ["-m", "robustbench_fm", "stage.params.k=0"],
                                  ["-m", "robustbench_fm", "+stage.parms.k=3"]])
def test_output_and_exit_status_equal_a_fresh_interpreters(args, tmp_path):
    real, forked = _both(args, cwd=tmp_path)
    assert (forked.returncode, forked.stdout, forked.stderr) == (real.returncode, real.stdout, real.stderr)
    assert forked.args == [sys.executable, *args]


def test_cwd_environment_pythonpath_stdin_and_timeout(tmp_path):
    (tmp_path / "plug").mkdir()
    (tmp_path / "plug" / "sitecustomize_probe.py").write_text("VALUE = 41\n")
    # a plugin the command imports from PYTHONPATH (the CLI's plugins=[...]) prints where it ran and what it saw
    (tmp_path / "plug" / "where_probe.py").write_text(
        "import os, sys, sitecustomize_probe\n"
        "print(os.getcwd(), os.environ.get('PROBE'), sitecustomize_probe.VALUE + 1, sys.stdin.read().strip())\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "plug"), "PROBE": "seen"}
    proc = cli_process.run(["-m", "robustbench_fm", "plugins=[where_probe]", "dry_run=true"], cwd=tmp_path, env=env,
                           input="from stdin\n")
    assert proc.returncode == 0 and f"{tmp_path} seen 42 from stdin" in proc.stdout.splitlines(), \
        proc.stdout[-2000:] + proc.stderr[-2000:]
    with pytest.raises(subprocess.TimeoutExpired):
        cli_process.run(["-m", "robustbench_fm", "experiment=demo"], cwd=tmp_path, timeout=0.5)
    after = cli_process.run(["-m", "robustbench_fm", "list", "datasets"], cwd=tmp_path)  # the server lives on
    assert after.returncode == 0 and "planted" in after.stdout
