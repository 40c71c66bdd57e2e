"""Issue 54 item 12: the Slurm commands of docs/sweeps-and-clusters.md without the ``slurm`` extra
printed Hydra's "Could not find 'hydra/launcher/submitit_slurm'" (exit 1). A launcher whose Hydra
plugin is missing is one line naming the extra that installs it, exit 2, before Hydra composes.
The plugin is hidden by a package of the same name first on the path that registers nothing, as
an environment without it looks to Hydra."""
import os
from pathlib import Path

import cli_process
import pytest

REPO = Path(__file__).resolve().parents[2]


def _without(tmp_path, package):
    (tmp_path / "hidden" / "hydra_plugins" / package).mkdir(parents=True)
    (tmp_path / "hidden" / "hydra_plugins" / package / "__init__.py").write_text("")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "hidden"), str(REPO)])}


@pytest.mark.parametrize("args, package, line", [
    (["launcher=slurm", "hydra.launcher.partition=gpu"], "hydra_submitit_launcher",
     "error: launcher=slurm needs the Hydra launcher plugin hydra-submitit-launcher, which is not installed here: "
     "pip install 'robustbench_fm[slurm]'"),
    (["launcher=submitit_local", "dry_run=true"], "hydra_submitit_launcher",
     "error: launcher=submitit_local needs the Hydra launcher plugin hydra-submitit-launcher, which is not installed "
     "here: pip install 'robustbench_fm[slurm]'"),
    (["launcher=joblib"], "hydra_joblib_launcher",
     "error: launcher=joblib needs the Hydra launcher plugin hydra-joblib-launcher, which is not installed here: "
     "pip install 'robustbench_fm[joblib]'"),
])
def test_a_launcher_without_its_plugin_names_the_extra_to_install(tmp_path, args, package, line):
    proc = cli_process.run(["-m", "robustbench_fm", "-m", "panel=demo", "dataset=planted", f"paths.root={tmp_path}",
                            *args], cwd=tmp_path, env=_without(tmp_path, package), timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines() == [line]
    assert not (tmp_path / "outputs").exists()


def test_an_installed_launcher_plugin_is_not_refused():
    from robustbench_fm.cli.main import missing_launcher

    assert missing_launcher(["-m", "launcher=slurm", "hydra.launcher.partition=gpu"]) is None  # dev installs it
    assert missing_launcher(["launcher=local"]) is None
