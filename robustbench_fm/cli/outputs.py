"""The run's output folder must be writable: checked before Hydra creates it (a Hydra callback,
``hydra.callbacks.output_folder`` in ``configs/config.yaml``), so that a read-only or unwritable
``paths.output_root`` is one line naming the folder and the setting to change instead of an
``OSError`` traceback from inside Hydra."""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf


def unwritable(folder: str | Path) -> str | None:
    """Why ``folder`` cannot be created or written (the OSError, one line), else None. Creates the
    folder (as Hydra would next) and one empty temp file in it, then removes the file."""
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-probe-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return " ".join(str(exc).split())
    return None


def folder_error(folder: str, why: str, key: str, output_root: str | None) -> str:
    """The one-line error for an unwritable run (``key="hydra.run.dir"``) or sweep folder."""
    inside = output_root is not None and Path(folder).resolve().is_relative_to(Path(output_root).resolve())
    fix = "paths.output_root=<a writable folder>" if inside else f"{key}=<a writable folder>"
    return f"cannot write the output folder '{folder}' ({why}); set {fix}"


class OutputFolderCheck(Callback):
    """Exit with code 2 and one ``error:`` line when the run's (or sweep's) folder is not writable."""

    def _check(self, config: DictConfig, key: str) -> None:
        if config.get("dry_run"):  # a dry run writes nothing
            return
        HydraConfig.instance().set_config(config)  # resolves ${hydra:...} in paths.root
        folder = OmegaConf.select(config, key)
        if folder is None:
            return
        why = unwritable(str(folder))
        if why is not None:
            root = OmegaConf.select(config, "paths.output_root", default=None)
            print(f"error: {folder_error(str(folder), why, key, None if root is None else str(root))}",
                  file=sys.stderr)
            sys.exit(2)

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._check(config, "hydra.run.dir")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._check(config, "hydra.sweep.dir")
