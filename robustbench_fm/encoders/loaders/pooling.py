"""Pooling token features ``[B, N, D]`` into one embedding per image (timm and transformers)."""
from __future__ import annotations

import torch

from ...core.errors import InvalidSetting


class UnfitEmbedding(InvalidSetting, RuntimeError):
    """``encoder.embedding`` asks for a pooling the model's output cannot give (token pooling of a
    model without tokens, ``pooled`` of one without a pooler): one line naming the choices that fit."""


def pool_tokens(tokens: torch.Tensor, embedding: str, num_prefix: int, name: str) -> torch.Tensor:
    """``cls``: the first token; ``patch_mean``: the mean of the tokens after the ``num_prefix``
    prefix (CLS and register) tokens; ``cls_patch_mean``: both, concatenated."""
    if tokens.ndim != 3:
        raise UnfitEmbedding(f"encoder '{name}': embedding '{embedding}' needs token features [B, N, D], "
                             f"got shape {tuple(tokens.shape)}; use embedding='pooled' for this model")
    if embedding == "cls":
        return tokens[:, 0]
    patch_mean = tokens[:, num_prefix:].mean(dim=1)
    if embedding == "patch_mean":
        return patch_mean
    if embedding == "cls_patch_mean":
        return torch.cat([tokens[:, 0], patch_mean], dim=-1)
    raise ValueError(f"encoder '{name}': embedding '{embedding}' is not a token pooling")
