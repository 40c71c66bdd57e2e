"""Test-wide settings (never touch the network) and shared fixtures.

The tests mirror the package (``tests/core``, ``tests/data``, ``tests/methods/candor``, ...);
helpers shared across folders live in ``tests/fixtures/`` (on ``sys.path`` here, imported by bare
name, e.g. ``from feature_fixtures import tiny_encoder``)."""
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

PYCACHE_ENV = "PYTHONPYCACHEPREFIX"


def pytest_configure(config):
    """One bytecode cache for the whole run when the environment writes none
    (``PYTHONDONTWRITEBYTECODE=1`` over a virtualenv without ``__pycache__``): otherwise every
    ``python -m robustbench_fm`` subprocess the suite starts compiles torch, sklearn, pandas, ...
    from source again (~10 s of CPU each, half a planted run's). The controller makes the folder and
    the workers and subprocesses inherit it (``PYTHONPYCACHEPREFIX``; Python validates each file
    against its source, so nothing stale is read); removed when the run ends."""
    if not sys.dont_write_bytecode and PYCACHE_ENV not in os.environ:
        return  # bytecode is written where it belongs (the usual case): nothing to do
    if PYCACHE_ENV not in os.environ:  # the controller (or a run without xdist)
        os.environ[PYCACHE_ENV] = tempfile.mkdtemp(prefix="robustbench_fm-pycache-")
        config._robustbench_pycache = os.environ[PYCACHE_ENV]
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.pycache_prefix = os.environ[PYCACHE_ENV]  # this process's later imports (torch, ...) fill it too
    sys.dont_write_bytecode = False


def pytest_unconfigure(config):
    folder = getattr(config, "_robustbench_pycache", None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


#: the modules that take longest (seconds of one worker, ``--durations`` on the 2-core AMD EPYC host,
#: fixtures included), longest first: they start first, so that on two xdist workers the last
#: modules to finish are short ones (longest-first scheduling). With pytest-xdist's own order (scopes
#: by number of tests, pyproject.toml's ``--no-loadscope-reorder`` turns it off) a one-test module of
#: a minute (test_real_demo.py) started last and one worker idled while the other ran it.
SLOWEST_FIRST = (
    "tests/report/test_calibration.py",                    # ~330 s: four classes (designs), a scope each
    "tests/methods/spar/test_spar_demo.py",                # ~250 s: experiment=spar_demo as written
    "tests/e2e/test_readme.py",                            # ~200 s: every command of the README and docs
    "tests/methods/candor/test_candor_ablations_e2e.py",   # ~140 s
    "tests/features/test_resume.py",                       # ~85 s
    "tests/cli/test_experiment_unit.py",                   # ~70 s
    "tests/cli/test_panel_jobs.py",                        # ~70 s
    "tests/cli/test_prepared_images.py",                   # ~66 s
    "tests/cli/test_demo.py",                              # ~65 s
    "tests/cli/test_real_demo.py",                         # ~62 s
    "tests/cli/test_sweeps.py",                            # ~50 s
    "tests/cli/test_first_hour.py",                        # ~45 s
    "tests/e2e/test_install.py",                           # ~40 s
    "tests/methods/spar/test_spar_experiment_unit.py",     # ~38 s
    "tests/methods/candor/test_real_images.py",            # ~35 s
    "tests/methods/candor/test_chest_candor_e2e.py",       # ~31 s
    "tests/e2e/test_bench_scripts.py",                     # ~30 s
)


@pytest.fixture(scope="session", autouse=True)
def _hydra_configs():
    """Many tests compose the shipped configs with Hydra's API themselves (``initialize_config_dir`` +
    ``compose``): the resolvers and the generated encoder= / stage= options are registered first, as
    the command line and ``robustbench_fm.run`` do (importing the package registers nothing)."""
    from robustbench_fm.pipeline import configstore

    configstore.register()


def pytest_collection_modifyitems(config, items):
    """The modules of :data:`SLOWEST_FIRST` first, in its order; every other module after them in
    collection order; the tests of a module stay together and in their order (module-scoped
    fixtures are built once, as before)."""
    rank = {module: i for i, module in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


pytest_plugins = ["pathorob_roots"]  # PathoROB dataset roots (adapters, shortcut, CRoMa tests)


@pytest.fixture(scope="module")
def encoder():
    """The seeded tiny conv encoder of the extraction and cache tests (feature_fixtures.py)."""
    from feature_fixtures import tiny_encoder

    return tiny_encoder()
