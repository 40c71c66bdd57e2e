"""robustbench_fm: how frozen foundation encoders' feature geometry treats a finding and its
acquisition confounders, before any head is trained (CANDOR, CRoMa, SPAR-Bench).

Importing the package downloads nothing and imports no deep-learning library; see
``robustbench_fm.run`` (an experiment from Python, as the command line runs it),
``robustbench_fm.embed`` (a manifest's images through an encoder and the feature cache),
``robustbench_fm.evaluate``, ``robustbench_fm.data.build_manifest`` and
``robustbench_fm.encoders``.
"""
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version

try:
    __version__ = _version("robustbench_fm")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

from .api import embed, evaluate, run  # noqa: E402
from .core.results import Results  # noqa: E402

__all__ = ["Results", "embed", "evaluate", "run", "__version__"]
