"""A non-editable install: the wheel built from this tree, installed into a fresh
virtual environment and run from another folder, finds its configs (package data
``robustbench_fm/_configs``), lists the encoders, runs the planted-data CANDOR job, and takes a
user's own config folder through Hydra's ``hydra.searchpath`` (an encoder card of a generic entry).

The fresh venv gets the heavy dependencies (torch, timm, ...) by a ``.pth`` line naming this
interpreter's site-packages, after its own: nothing is downloaded, and the robustbench_fm it imports
is the installed wheel, never this checkout (checked)."""
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
BUILD_FILES = ("pyproject.toml", "setup.py", "README.md", "robustbench_fm", "configs")


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "PYTHONPATH", "VIRTUAL_ENV"))}
    env["HF_HUB_OFFLINE"] = "1"
    return env


def _run(args, cwd, timeout=900):
    proc = subprocess.run([str(a) for a in args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{args} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    """(the fresh venv's python, a folder outside the checkout) with the wheel installed."""
    tmp = tmp_path_factory.mktemp("install")
    src = tmp / "src"
    src.mkdir()
    for name in BUILD_FILES:  # a copy, so the build leaves nothing (build/, egg-info) in the checkout
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(path, src / name)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", tmp / "wheels", src],
         cwd=tmp)
    (wheel,) = (tmp / "wheels").glob("robustbench_fm-*.whl")
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", venv], cwd=tmp)
    python = venv / "bin" / "python"
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=tmp).strip())
    shared = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (site / "zz_shared_dependencies.pth").write_text("".join(f"{p}\n" for p in shared))
    _run([python, "-m", "pip", "install", "--no-deps", "--no-index", "-q", wheel], cwd=tmp)
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir()
    return python, elsewhere


def test_the_installed_package_is_the_wheel_with_its_configs(installed):
    python, elsewhere = installed
    out = _run([python, "-c", "import robustbench_fm, robustbench_fm.cli.main as m; "
                "print(robustbench_fm.__file__); print(m.CONFIG_DIR); print(len(list(m.CONFIG_DIR.rglob('*.yaml'))))"],
               cwd=elsewhere)
    module, config_dir, n_yaml = out.split()
    venv = python.parent.parent
    assert Path(module).is_relative_to(venv) and not Path(module).is_relative_to(REPO)
    assert Path(config_dir) == Path(module).parent / "_configs"
    assert int(n_yaml) == len(list((REPO / "configs").rglob("*.yaml")))  # every shipped YAML, nested ones too


def test_installed_command_lists_encoders_and_runs_the_planted_candor_job(installed):
    python, elsewhere = installed
    listing = _run([python.parent / "robustbench-fm", "list", "encoders"], cwd=elsewhere)
    rows = {line.split()[0] for line in listing.splitlines()[2:] if line.strip()}
    assert {"planted_sharp", "random_vit_s", "rad_dino", "timm", "hf", "open_clip"} <= rows
    out = _run([python, "-m", "robustbench_fm", "dataset=planted", "dataset.options.n=40", "dataset.options.size=64",
                "encoder=planted_sharp", "stage=candor", "stage.params.n_boot=50"], cwd=elsewhere)
    row = "| planted_sharp | marker | planted | marker | 20 | 20 | 0.000 | 0.000 | 0.000 | 0.000 | 0.000 | 1.000 |"
    assert row in out.splitlines()  # D = 0 exactly: the sharp encoder sees the marker
    assert (elsewhere / "outputs" / "demo_data" / "planted" / "labels.csv").is_file()  # under the folder run from


def test_a_users_config_folder_adds_an_encoder_card(installed):
    python, elsewhere = installed
    conf = elsewhere / "my_configs" / "encoder"
    conf.mkdir(parents=True)
    (conf / "my_vit.yaml").write_text("# my encoder: a timm architecture, random weights\nname: timm\n"
                                      "model: vit_tiny_patch16_224\nweights: random\nembedding: cls\n"
                                      "pretrained: null\nbatch_size: null\n")
    out = _run([python, "-m", "robustbench_fm", f"hydra.searchpath=[file://{conf.parent}]", "encoder=my_vit",
                "dataset=planted", "dataset.options.n=40", "dataset.options.size=64", "stage.params.n_boot=50"],
               cwd=elsewhere)
    row = next(line for line in out.splitlines() if line.startswith("| timm-vit_tiny_patch16_224 | marker |"))
    assert row.split("|")[5].strip() == "20"  # n_queries: every positive of the 40 images
