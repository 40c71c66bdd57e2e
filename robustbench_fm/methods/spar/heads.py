"""SPAR task heads (spar.md Section 3.2): an MLP on the pooled representation and a Transformer on
the full token sequence, for the 16-tile levels (outputs per tile slot) and the whole-slice
Level 3, where :class:`ProbeHeads` holds six separate question-conditioned heads, one per probe,
each answering with its own classes and trained with its own cross-entropy (spar.md Section 3.1,
Level 3: "a question embedding that routes the sample to one of six heads ... cross-entropy loss
per head").

Token inputs are ``[B, T, N, D]`` for tiles (T tiles of N tokens) and ``[B, N, D]`` for a slice.
The MLP concatenates the T pooled tile vectors (so it can compare tiles) or, at Level 3, the
pooled slice vector and the question encoding. The Transformer reads every token, with learned
token-position and tile embeddings; at Levels 1-2 each slot is read out from the mean of its own
tile's output tokens, at Level 3 from the output of the projected question appended as a token.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

#: Level 3 heads answer with at most 5 classes (orientation); :class:`ProbeHeads` pads the others' logits.
MAX_CLASSES = 5


def pool(tokens: torch.Tensor, has_cls: bool) -> torch.Tensor:
    """CLS token for ViTs, mean over tokens for CNN feature maps (spar.md Section 3.2)."""
    return tokens[..., 0, :] if has_cls else tokens.mean(dim=-2)


class MLPHead(nn.Module):
    """Pooled representation -> 2-layer MLP. ``n_tiles`` > 0: [B, T, N, D] -> [B, T, n_out];
    else [B, N, D] and question [B, Q] (concatenated) -> [B, n_out]."""

    def __init__(self, dim: int, n_out: int, has_cls: bool, n_tiles: int = 0, cond_dim: int = 0,
                 hidden: int = 512):
        super().__init__()
        self.has_cls, self.n_tiles, self.n_out = has_cls, n_tiles, n_out
        self.norm = nn.LayerNorm(dim)
        self.cond_dim = cond_dim
        width = dim * n_tiles if n_tiles else dim + cond_dim
        self.mlp = nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(),
                                 nn.Linear(hidden, n_out * max(n_tiles, 1)))

    def forward(self, tokens: torch.Tensor, question: torch.Tensor | None = None) -> torch.Tensor:
        x = self.norm(pool(tokens, self.has_cls))
        if self.n_tiles:
            return self.mlp(x.flatten(1)).view(x.shape[0], self.n_tiles, self.n_out)
        return self.mlp(torch.cat([x, question.to(x.dtype)], dim=-1) if self.cond_dim else x)


class TransformerHead(nn.Module):
    """Full token sequence -> Transformer encoder -> read-out.

    ``n_tiles`` > 0: [B, T, N, D] -> [B, T, n_out]; every tile's N tokens (plus token-position and
    tile embeddings) form one sequence of T x N tokens, and slot t is read out from the mean of
    tile t's OWN output tokens. spar.md Section 3.2: "Transformer heads read the full token
    sequence" -- our reading: the head attends over all tiles' tokens and answers for each tile
    from that tile's outputs (as a per-token head does), rather than from separate learned query
    tokens, which would first have to learn to route to their tile (with them the planted oracle
    stayed at chance on Level 2, patch accuracy 0.06). Else [B, N, D] with the question appended
    as a token -> [B, n_out], read from the question token's output ("appended as a token")."""

    def __init__(self, dim: int, n_out: int, n_tokens: int, n_tiles: int = 0, cond_dim: int = 0,
                 d_model: int = 256, layers: int = 2, heads: int = 8, dropout: float = 0.1):
        super().__init__()
        self.n_tiles = n_tiles
        self.proj = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, d_model))
        self.pos = nn.Parameter(torch.randn(1, n_tokens, d_model) * 0.02)
        if n_tiles:
            self.tile = nn.Parameter(torch.randn(1, n_tiles, 1, d_model) * 0.02)
        else:
            self.question = nn.Linear(cond_dim, d_model)
        layer = nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=dropout, batch_first=True,
                                           norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.out = nn.Sequential(nn.LayerNorm(d_model), nn.Linear(d_model, n_out))

    def forward(self, tokens: torch.Tensor, question: torch.Tensor | None = None) -> torch.Tensor:
        x = self.proj(tokens) + self.pos[:, :tokens.shape[-2]]
        if self.n_tiles:
            b, t, n = x.shape[:3]
            h = self.encoder((x + self.tile[:, :t]).flatten(1, 2)).view(b, t, n, -1).mean(dim=2)
            return self.out(h)
        h = self.encoder(torch.cat([x, self.question(question).unsqueeze(1)], dim=1))[:, -1]
        return self.out(h)


class ProbeHeads(nn.Module):
    """Level 3: six separate heads, one per probe (spar.md Section 3.1 Level 3), no shared layer.

    ``heads[p]`` is built by ``make(n_classes[p])``; each sample goes to the head of its probe,
    read from the question encoding's first ``len(n_classes)`` entries (the one-hot probe), and
    only that head runs on it. Output [B, MAX_CLASSES]: the head's logits, -inf beyond its
    classes. The training loss is the sum over heads of each head's own mean cross-entropy
    (:meth:`losses`), so the gradient reaching head p is that of its own loss alone."""

    def __init__(self, make, n_classes: tuple[int, ...]):
        super().__init__()
        self.n_classes = tuple(int(k) for k in n_classes)
        self.heads = nn.ModuleList(make(k) for k in self.n_classes)

    def route(self, question: torch.Tensor) -> torch.Tensor:
        """Probe index [B] of each question (its one-hot probe block)."""
        return question[:, :len(self.heads)].argmax(-1)

    def forward(self, tokens: torch.Tensor, question: torch.Tensor) -> torch.Tensor:
        probe = self.route(question)
        out = None
        for p, head in enumerate(self.heads):
            rows = torch.nonzero(probe == p).flatten()
            if rows.numel() == 0:
                continue
            logits = head(tokens[rows], question[rows])
            if out is None:
                out = logits.new_full((tokens.shape[0], MAX_CLASSES), float("-inf"))
            out[rows, :logits.shape[-1]] = logits
        return out

    def losses(self, out: torch.Tensor, probe: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        return probe_losses(out, probe, label, self.n_classes)


def probe_losses(out: torch.Tensor, probe: torch.Tensor, label: torch.Tensor, n_classes) -> torch.Tensor:
    """Each Level 3 head's own mean cross-entropy over its samples [len(n_classes)] (0 for a head
    with no sample), on its ``n_classes[p]`` logits of ``out`` [B, MAX_CLASSES]."""
    parts = []
    for p, k in enumerate(n_classes):
        rows = probe == p
        parts.append(F.cross_entropy(out[rows, :k], label[rows]) if bool(rows.any()) else out.new_zeros(()))
    return torch.stack(parts)


class SparModel(nn.Module):
    """Backbone (None when reading cached frozen tokens) followed by a head. Inputs: tiles
    [B, T, H, W] uint8, a slice [B, H, W] uint8, or cached tokens."""

    def __init__(self, head: nn.Module, backbone: nn.Module | None = None, joint_tiles: bool = False):
        super().__init__()
        self.head, self.backbone, self.joint_tiles = head, backbone, joint_tiles

    def tokens(self, x: torch.Tensor, question: torch.Tensor | None = None) -> torch.Tensor:
        if self.backbone is None:
            return x.float()
        if x.ndim == 4 and not self.joint_tiles:  # independent tiles through the backbone
            return self.backbone(x.flatten(0, 1)).unflatten(0, x.shape[:2])
        if getattr(self.backbone, "takes_question", False):
            return self.backbone(x, question)
        return self.backbone(x)

    def forward(self, x: torch.Tensor, question: torch.Tensor | None = None) -> torch.Tensor:
        return self.head(self.tokens(x, question), question)
