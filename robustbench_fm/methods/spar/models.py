"""SPAR backbones as token sequences (spar.md Section 3.2).

:class:`Backbone` wraps a loaded :class:`~robustbench_fm.encoders.Encoder` so that uint8 CT
images [B, H, W] give the full token sequence [B, N, D]: the CLS token (ViTs) followed by the
patch tokens, or the flattened spatial feature map (CNNs, SAM-Med2D's neck). The patch grid is
average-pooled to at most ``token_grid`` x ``token_grid`` so every backbone reads the 7 x 7 grid
ResNet-50 and ViT-B/32 produce at 224 px (RadDINO's 37 x 37, BiomedCLIP's 14 x 14, SAM-Med2D's
16 x 16 are pooled down). The pooled representation the MLP heads read is the CLS token for
ViTs and the average of the feature map for CNNs (:meth:`Backbone.pool`).

:class:`CombinedViT` is the ViT-Combined configuration: all 16 tiles are patchified by one ViT
jointly, each patch with the ViT's positional embedding plus a learned tile-specific embedding,
and the ViT blocks attend across tiles.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ...encoders import Encoder


def _grid(patches: torch.Tensor) -> torch.Tensor:
    """Patch tokens [B, P, D] -> feature map [B, D, h, w] (square grid)."""
    side = math.isqrt(patches.shape[1])
    if side * side != patches.shape[1]:
        raise RuntimeError(f"{patches.shape[1]} patch tokens do not form a square grid")
    return patches.transpose(1, 2).reshape(patches.shape[0], patches.shape[2], side, side)


def _timm_trunk(model: nn.Module) -> nn.Module:
    """The timm trunk of an open_clip image tower (full CLIP model or the tower alone)."""
    visual = getattr(model, "visual", model)
    trunk = getattr(visual, "trunk", None)
    if trunk is None:
        raise ValueError(f"{type(visual).__name__} has no timm trunk; SPAR reads open_clip towers built on timm")
    return trunk


class Backbone(nn.Module):
    """Token sequences of one encoder: ``forward(images uint8 [B, H, W]) -> [B, N, D]``."""

    def __init__(self, encoder: Encoder, token_grid: int = 7):
        super().__init__()
        self.spec, self.token_grid = encoder.spec, token_grid
        self.library = encoder.spec.library
        self.model = encoder.model
        dev = encoder.device
        self.register_buffer("mean", torch.tensor(self.spec.mean, device=dev).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(self.spec.std, device=dev).view(1, -1, 1, 1))
        with torch.no_grad():
            probe = self._cls_and_grid(self.prepare(torch.zeros(1, 8, 8, dtype=torch.uint8,
                                                                device=self.mean.device)))
        self.has_cls = probe[0] is not None
        self.dim = probe[1].shape[1]

    def prepare(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 windowed CT [B, H, W] -> the encoder's normalised input [B, C, S, S] (grey
        replicated over channels, bilinear resize to the entry's input size)."""
        x = images.to(self.mean.device, torch.float32).div(255.0).unsqueeze(1)
        size = self.spec.input_size
        if x.shape[-1] != size or x.shape[-2] != size:
            x = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
        x = x.expand(-1, self.spec.channels, -1, -1)
        return (x - self.mean) / self.std

    def _cls_and_grid(self, x: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        """(CLS [B, 1, D] or None, feature map [B, D, h, w]) of a normalised batch."""
        if self.library == "sam_med2d":
            return None, self.model(x)
        if self.library == "transformers":
            out = self.model(pixel_values=x).last_hidden_state
            cfg = getattr(self.model.config, "vision_config", None) or self.model.config
            prefix = 1 + int(getattr(cfg, "num_register_tokens", 0) or 0)
            return out[:, :1], _grid(out[:, prefix:])
        model = _timm_trunk(self.model) if self.library == "open_clip" else self.model
        if self.library not in ("timm", "open_clip"):
            raise ValueError(f"encoder '{self.spec.name}': SPAR reads token sequences from timm, open_clip, "
                             f"transformers and sam_med2d encoders, not '{self.library}'")
        out = model.forward_features(x)
        if out.ndim == 4:
            return None, out
        prefix = int(getattr(model, "num_prefix_tokens", 1))
        cls = out[:, :1] if getattr(model, "cls_token", None) is not None else None
        return cls, _grid(out[:, prefix:])

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Token sequence [B, N, D]: CLS (if any) then the pooled patch grid, row-major."""
        cls, grid = self._cls_and_grid(self.prepare(images))
        side = min(self.token_grid, grid.shape[-1])
        if grid.shape[-1] != side:
            grid = F.adaptive_avg_pool2d(grid, side)
        tokens = grid.flatten(2).transpose(1, 2)
        return tokens if cls is None else torch.cat([cls, tokens], dim=1)

    def pool(self, tokens: torch.Tensor) -> torch.Tensor:
        """The pooled representation [..., D] of token sequences [..., N, D]: CLS for ViTs,
        the average of the feature map for CNNs (spar.md Section 3.2)."""
        return tokens[..., 0, :] if self.has_cls else tokens.mean(dim=-2)


class CombinedViT(nn.Module):
    """ViT-Combined (spar.md Section 3.2): tiles [B, T, H, W] patchified jointly by one timm ViT
    with its positional embedding plus a learned tile embedding; returns each tile's mean output
    token as a one-token sequence [B, T, 1, D] (the readout of the joint sequence)."""

    def __init__(self, encoder: Encoder, n_tiles: int = 16):
        super().__init__()
        vit = encoder.model
        if encoder.spec.library != "timm" or not hasattr(vit, "patch_embed") or vit.pos_embed is None:
            raise ValueError(f"encoder '{encoder.spec.name}': ViT-Combined needs a timm ViT with an absolute "
                             "positional embedding (e.g. vit_b32_in1k)")
        self.backbone = Backbone(encoder, token_grid=10**6)
        self.vit = vit
        self.tile_embed = nn.Parameter(torch.zeros(1, n_tiles, 1, vit.embed_dim))
        nn.init.trunc_normal_(self.tile_embed, std=0.02)
        self.has_cls, self.dim = True, vit.embed_dim

    def forward(self, tiles: torch.Tensor) -> torch.Tensor:
        b, t = tiles.shape[:2]
        vit = self.vit
        x = vit.patch_embed(self.backbone.prepare(tiles.flatten(0, 1)))  # [B*T, P, D]
        x = x.reshape(b * t, -1, x.shape[-1])
        pos = vit.pos_embed
        prefix_pos = None if vit.no_embed_class else pos[:, :vit.num_prefix_tokens]
        patch_pos = pos if vit.no_embed_class else pos[:, vit.num_prefix_tokens:]
        x = (x + patch_pos).reshape(b, t, -1, x.shape[-1]) + self.tile_embed[:, :t]
        n_patch = x.shape[2]
        x = x.reshape(b, t * n_patch, -1)
        cls = vit.cls_token.expand(b, -1, -1)
        if prefix_pos is not None:
            cls = cls + prefix_pos[:, :1]
        x = vit.norm(vit.blocks(vit.norm_pre(torch.cat([cls, x], dim=1))))
        return x[:, 1:].reshape(b, t, n_patch, -1).mean(dim=2, keepdim=True)

    def pool(self, tokens: torch.Tensor) -> torch.Tensor:
        return tokens[..., 0, :]
