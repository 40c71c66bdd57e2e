"""Synthetic reference encoders for calibrating CANDOR (candor.md, the 200-image experiment).

Both are small fixed ``torch.nn.Module``s with no download and no training. They share one
pipeline and one seeded random projection; only the image map differs:

    image -> map -> grid x grid cells -> sort the cell values (descending) -> projection [D]

* ``planted_blur``: the map is the image blurred by a wide Gaussian (sigma 8 px) and averaged in
  each cell. A 7 px marker is spread over hundreds of pixels and is swamped by the background,
  so the features carry no information about it: the marker-invariant reference (D ~ 1/2).
* ``planted_sharp``: the map is the local contrast ``|image - blur_sigma1.5(image)|`` max-pooled
  in each cell. The background's smooth field vanishes from it and the marker is the strongest
  response: the marker-sensitive reference (D = 0).

Sorting the cell values makes both translation invariant. Without it a marker is a spike at a
position-dependent coordinate, so two positives whose markers lie in different cells would be
no more similar than a positive and a negative under cosine geometry.
"""
from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F

from .base import Encoder
from .catalog.synthetic import PLANTED_BLUR, PLANTED_SHARP  # noqa: F401  (re-exported)
from .loaders.weights import file_weights_id, load_strict, pick_checkpoint
from .registry import register_loader
from .spec import ALLOW_REMOTE_CODE, EncoderSpec

KINDS = ("blur", "sharp")


def _gaussian_kernel(sigma: float) -> torch.Tensor:
    radius = max(1, int(math.ceil(3.0 * sigma)))
    x = torch.arange(-radius, radius + 1, dtype=torch.float64)
    k = torch.exp(-0.5 * (x / sigma) ** 2)
    return (k / k.sum()).float()


class PlantedEncoder(torch.nn.Module):
    """map -> ``grid``x``grid`` cells -> sorted cell values -> fixed random projection.

    ``kind="blur"``: Gaussian blur (``blur_sigma``) then average pooling per cell.
    ``kind="sharp"``: ``|x - Gaussian(hp_sigma)(x)|`` then max pooling per cell.
    The projection ``[grid*grid, embed_dim]`` is drawn from ``torch.Generator().manual_seed(seed)``
    and is therefore identical for both kinds with the same seed, grid and embed_dim.
    """

    def __init__(self, kind: str = "blur", grid: int = 16, embed_dim: int = 256, seed: int = 0,
                 blur_sigma: float = 8.0, hp_sigma: float = 1.5, sort: bool = True):
        super().__init__()
        if kind not in KINDS:
            raise ValueError(f"PlantedEncoder: kind must be one of {KINDS}, got {kind!r}")
        self.kind, self.grid, self.sort = kind, int(grid), bool(sort)
        sigma = blur_sigma if kind == "blur" else hp_sigma
        self.register_buffer("kernel", _gaussian_kernel(sigma))
        self._matrices: dict = {}
        gen = torch.Generator().manual_seed(int(seed))
        proj = torch.randn(self.grid * self.grid, embed_dim, generator=gen) / math.sqrt(embed_dim)
        self.register_buffer("projection", proj)

    def _load_from_state_dict(self, *args, **kwargs):
        super()._load_from_state_dict(*args, **kwargs)
        self._matrices.clear()  # the kernel may have changed

    def _blur_matrix(self, n: int, device, dtype) -> torch.Tensor:
        """[n, n] matrix of the 1-D Gaussian blur with reflect padding (``blur = M @ x``)."""
        key = (n, str(device), dtype)
        if key not in self._matrices:
            r = self.kernel.numel() // 2
            if r >= n:
                raise ValueError(f"PlantedEncoder: input side {n} px is too small for a {2 * r + 1}-tap blur")
            src = torch.arange(n).view(-1, 1) + torch.arange(-r, r + 1).view(1, -1)
            src = torch.where(src < 0, -src, src)
            src = torch.where(src > n - 1, 2 * (n - 1) - src, src)  # reflect, edge not repeated
            m = torch.zeros(n, n, dtype=torch.float64)
            m.scatter_add_(1, src, self.kernel.double().cpu().expand(n, -1).contiguous())
            self._matrices[key] = m.to(device=device, dtype=dtype)
        return self._matrices[key]

    def _blur(self, x: torch.Tensor) -> torch.Tensor:
        """Separable Gaussian blur with reflect padding, as two matrix products (fast on CPU)."""
        h, w = x.shape[-2:]
        return self._blur_matrix(h, x.device, x.dtype) @ x @ self._blur_matrix(w, x.device, x.dtype).T

    def cell_map(self, x: torch.Tensor) -> torch.Tensor:
        """[B, C, H, W] -> [B, grid*grid] cell values (before sorting)."""
        x = x.float().mean(dim=1, keepdim=True)
        if self.kind == "blur":
            cells = F.adaptive_avg_pool2d(self._blur(x), self.grid)
        else:
            cells = F.adaptive_max_pool2d((x - self._blur(x)).abs(), self.grid)
        return cells.flatten(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cells = self.cell_map(x)
        if self.sort:
            cells = cells.sort(dim=1, descending=True).values
        return cells @ self.projection.to(cells.dtype)


@register_loader("synthetic")
def load_synthetic(spec: EncoderSpec, weights=None, device="cpu",
                   allow_remote_code: bool = ALLOW_REMOTE_CODE) -> Encoder:
    """Build the fixed module; ``weights`` (optional) is a saved ``state_dict`` (file, or a folder
    holding exactly one checkpoint) loaded strictly over the seeded buffers."""
    model = PlantedEncoder(embed_dim=spec.embed_dim, seed=spec.seed, **spec.model_kwargs)
    weights_id = f"synthetic:{spec.hub_id}:seed={spec.seed}"
    if weights is not None:
        path = Path(weights)
        if path.is_dir():
            path = pick_checkpoint(path, preferred=())
        load_strict(spec, model, torch.load(path, map_location="cpu", weights_only=True), path)
        weights_id = file_weights_id(path)
    return Encoder(spec=spec, model=model, forward=model, weights_id=weights_id,
                   device=torch.device(device))
