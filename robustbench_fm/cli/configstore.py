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
``configs/encoder/<name>.yaml``: adding an ``EncoderSpec`` to the registry adds the option.

:func:`register` runs when the package is imported (``robustbench_fm/__init__.py``, next to the
resolvers) and again in :func:`.main.main` before Hydra composes, so the Hydra app, the compose API
(``initialize_config_dir`` + ``compose``) and the launchers' job processes (which get Hydra's
singletons, the ConfigStore among them, and import the package) all see the same options.
"""
from __future__ import annotations

from pathlib import Path

from .. import encoders, methods
from ..methods.params import config_node

#: the config groups whose options are generated here (no YAML folder under configs/)
GROUPS = ("encoder", "stage")


def encoder_node(name: str) -> dict:
    """The ``encoder`` option ``name``: the registry name and the two settings a user may override.

    ``weights``: a local checkpoint file or folder (null: the entry's own weights);
    ``batch_size``: null = ``extract.batch_size``. The feature-cache key (features/key.py) hashes
    the registry entry and the weights actually loaded, not this node."""
    return {"name": name, "weights": None, "batch_size": None}


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
        return {name: encoder_node(name) for name in encoders.names()}
    if group == "stage":
        return {name: node for name in methods.names() if (node := stage_node(name)) is not None}
    raise KeyError(f"config group '{group}' is not generated; generated groups: {', '.join(GROUPS)}")


def register() -> None:
    """Store every generated option in Hydra's ConfigStore (idempotent: a second call re-stores
    the same nodes)."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    for group in GROUPS:
        for name, node in nodes(group).items():
            store.store(group=group, name=name, node=node, provider="robustbench_fm")


def group_options(config_dir: Path, group: str) -> list[str] | None:
    """The options ``group=<option>`` accepts: the YAML files of ``config_dir/<group>/`` and the
    generated ones; None when ``group`` is no config group."""
    folder = config_dir / group
    if not folder.is_dir() and group not in GROUPS:
        return None
    files = [p.stem for p in folder.glob("*.yaml")] if folder.is_dir() else []
    return sorted({*files, *(nodes(group) if group in GROUPS else ())})
