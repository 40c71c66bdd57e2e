"""The loaded encoder: a frozen module, the transform its weights expect, and one ``embed``."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch
from PIL import Image
from torchvision.transforms import v2 as T

from ..core.devices import resolve_device  # noqa: F401  (re-exported)
from ..core.errors import InvalidSetting
from .spec import EncoderSpec


class _LongestSidePad(torch.nn.Module):
    """Scale a [C, H, W] tensor so its longer side is ``size``, then zero-pad right and bottom to
    ``size`` x ``size`` (FLAIR's 512 px canvas)."""

    def __init__(self, size: int, interp):
        super().__init__()
        self.size, self.interp = size, interp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        scale = self.size / max(h, w)
        x = T.functional.resize(x, [max(1, round(h * scale)), max(1, round(w * scale))],
                                interpolation=self.interp, antialias=True)
        return torch.nn.functional.pad(x, (0, self.size - x.shape[-1], 0, self.size - x.shape[-2]))


class _ToMode(torch.nn.Module):
    """PIL image -> the same image in ``mode`` ('L' or 'RGB'); an image already in ``mode`` is
    returned as it is (``convert`` would return a copy of the same pixels: a 2,048 px film's 4 MB
    copied for nothing, since ``PILToTensor`` copies next)."""

    def __init__(self, mode: str):
        super().__init__()
        self.mode = mode

    def forward(self, im: Image.Image) -> Image.Image:
        return im if im.mode == self.mode else im.convert(self.mode)


def build_transform(spec: EncoderSpec) -> Callable[[Image.Image], torch.Tensor]:
    """PIL image -> normalised float tensor [C, H, W], exactly as the spec's weights expect.

    Built from picklable modules only, so decode workers started with ``spawn`` (macOS, or a
    process that was itself spawned) can receive it."""
    if spec.resize == "none":
        raise InvalidSetting(f"encoder '{spec.name}' takes tile embeddings, not images; embed the tiles "
                             f"with encoder={spec.tile_encoder} first")
    interp = T.InterpolationMode(spec.interpolation)
    if spec.resize == "squash":
        geometry = [T.Resize((spec.input_size, spec.input_size), interpolation=interp, antialias=True)]
    elif spec.resize == "longest_pad":
        geometry = [_LongestSidePad(spec.input_size, interp)]
    else:
        geometry = [T.Resize(spec.resize_size or spec.input_size, interpolation=interp, antialias=True),
                    T.CenterCrop(spec.input_size)]
    mode = "L" if spec.channels == 1 else "RGB"
    return T.Compose([
        _ToMode(mode),
        T.PILToTensor(),
        *geometry,
        T.ToDtype(torch.float32, scale=True),
        T.Normalize(list(spec.mean), list(spec.std)),
    ])


@dataclass
class Encoder:
    """A frozen encoder ready to embed.

    ``forward`` maps a normalised batch [B, C, H, W] on ``device`` to pooled features [B, D]
    following ``spec.embedding``; ``weights_id`` identifies the exact weights (random seed, hub
    id + revision, or the checkpoint's SHA-256) and enters the feature-cache key.
    """

    spec: EncoderSpec
    model: torch.nn.Module
    forward: Callable[[torch.Tensor], torch.Tensor]
    weights_id: str
    device: torch.device
    transform: Callable[[Image.Image], torch.Tensor] | None = None

    def __post_init__(self):
        self.model.eval().requires_grad_(False).to(self.device)
        if self.transform is None:
            self.transform = build_transform(self.spec)

    @property
    def uses_amp(self) -> bool:
        return self.device.type == "cuda" and self.spec.amp_dtype is not None

    def autocast(self):
        """Autocast on CUDA with the spec's dtype; fp32 elsewhere (bf16 on CPU is slower here)."""
        if self.uses_amp:
            return torch.autocast("cuda", dtype=getattr(torch, self.spec.amp_dtype))
        return contextlib.nullcontext()

    @torch.inference_mode()
    def embed(self, batch: torch.Tensor) -> torch.Tensor:
        """Features [B, D] as float32 on ``device`` for a normalised batch [B, C, H, W]."""
        batch = batch.to(self.device, non_blocking=True)
        with self.autocast():
            out = self.forward(batch)
        if out.ndim != 2 or out.shape[1] != self.spec.embed_dim:
            raise RuntimeError(f"encoder '{self.spec.name}' produced shape {tuple(out.shape)}, "
                               f"expected [B, {self.spec.embed_dim}]; fix the entry's embed_dim/embedding")
        return out.float()
