"""One loader per library: ``spec + weights -> Encoder``.

Importing this package registers the loaders (``@register_loader``): timm, open_clip,
transformers and torchxrayvision (core dependencies), and the optional-package loaders of
:mod:`.package_loaders` (CONCH, MUSK, FLAIR, PanDerm, SAM-Med2D, CONCH v1.5 via TITAN), which
import their package only when such an entry is loaded. Each loader takes
``(spec, weights, device, allow_remote_code)`` and returns an
:class:`~robustbench_fm.encoders.base.Encoder` whose ``forward`` pools features as the spec says
and whose ``weights_id`` names the exact weights (it enters the feature-cache key).

Local ``weights`` always win (also over a random entry); then a random entry draws its weights;
otherwise the hub weights are used.

* ``random:seed=<s>``: ``spec.pretrained`` is False; the weights are drawn under
  ``torch.random.fork_rng()`` + ``torch.manual_seed(seed)`` on the CPU, so the same seed gives
  bit-identical weights on any machine and the caller's global RNG is left untouched.
* ``file:sha256:<hex16>``: a local checkpoint file (SHA-256 of its bytes) or folder (SHA-256 over
  its weight files, sorted by name, each preceded by its name).
* ``hub:<hub_id>@<commit>``: downloaded (or cached) hub weights; the commit is the spec's pinned
  revision, else the one the local Hugging Face cache resolved the ref to, else the ref itself.

Offline (``HF_HUB_OFFLINE=1``) a hub entry is looked up in the local cache before any library
call, so a missing checkpoint fails at once with one line naming the hub id (and its gating)
instead of retrying the network. Local weights never touch the hub.

Modules: :mod:`.hub` (cache, commits, errors), :mod:`.weights` (random and local weights),
:mod:`.preprocessing`, :mod:`.pooling`, :mod:`.extras` (optional packages), and one ``<library>_loader`` module per
library.
"""
from . import (  # noqa: F401  (register the loaders)
    open_clip_loader,
    package_loaders,
    timm_loader,
    transformers_loader,
    xrv_loader,
)
from .extras import MissingExtraError
from .hub import WeightsUnavailableError
from .weights import seeded

__all__ = ["MissingExtraError", "WeightsUnavailableError", "seeded"]
