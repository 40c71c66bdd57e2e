"""The loaded encoder: a frozen module, the transform its weights expect, and one ``embed``."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch
from PIL import Image
from torchvision.transforms import v2 as T

from ..devices import resolve_device  # noqa: F401  (re-exported)
from .spec import EncoderSpec


def build_transform(spec: EncoderSpec) -> Callable[[Image.Image], torch.Tensor]:
    """PIL image -> normalised float tensor [C, H, W], exactly as the spec's weights expect."""
    interp = T.InterpolationMode(spec.interpolation)
    if spec.resize == "squash":
        geometry = [T.Resize((spec.input_size, spec.input_size), interpolation=interp, antialias=True)]
    else:
        geometry = [T.Resize(spec.resize_size or spec.input_size, interpolation=interp, antialias=True),
                    T.CenterCrop(spec.input_size)]
    mode = "L" if spec.channels == 1 else "RGB"
    return T.Compose([
        T.Lambda(lambda im: im.convert(mode)),
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
