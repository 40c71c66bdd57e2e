"""One loader per library (timm, open_clip, transformers): ``spec + weights -> Encoder``.

Importing this package registers the three loaders (``@register_loader``). Each loader takes
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
:mod:`.preprocessing`, :mod:`.pooling`, and one ``<library>_loader`` module per library.
"""
from . import open_clip_loader, timm_loader, transformers_loader  # noqa: F401  (register the loaders)
from .hub import WeightsUnavailableError
from .weights import seeded

__all__ = ["WeightsUnavailableError", "seeded"]
