"""The package list lives here because pyproject.toml cannot add a mapped package to a find: the
shipped Hydra configs stay in ``configs/`` (where the experiments are edited) and are installed as
the package data ``robustbench_fm/_configs`` (found by ``robustbench_fm.data.cards.config_dir``)."""
from setuptools import find_namespace_packages, setup

setup(packages=[*find_namespace_packages(include=["robustbench_fm*"]), "robustbench_fm._configs"],
      package_dir={"robustbench_fm._configs": "configs"})
