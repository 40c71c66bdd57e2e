"""The command line's ``stage`` configs, generated from the methods registry: for every registered
stage with a parameter class, a Hydra ConfigStore node ``stage/<name>`` holding its ``name``, its
default ``findings`` (:attr:`robustbench_fm.methods.Method.findings`) and ``params`` from
:func:`robustbench_fm.methods.params.config_node` (each field's default, or the interpolation its
metadata names: ``${seed}``, ``${device}``, ...). They replace the YAML files of
``configs/stage/``: ``stage=<name>``, ``stage.params.k=3`` and ``- override /stage: candor`` in an
experiment work as before.

:func:`register` must run before any config is composed: the package's import does it (next to the
resolvers), so the Hydra app, the compose API and the launchers' job processes all have the nodes.
"""
from __future__ import annotations

from .. import methods
from ..methods.params import config_node

#: the config group the nodes fill
GROUP = "stage"


def nodes() -> dict[str, dict]:
    """name -> the ``stage`` node of every registered stage that has a parameter class."""

    out = {}
    for name in methods.names():
        method = methods.method(name)
        if method.params is None:
            continue
        findings = method.findings if isinstance(method.findings, str) else list(method.findings)
        out[name] = {"name": name, "findings": findings, "params": config_node(method.params)}
    return out


def options() -> list[str]:
    """The options of the ``stage`` group (``stage=<option>``)."""
    return sorted(nodes())


def register() -> None:
    """Store every node in Hydra's ConfigStore as ``stage/<name>`` (idempotent)."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    for name, node in nodes().items():
        store.store(group=GROUP, name=name, node=node)
