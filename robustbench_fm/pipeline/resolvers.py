"""The OmegaConf resolvers of the shipped configs, registered with the generated config options
(:func:`robustbench_fm.pipeline.configstore.register`) where Hydra is used: the command line before
it composes, ``robustbench_fm.run`` before it composes; the launchers' job processes get them from
Hydra's singleton state. Importing the package registers nothing.

* ``${launch_dir:}``: the directory the command was run from (``paths.root``). Unlike
  ``${hydra:runtime.cwd}`` it also resolves where Hydra's job config is not set: when a multirun
  builds its sweep folder, and in a config composed with ``hydra.compose`` (there: the current
  directory). Inside a job it is Hydra's ``runtime.cwd``, so ``hydra.job.chdir=true`` does not
  move it. Cached per config: a sweep's jobs (also in submitit's subprocesses, which get the
  sweep's resolver cache) see the value of the sweep's own process.
* ``${sweep_values:${encoders},${encoder.name}}``: the sweeper's ``encoder`` list, the panel as
  ``a,b,c`` or else the one encoder.
* ``${csv_root:${dataset.manifest}}`` and ``${csv_findings:${dataset.manifest}}`` (``dataset=csv``):
  the CSV's folder (the current directory while no CSV is set) and its 0/1 finding columns
  (:func:`robustbench_fm.data.csv_manifest.finding_columns`); neither raises: a missing CSV is
  reported in one line when the manifest is built.
* ``${feature_set:${features_file},${features_encoder}}`` and
  ``${feature_data:${manifest_file},${features_dataset}}`` (``experiment=from_features``): the names
  of the user's feature set and data (:func:`robustbench_fm.pipeline.plan.features_names`), so its
  job folders are named after them.
"""
from __future__ import annotations

import os
from pathlib import Path

from omegaconf import OmegaConf

from ..data.csv_manifest import finding_columns
from .plan import feature_set_name


def launch_dir() -> str:
    """Hydra's ``runtime.cwd`` when a Hydra job config is set, else the current directory."""
    from hydra.core.hydra_config import HydraConfig  # lazy: read only when it resolves (a job's runtime.cwd)

    if HydraConfig.initialized():
        cwd = HydraConfig.get().runtime.get("cwd")
        if cwd:
            return str(cwd)
    return os.getcwd()


def sweep_values(encoders, name) -> str:
    """The sweeper's value list for ``encoder``: the panel as ``a,b,c``, else the one encoder."""
    return ",".join(str(e) for e in encoders) if encoders else str(name)


def csv_root(manifest) -> str:
    """The folder of ``dataset.manifest`` (the current directory while it is unset)."""
    return str(Path(str(manifest)).parent) if manifest else "."


def csv_findings(manifest) -> list[str]:
    """The finding columns of ``dataset.manifest`` ([] while it is unset or missing)."""
    return finding_columns(manifest)


def feature_set(features_file, name=None) -> str:
    """The name of a bring-your-own feature set: ``name`` when set, else its file's (a cache
    entry: its encoder folder; :func:`robustbench_fm.pipeline.plan.feature_set_name`)."""
    return str(name) if name else feature_set_name(features_file) if features_file else "features"


def feature_data(manifest_file, name=None) -> str:
    """The name of a bring-your-own feature set's data: ``name`` when set, else the manifest's stem."""
    return str(name) if name else Path(str(manifest_file)).stem if manifest_file else "manifest"


def register() -> None:
    """Register the resolvers (idempotent)."""
    OmegaConf.register_new_resolver("launch_dir", launch_dir, use_cache=True, replace=True)
    OmegaConf.register_new_resolver("sweep_values", sweep_values, replace=True)
    OmegaConf.register_new_resolver("csv_root", csv_root, replace=True)
    OmegaConf.register_new_resolver("csv_findings", csv_findings, replace=True)
    OmegaConf.register_new_resolver("feature_set", feature_set, replace=True)
    OmegaConf.register_new_resolver("feature_data", feature_data, replace=True)
