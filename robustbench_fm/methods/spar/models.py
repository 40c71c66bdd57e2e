"""SPAR backbones as token sequences (spar.md Section 3.2).

:class:`Backbone` wraps a loaded :class:`~robustbench_fm.encoders.Encoder` so that uint8 CT
images [B, H, W] give the full token sequence [B, N, D]: the CLS token (ViTs) followed by the
patch tokens, or the flattened spatial feature map (CNNs, SAM-Med2D's neck). By default
(``token_grid=0``) the sequence is the backbone's native one (spar.md Section 3.2: "Transformer
heads read the full token sequence"): 7 x 7 for ResNet-50 and ViT-B/32 at 224 px, 37 x 37 for
RadDINO, 14 x 14 for BiomedCLIP, 16 x 16 for SAM-Med2D; ``token_grid=k`` average-pools the patch
grid to at most k x k (the pooled-token ablation). The pooled representation the MLP heads read
is the CLS token for ViTs and the average of the feature map for CNNs (:meth:`Backbone.pool`).

:class:`CombinedViT` is the ViT-Combined configuration: all 16 tiles are patchified by one ViT
jointly, each patch with the ViT's positional embedding plus a learned tile-specific embedding,
and the ViT blocks attend across tiles. At Level 3 (one whole slice) the same unified model
appends the question as a token to the ViT's own sequence, so the ViT blocks, not a separate
head, relate the question to the patches (:class:`CombinedViT` with ``n_tiles=0``).

:class:`OracleBackbone` is the planted calibration reference of the demo: its tokens are computed
from the organ masks behind each image, not from the pixels; at Level 3 they also hold what each
question compares (:class:`AskedTokens`).
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ...core.errors import InvalidSetting
from ...encoders import Encoder
from .probes import (
    L3_PROBES,
    LEFT_KIDNEY,
    LIVER,
    ORGANS,
    RIGHT_KIDNEY,
    TRANSFORMS,
    kidney_symmetry_class,
    liver_size_class,
    transform_points,
    tumour_count_class,
)
from .samples import slice_frame_mm


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

    def __init__(self, encoder: Encoder, token_grid: int = 0):
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
        replicated over channels, bilinear resize to the entry's input size). The resize is linear,
        so the scaling to [0, 1] comes after it, on the input size's pixels rather than the 224 x 224
        ones (the demo's backbones read 32 and 64 px: 49 and 12 times fewer divisions)."""
        x = images.to(self.mean.device, torch.float32).unsqueeze(1)
        size = self.spec.input_size
        if x.shape[-1] != size or x.shape[-2] != size:
            x = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
        x = x.div(255.0).expand(-1, self.spec.channels, -1, -1)
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
            raise InvalidSetting(f"encoder '{self.spec.name}': SPAR reads token sequences from timm, open_clip, "
                             f"transformers and sam_med2d encoders, not '{self.library}'")
        out = model.forward_features(x)
        if out.ndim == 4:
            return None, out
        prefix = int(getattr(model, "num_prefix_tokens", 1))
        cls = out[:, :1] if getattr(model, "cls_token", None) is not None else None
        return cls, _grid(out[:, prefix:])

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Token sequence [B, N, D]: CLS (if any) then the patch grid, row-major; native unless
        ``token_grid`` > 0 pools it to at most ``token_grid`` x ``token_grid``."""
        cls, grid = self._cls_and_grid(self.prepare(images))
        if 0 < self.token_grid < grid.shape[-1]:
            grid = F.adaptive_avg_pool2d(grid, self.token_grid)
        tokens = grid.flatten(2).transpose(1, 2)
        return tokens if cls is None else torch.cat([cls, tokens], dim=1)

    def pool(self, tokens: torch.Tensor) -> torch.Tensor:
        """The pooled representation [..., D] of token sequences [..., N, D]: CLS for ViTs,
        the average of the feature map for CNNs (spar.md Section 3.2)."""
        return tokens[..., 0, :] if self.has_cls else tokens.mean(dim=-2)


class CombinedViT(nn.Module):
    """ViT-Combined (spar.md Section 3.2: "patchifies all 16 tiles jointly with tile-specific and
    positional embeddings"), one timm ViT trained end to end.

    Levels 1-2 (``n_tiles`` = 16): tiles [B, T, H, W] patchified jointly, each patch with the ViT's
    positional embedding plus a learned tile embedding, one sequence through the ViT blocks;
    returns each tile's mean output token as a one-token sequence [B, T, 1, D].

    Level 3 (``n_tiles`` = 0; the paper defines ViT-Combined by its joint sequence and is silent on
    Level 3, where there is one slice and no tiles; our reading): the slice's patches with the
    positional embedding and the question, projected to a token with a learned type embedding, form
    one sequence through the ViT blocks ("question ... appended as a token", as for Transformer
    heads, but inside the ViT); returns the question token's output [B, 1, D], which the per-probe
    heads read. Unlike ViT-MLP, the ViT itself sees the question."""

    takes_question = True

    def __init__(self, encoder: Encoder, n_tiles: int = 16, cond_dim: int = 0):
        super().__init__()
        vit = encoder.model
        if encoder.spec.library != "timm" or not hasattr(vit, "patch_embed") or vit.pos_embed is None:
            raise InvalidSetting(f"encoder '{encoder.spec.name}': ViT-Combined needs a timm ViT with an absolute "
                             "positional embedding (e.g. vit_b32_in1k)")
        self.backbone = Backbone(encoder, token_grid=0)
        self.vit, self.n_tiles = vit, n_tiles
        if n_tiles:
            self.tile_embed = nn.Parameter(torch.zeros(1, n_tiles, 1, vit.embed_dim))
            nn.init.trunc_normal_(self.tile_embed, std=0.02)
        else:
            if cond_dim < 1:
                raise ValueError("CombinedViT at Level 3 needs the question encoding's width (cond_dim)")
            self.question = nn.Linear(cond_dim, vit.embed_dim)
            self.type_embed = nn.Parameter(torch.zeros(1, 1, vit.embed_dim))
            nn.init.trunc_normal_(self.type_embed, std=0.02)
        self.has_cls, self.dim = True, vit.embed_dim

    def _patches(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(CLS with its position [B', 1, D], patch tokens with positions [B', P, D]) of [B', H, W]."""
        vit = self.vit
        x = vit.patch_embed(self.backbone.prepare(images))
        x = x.reshape(x.shape[0], -1, x.shape[-1])
        pos = vit.pos_embed
        prefix_pos = None if vit.no_embed_class else pos[:, :vit.num_prefix_tokens]
        x = x + (pos if vit.no_embed_class else pos[:, vit.num_prefix_tokens:])
        cls = vit.cls_token.expand(x.shape[0], -1, -1)
        return (cls if prefix_pos is None else cls + prefix_pos[:, :1]), x

    def forward(self, x: torch.Tensor, question: torch.Tensor | None = None) -> torch.Tensor:
        vit = self.vit
        if not self.n_tiles:  # Level 3: [B, H, W] slice + question token
            cls, patches = self._patches(x)
            q = self.question(question.to(patches.dtype)).unsqueeze(1) + self.type_embed
            out = vit.norm(vit.blocks(vit.norm_pre(torch.cat([cls, patches, q], dim=1))))
            return out[:, -1:]
        b, t = x.shape[:2]
        cls, patches = self._patches(x.flatten(0, 1))  # [B*T, P, D]
        patches = patches.reshape(b, t, -1, patches.shape[-1]) + self.tile_embed[:, :t]
        n_patch = patches.shape[2]
        seq = torch.cat([cls[:b], patches.reshape(b, t * n_patch, -1)], dim=1)
        out = vit.norm(vit.blocks(vit.norm_pre(seq)))
        return out[:, 1:].reshape(b, t, n_patch, -1).mean(dim=2, keepdim=True)

    def pool(self, tokens: torch.Tensor) -> torch.Tensor:
        return tokens[..., 0, :]


# ------------------------------------------------------------------ the planted oracle



def _signed(v: np.ndarray) -> np.ndarray:
    """``[v, -v]`` on the last axis: zero mean, so a head's LayerNorm only rescales the block."""
    return np.concatenate([v, -v], axis=-1)


def _one_hot(index: np.ndarray, n: int, valid: np.ndarray | None = None) -> np.ndarray:
    """Signed one-hot [..., 2n] of ``index`` (all zero where ``valid`` is False)."""
    index = np.asarray(index)
    out = np.zeros((*index.shape, n))
    np.put_along_axis(out, np.clip(index, 0, n - 1)[..., None].astype(np.int64), 1.0, axis=-1)
    if valid is not None:
        out[~np.asarray(valid, bool)] = 0.0
    return _signed(out)


#: The oracle's position code: Gaussian bumps on this many bins per axis, one bin wide (σ = 1 bin).
ORACLE_BINS = 32


def _bumps(v: np.ndarray, n: int = ORACLE_BINS) -> np.ndarray:
    """Signed Gaussian bumps [..., 2n] of v in [0, 1] on n bin centres (σ = one bin): a shift of
    one bin changes the code by O(1), and v is a near-linear read-out of it."""
    centres = (np.arange(n) + 0.5) / n
    b = np.exp(-0.5 * ((np.asarray(v, np.float64)[..., None] - centres) * n) ** 2)
    return _signed(b)


def oracle_tile_tokens(samples) -> np.ndarray:
    """Planted Level 1-2 tokens [N, 16, 1, 4 * ORACLE_BINS + 32] from the organ masks behind each
    tile: its centroid in the slice frame as Gaussian bumps over x and y (:func:`_bumps`) and the
    Level 2 grid cell the slice's masks assign it (``probes.grid_cells``) as a signed one-hot;
    zeros for an absent (black) tile. Every block has zero mean, so a head's LayerNorm leaves it a
    linear code. (A raw coordinate varies by ~0.03 of the frame between subjects: a head needs
    thousands of steps to amplify it; bumps turn a one-bin shift into an O(1) change.)"""
    present = np.asarray(samples.present, bool)
    n, t = present.shape
    xy = np.nan_to_num(np.asarray(samples.centroids, np.float64))
    tok = np.concatenate([_bumps(xy[..., 0]), _bumps(xy[..., 1]), _one_hot(np.asarray(samples.grid_cells), t)],
                         axis=-1)
    tok[~present] = 0.0
    return tok[:, :, None, :].astype(np.float32)


def _ranks(values: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Rank of each valid entry among the valid entries of its row, scaled to [0, 1] (0 for a single
    one and for invalid entries): a monotone code, so any order comparison of two entries is
    kept while distinct entries differ by at least 1 / (k - 1)."""
    out = np.zeros(values.shape)
    for i, (v, ok) in enumerate(zip(values, valid)):
        idx = np.flatnonzero(ok)
        if len(idx) > 1:
            out[i, idx] = np.argsort(np.argsort(v[idx], kind="stable"), kind="stable") / (len(idx) - 1)
    return out


#: unordered organ pairs (i < j) of the oracle's Level 3 distance table
_PAIRS = np.triu_indices(16, k=1)
#: raw entries of the oracle's Level 3 token 0 before the question's two asked entries: the
#: transform (5), kidney symmetry, liver size, tumour count (3 each) one-hots, presence and x rank
#: of the 16 organs and the 120 pair-distance ranks (:func:`oracle_view_tokens`)
_ASKED_AT = len(TRANSFORMS) + 3 * 3 + 16 + 16 + len(_PAIRS[0])


def _view_geometry(samples, views) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(present [V, 16], presented x rank [V, 16], pair-distance rank [V, 120] and as a symmetric
    table [V, 16, 16], transform index [V]) of each view (slice row, transform) from the slice's
    organ masks. Ranks among the slice's present organs / pairs (:func:`_ranks`); distances in mm
    where the spacing is known, else in the normalised frame, as the labels measure them
    (:func:`~robustbench_fm.methods.spar.probes.make_questions`); a transform moves no distance."""
    rows, transforms = views["slice_row"].to_numpy(int), views["transform"].to_numpy()
    present = np.asarray(samples.slice_present, bool)[rows]
    raw = np.nan_to_num(np.asarray(samples.slice_centroids, np.float64)[rows])
    xy = np.stack([transform_points(raw[i], t) for i, t in enumerate(transforms)]) if len(rows) else raw
    xy[~present] = 0.0
    mm = slice_frame_mm(samples.slice_table)[rows]
    frame = np.where(np.isfinite(mm).all(-1, keepdims=True), mm, 1.0)
    i, j = _PAIRS
    dist = np.linalg.norm((raw[:, i] - raw[:, j]) * frame[:, None, :], axis=-1)
    d_rank = _ranks(dist, present[:, i] & present[:, j])
    table = np.zeros((len(rows), 16, 16))
    table[:, i, j] = d_rank
    table[:, j, i] = d_rank
    t_idx = np.array([TRANSFORMS.index(t) for t in transforms], np.int64)
    return present, _ranks(xy[..., 0], present), d_rank, table, t_idx


def oracle_view_tokens(samples, views) -> np.ndarray:
    """Planted Level 3 tokens [V, 1 + 16, D] of each view (slice row, transform) from the slice's
    organ masks as the view presents them (:func:`_view_geometry`).

    Token 0 (read by MLP heads as the CLS) holds the transform, the kidney-symmetry, liver-size and
    tumour-count classes the masks give (zeros where the slice has no such label) as one-hots, each
    organ's presence, the rank of each present organ's (presented) x among the present organs
    (relative position, probe (i), is the order of two of them), the rank of every present organ
    pair's distance among the slice's present pairs, one entry per unordered pair (distance
    comparison, probe (v), is the order of two of them), and two entries left zero here that the
    oracle fills per question with the two quantities the question compares (:class:`AskedTokens`).
    Tokens 1-16 hold one organ each: identity, presence, x rank and its row of the pair-distance
    ranks, for Transformer heads, and repeat the slice's class one-hots (so a question token finds
    them in whichever token it attends to). Ranks, not coordinates: a question may compare organs
    whose centroids differ by one pixel, and ranks keep such orders at least 1 / 15 (x) or 1 / 119
    (distance) apart, so a head reads them in the demo's budget. The whole token is ``_signed``
    (zero mean)."""
    rows = views["slice_row"].to_numpy(int)
    present, x_rank, d_rank, table, t_idx = _view_geometry(samples, views)
    areas = np.asarray(samples.slice_areas, float)[rows]
    pixels = (samples.slice_table["height"] * samples.slice_table["width"]).to_numpy(float)[rows]
    tumours = np.asarray(samples.slice_tumours)[rows]
    both = present[:, LEFT_KIDNEY] & present[:, RIGHT_KIDNEY]
    with np.errstate(divide="ignore", invalid="ignore"):
        symm = kidney_symmetry_class(areas[:, LEFT_KIDNEY], areas[:, RIGHT_KIDNEY])
    size = liver_size_class(areas[:, LIVER] / pixels)
    n_view, n_org = present.shape

    def one_hot(index, n, valid=None):
        return _one_hot(index, n, valid)[..., :n]

    classes = np.concatenate([one_hot(t_idx, len(TRANSFORMS)), one_hot(symm, 3, both),
                              one_hot(size, 3, present[:, LIVER]),
                              one_hot(tumour_count_class(np.maximum(tumours, 0)), 3, tumours >= 0)], axis=-1)
    return _view_layout(present, x_rank, d_rank, table, classes)


def _view_layout(present, x_rank, d_rank, table, classes) -> np.ndarray:
    """The Level 3 token layout of :func:`oracle_view_tokens` from its parts (shared by the planted
    backbones): token 0 = classes, presence, x ranks, pair-distance ranks, the asked entries; tokens
    1-16 = identity, presence, x rank, pair-distance row, classes; signed."""
    n_view, n_org = present.shape
    cls = np.concatenate([classes, present.astype(float), x_rank, d_rank], axis=-1)
    assert cls.shape[-1] == _ASKED_AT  # the asked entries come next (AskedTokens writes them there)
    cls = np.concatenate([cls, np.zeros((n_view, ORACLE_ASKED))], axis=-1)
    per_organ = np.concatenate([np.broadcast_to(np.eye(n_org), (n_view, n_org, n_org)), present[..., None],
                                x_rank[..., None], table,
                                np.broadcast_to(classes[:, None], (n_view, n_org, classes.shape[-1]))], axis=-1)
    dim = max(cls.shape[-1], per_organ.shape[-1])
    out = np.zeros((n_view, 1 + n_org, dim))
    out[:, 0, :cls.shape[-1]] = cls
    out[:, 1:, :per_organ.shape[-1]] = per_organ
    return _signed(out).astype(np.float32)


#: entries of token 0 the planted oracle fills per Level 3 question (:func:`oracle_asked`)
ORACLE_ASKED = 2


def decode_questions(cond: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(probe index [Q], organ index [Q, 4], -1 for an unused slot) of question encodings in the
    layout of :func:`~robustbench_fm.methods.spar.run.encode_questions` (one-hot probe, then one
    one-hot over the 16 organs for each of organ_a..organ_d): what a question-reading backbone sees."""
    cond = np.asarray(cond)
    n_probes, n_organs = len(L3_PROBES), len(ORGANS)
    organs = cond[:, n_probes:n_probes + 4 * n_organs].reshape(len(cond), 4, n_organs)
    return cond[:, :n_probes].argmax(-1), np.where(organs.any(-1), organs.argmax(-1), -1)


def oracle_asked(samples, views, view_of: np.ndarray, cond: np.ndarray, geometry=None) -> np.ndarray:
    """[Q, ORACLE_ASKED]: the two quantities each Level 3 question compares, read off its view's
    masks (:func:`_view_geometry`) at the organs its encoding ``cond`` names (:func:`decode_questions`):
    relative position "Is A left or right of B?", the presented x ranks of A and B (label 1 when
    A's is the smaller); distance "d(A, B) > d(C, D)?", the distance ranks of pair (A, B) and pair
    (C, D) among the slice's present pairs (label 1 when the first is the larger); zeros for the
    other probes, whose classes token 0 holds already. Still ranks, so a head must learn the
    comparison; what it no longer has to learn is the lookup (see :class:`AskedTokens`).
    ``geometry``: the views' geometry in :func:`_view_geometry`'s form (default: the masks'; the
    canonical backbone passes :func:`canonical_geometry`'s)."""
    present, x_rank, _, table, _ = _view_geometry(samples, views) if geometry is None else geometry
    probe, organ = decode_questions(cond)
    v = np.asarray(view_of, np.int64)
    out = np.zeros((len(v), ORACLE_ASKED))
    rp = probe == L3_PROBES.index("relative_position")
    out[rp] = x_rank[v[rp, None], organ[rp, :2]]
    dc = probe == L3_PROBES.index("distance_compare")
    out[dc, 0] = table[v[dc], organ[dc, 0], organ[dc, 1]]
    out[dc, 1] = table[v[dc], organ[dc, 2], organ[dc, 3]]
    return out


class AskedTokens:
    """The planted oracle's Level 3 tokens per QUESTION, indexed by question rows: the question's
    view tokens (:func:`oracle_view_tokens`) with token 0's two asked entries holding what the
    question compares (:func:`oracle_asked`, signed like the rest). The oracle reads the question
    as our ViT-Combined's backbone does (:class:`CombinedViT` appends it to the ViT's own sequence
    at Level 3), so a head reads the compared quantities from two fixed entries. The heads still
    get the question as spar.md Section 3.2 says ("concatenated for MLP heads and appended as a
    token for Transformer heads"); it routes each question to its probe's head.

    Why (issue 29 item 8): the views' tokens alone hold every answer (the 120 pair-distance ranks),
    but a head must then learn the lookup, a gate per organ pair, from the questions. In the demo
    (then 32 questions per slice, 3,350 of them for training) the MLP and Transformer heads learned the
    question-only prior instead: 0.88-0.91 against a prior of 0.92-0.94, and 0.48 of the
    questions the prior gets wrong (chance). With the pair of pairs as a signed one-hot in the
    question encoding: 0.94, and 0.36-0.52 of those; a FiLM-conditioned MLP: 0.94, 0.50-0.54. With
    the asked entries the same heads score 0.995-1.000, so at least 0.91 of those (0.984-1.000 at
    the demo's 8 questions per slice, against a prior of 0.87-0.91).
    """

    def __init__(self, view_tokens: np.ndarray, view_of: np.ndarray, asked: np.ndarray):
        self.view_tokens, self.view_of, self.asked = view_tokens, np.asarray(view_of, np.int64), asked
        self.half = view_tokens.shape[-1] // 2
        self.shape = (len(self.view_of), *view_tokens.shape[1:])

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, rows) -> np.ndarray:
        out = np.array(self.view_tokens[self.view_of[rows]], np.float32)
        asked = self.asked[rows]
        at = slice(_ASKED_AT, _ASKED_AT + ORACLE_ASKED)
        out[..., 0, at] = asked
        out[..., 0, self.half + at.start:self.half + at.stop] = -asked
        return out


# ------------------------------------------------------------------ the planted canonical-anatomy backbone

def canonical_tile_tokens(samples, mean_xy: np.ndarray) -> np.ndarray:
    """Planted Level 1-2 tokens [N, 16, 1, 32 + 4 * ORACLE_BINS] of the canonical-anatomy backbone
    (issue 42 item 6): each present tile's organ identity (signed one-hot) and its organ's USUAL
    position, ``mean_xy`` [16, 2] (the training tile sets' mean centroid,
    :func:`~robustbench_fm.methods.spar.metrics.mean_position`) as Gaussian bumps; zeros for an
    absent tile. No per-slice geometry: the tokens of an organ are the same on every slice, so heads
    on them score near the Canonical recall row's MED (the mean position). They still see which
    organs the slice shows, so a head that places them jointly can beat the row's Perm (each organ in
    its usual cell): on the demo Canonical-Trans 0.475 against 0.374 (docs/methods/spar.md, "Where the
    demo's figures come from")."""
    present = np.asarray(samples.present, bool)
    n, t = present.shape
    per_organ = np.concatenate([_one_hot(np.arange(t), t), _bumps(mean_xy[:, 0]), _bumps(mean_xy[:, 1])], axis=-1)
    tok = np.broadcast_to(per_organ, (n, t, per_organ.shape[-1])).copy()
    tok[~present] = 0.0
    return tok[:, :, None, :].astype(np.float32)


def canonical_geometry(mean_xy: np.ndarray, views, known: bool):
    """:func:`_view_geometry`'s tuple for the canonical backbone: every organ present at its usual
    position ``mean_xy`` [16, 2] (normalised frame), moved by the view's transform when the backbone
    ``known`` it (an in-domain image) and left as usual otherwise (transform index -1): the x ranks
    and pair-distance ranks of the usual anatomy, never of this slice."""
    transforms = views["transform"].to_numpy() if known else np.full(len(views), "none")
    n_org = len(mean_xy)
    xy = np.stack([transform_points(mean_xy, t) for t in transforms]) if len(views) else \
        np.zeros((0, n_org, 2))
    present = np.ones((len(views), n_org), bool)
    i, j = _PAIRS
    dist = np.broadcast_to(np.linalg.norm(mean_xy[i] - mean_xy[j], axis=-1), (len(views), len(i)))
    d_rank = _ranks(dist, np.ones(dist.shape, bool))
    table = np.zeros((len(views), n_org, n_org))
    table[:, i, j] = d_rank
    table[:, j, i] = d_rank
    t_idx = np.array([TRANSFORMS.index(t) for t in views["transform"]], np.int64) if known else \
        np.full(len(views), -1, np.int64)
    return present, _ranks(xy[..., 0], present), d_rank, table, t_idx


def canonical_view_tokens(mean_xy: np.ndarray, views, known: bool) -> np.ndarray:
    """Planted Level 3 tokens of the canonical-anatomy backbone in the oracle's layout
    (:func:`_view_layout`) from :func:`canonical_geometry`: the view's transform where it is
    ``known`` (the backbone recognises the orientation of the training cohort's images, as a model
    that learnt the in-domain appearance does; zero-shot it does not), no symmetry, size or tumour
    class (those need the slice). Heads on it, given the question's organs (:func:`oracle_asked`
    with this geometry), answer relative position as the Canonical recall row does in domain (the
    organ pair plus the flip) and at chance zero-shot, where both forms of a question look alike."""
    present, x_rank, d_rank, table, t_idx = canonical_geometry(mean_xy, views, known)
    classes = np.concatenate([_one_hot(t_idx, len(TRANSFORMS), t_idx >= 0)[..., :len(TRANSFORMS)],
                              np.zeros((len(views), 9))], axis=-1)
    return _view_layout(present, x_rank, d_rank, table, classes)


def _digest(image: np.ndarray) -> bytes:
    import hashlib

    image = np.ascontiguousarray(image, np.uint8)
    return hashlib.sha256(repr(image.shape).encode() + image.tobytes()).digest()


class OracleBackbone(nn.Module):
    """The planted calibration reference of SPAR (our addition, like CANDOR's planted encoders):
    ``forward(images uint8 [B, H, W]) -> [B, N, D]`` returns the tokens planted for each image,
    found by the image's bytes, computed from the organ masks behind it (:func:`oracle_tile_tokens`,
    :func:`oracle_view_tokens`), not from its pixels. Every answer SPAR asks is a function of those
    tokens that a head can learn, so heads on it must reach near-perfect Levels 1-3: the check that
    the samples, heads, training and scoring can learn at all. An all-black image (an absent organ's
    tile) gives zeros; an image it was not built for is refused."""

    has_cls = True

    def __init__(self, images: np.ndarray, tokens: np.ndarray):
        super().__init__()
        images = np.asarray(images)
        self.table: dict[bytes, np.ndarray] = {}
        for image, tok in zip(images, tokens):
            if not image.any():
                continue
            key = _digest(image)
            if key in self.table and not np.array_equal(self.table[key], tok):
                raise ValueError("OracleBackbone: two images with identical pixels carry different masks")
            self.table[key] = tok
        self.n_tokens, self.dim = tokens.shape[1:]
        self.register_buffer("mean", torch.zeros(1))  # the device the tokens go to

    @classmethod
    def for_tiles(cls, samples) -> "OracleBackbone":
        tok = oracle_tile_tokens(samples)
        n, t = tok.shape[:2]
        images = np.asarray(samples.tiles).reshape(n * t, *samples.tiles.shape[2:])
        return cls(images, tok.reshape(n * t, *tok.shape[2:]))

    @classmethod
    def for_views(cls, samples, views, images) -> "OracleBackbone":
        """``images(rows)`` gives the uint8 views of ``views`` rows (``run.view_images``)."""
        return cls(images(np.arange(len(views))), oracle_view_tokens(samples, views))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        arr = images.detach().cpu().numpy()
        out = np.zeros((len(arr), self.n_tokens, self.dim), np.float32)
        for i, image in enumerate(arr):
            if not image.any():
                continue
            tok = self.table.get(_digest(image))
            if tok is None:
                raise ValueError("OracleBackbone: an image it holds no masks for; the planted oracle reads only "
                                 "the samples it was built from")
            out[i] = tok
        return torch.from_numpy(out).to(self.mean.device)

    def pool(self, tokens: torch.Tensor) -> torch.Tensor:
        return tokens[..., 0, :]
