"""Config-group options generated from the Python registries, stored in Hydra's ConfigStore.

The ``stage`` group has one option per registered stage with a parameter class
(:mod:`robustbench_fm.methods`): its ``name``, its default ``findings``
(:attr:`robustbench_fm.methods.Method.findings`) and ``params`` from
:func:`robustbench_fm.methods.params.config_node` (each field's default, or the interpolation its
metadata names: ``${seed}``, ``${device}``). There is no ``configs/stage/<name>.yaml``:
``stage=<name>``, ``stage.params.k=3`` and ``- override /stage: candor`` work on the generated
options, and a plugin's stage gets one when its module is imported (``plugins=[...]``).

The ``encoder`` group has one option per entry of the encoder registry
(:mod:`robustbench_fm.encoders`), ``{name, weights: null, batch_size: null}``: everything else an
encoder needs (preprocessing, pooling, weights, a slide aggregator's tile encoder) is bound to its
registry entry, so the option holds only what a user may set on the command line
(``encoder.weights=<file or folder>``, ``encoder.batch_size=<n>``). There is no
``configs/encoder/<name>.yaml``: adding an ``EncoderSpec`` to the registry adds the option. Three more
options, ``timm``, ``hf`` and ``open_clip``, are the generic entries (:func:`generic_node`): a model
id instead of a registry entry; a user makes one permanent with a YAML card in their own config
folder (``encoder/<name>.yaml`` holding ``name: timm``, ``model: ...`` and the other keys of
:func:`generic_node`; README, "Your own data and encoder").

:func:`register` stores them, with the configs' resolvers (:mod:`.resolvers`), where Hydra is used
and nowhere else (importing the package registers nothing): in :func:`robustbench_fm.cli.main.main`
before Hydra composes (and again after ``plugins=[...]`` added stages) and in
:func:`robustbench_fm.pipeline.experiment.run_experiment` (``robustbench_fm.run``) before it
composes. The launchers' job processes get both from Hydra's singleton state (the ConfigStore and
OmegaConf's resolvers), which the launcher hands each job. Code that composes the shipped configs
with Hydra's API itself (``initialize_config_dir`` + ``compose``) calls :func:`register` first.
"""
from __future__ import annotations

from pathlib import Path

from .. import encoders, methods
from ..encoders import generic
from ..methods.params import config_node
from . import resolvers

#: the config groups whose options are generated here (no YAML folder under configs/)
GROUPS = ("encoder", "stage")


def encoder_node(name: str) -> dict:
    """The ``encoder`` option ``name``: the registry name and the two settings a user may override.

    ``weights``: a local checkpoint file or folder (null: the entry's own weights);
    ``batch_size``: null = ``extract.batch_size``. The feature-cache key (features/key.py) hashes
    the registry entry and the weights actually loaded, not this node."""
    return {"name": name, "weights": None, "batch_size": None}


def generic_node(kind: str) -> dict:
    """The ``encoder`` option of a generic entry (``encoder=timm|hf|open_clip``,
    robustbench_fm/encoders/generic.py): ``model`` (a model id or folder; required),
    ``pretrained`` (open_clip's pretrained tag), ``weights`` (``random``, a file or a folder; null: the
    hub's), ``embedding`` (cls | patch_mean | pooled; null: the kind's default) and ``batch_size``."""
    return {"name": kind, "model": None, "pretrained": None, "weights": None, "embedding": None, "batch_size": None}


def stage_node(name: str) -> dict | None:
    """The ``stage`` option ``name`` (None for a stage without a parameter class)."""
    method = methods.method(name)
    if method.params is None:
        return None
    findings = method.findings if isinstance(method.findings, str) else list(method.findings)
    return {"name": name, "findings": findings, "params": config_node(method.params)}


def nodes(group: str) -> dict[str, dict]:
    """Every generated option of ``group``, by option name."""
    if group == "encoder":
        return {**{name: encoder_node(name) for name in encoders.names()},
                **{kind: generic_node(kind) for kind in generic.GENERIC}}
    if group == "stage":
        return {name: node for name in methods.names() if (node := stage_node(name)) is not None}
    raise KeyError(f"config group '{group}' is not generated; generated groups: {', '.join(GROUPS)}")


def register() -> None:
    """What composing the shipped configs needs: the configs' resolvers (:func:`.resolvers.register`)
    and every generated option stored in Hydra's ConfigStore. Idempotent: a second call registers the
    same resolvers and re-stores the same nodes (and stores the options of stages registered since,
    a plugin's)."""
    from hydra.core.config_store import ConfigStore  # lazy: Hydra only where a config is composed

    resolvers.register()
    store = ConfigStore.instance()
    for group in GROUPS:
        for name, node in nodes(group).items():
            store.store(group=group, name=name, node=node, provider="robustbench_fm")


def group_options(config_dir: Path, group: str, extra_dirs: list[Path] = ()) -> list[str] | None:
    """The options ``group=<option>`` accepts: the YAML files of ``config_dir/<group>/`` and of the
    user's config folders (``--config-dir``, ``hydra.searchpath``) and the generated ones; None when
    ``group`` is no config group."""
    folders = [d / group for d in (config_dir, *extra_dirs) if (d / group).is_dir()]
    if not folders and group not in GROUPS:
        return None
    files = [p.stem for folder in folders for p in folder.glob("*.yaml")]
    return sorted({*files, *(nodes(group) if group in GROUPS else ())})
