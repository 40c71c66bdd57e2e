"""Train and score every SPAR configuration of one encoder (spar.md Sections 3.1-3.3).

A configuration is (head, mode): head ``mlp`` | ``transformer`` | ``combined`` (ViT-Combined),
mode ``frozen`` (heads only, on cached token sequences) or ``finetuned`` (the whole encoder).
Each is trained independently per level (localization, permutation, Level 3 with one head and
one loss per probe) and seed on the dataset's train split, early-stopped on its val split, at the
one learning rate of spar.md Section 3.2 (``lr_selection="fixed"``, the default) or at every rate
of the search, keeping the one with the lowest validation loss (``"per_configuration"``; see
:class:`~robustbench_fm.methods.spar.params.SparParams`); it is scored on the test split and,
without retraining, on every transfer dataset (all of its samples).
"""
from __future__ import annotations

import contextlib
import copy
import hashlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd
import torch

from ...core.devices import torch_threads
from ...features.recipe import recipe_fields
from ...features.store import FeatureStore
from . import metrics
from .heads import MAX_CLASSES, MLPHead, ProbeHeads, SparModel, TransformerHead, probe_losses
from .models import (
    AskedTokens,
    Backbone,
    CombinedViT,
    OracleBackbone,
    canonical_geometry,
    canonical_tile_tokens,
    canonical_view_tokens,
    oracle_asked,
)
from .params import CANONICAL, HEADS, LEVELS, MODES, PLANTED, TILE_LEVELS, SparParams  # noqa: F401  (importable here)
from .probes import N_CLASSES
from .samples import L3_PROBES, ORGANS, SparSamples, apply_transform
from .sinkhorn import hungarian, permutation_loss, sinkhorn
from .train import TrainConfig, fit, predict

log = logging.getLogger(__name__)

#: Question encoding: one-hot probe, then one one-hot over ORGANS for each of organ_a..organ_d.
QUESTION_DIM = len(L3_PROBES) + 4 * len(ORGANS)
#: Classes of each Level 3 head, in L3_PROBES order.
N_CLASSES_L3 = tuple(N_CLASSES[p] for p in L3_PROBES)


@dataclass(frozen=True)
class Setup:
    """What every configuration of one run shares (spar.md Section 3.2 defaults, those of
    :class:`~robustbench_fm.methods.spar.params.SparParams`)."""

    levels: tuple[str, ...] = SparParams.levels
    heads: tuple[str, ...] = SparParams.heads
    seeds: tuple[int, ...] = SparParams.seeds
    train: TrainConfig = field(default_factory=TrainConfig)
    lr_selection: str = SparParams.lr_selection
    lr_search: tuple[float, ...] = SparParams.lr_search
    token_grid: int = SparParams.token_grid
    tile_token_grid: int = SparParams.tile_token_grid
    sinkhorn_tau: float = SparParams.sinkhorn_tau
    sinkhorn_iters: int = SparParams.sinkhorn_iters
    smoothing: float = SparParams.smoothing
    sdr_px: float = SparParams.sdr_px
    d_model: int = SparParams.d_model
    head_layers: int = SparParams.head_layers
    hidden: int = SparParams.hidden
    cpu_threads: int = SparParams.cpu_threads
    eval_batch_size: int = 64


# ------------------------------------------------------------------ inputs

def encode_questions(questions: pd.DataFrame) -> np.ndarray:
    """Question conditioning [n, QUESTION_DIM]: one-hot probe and one-hot organ_a..organ_d
    (zeros for an unused or non-organ slot)."""
    out = np.zeros((len(questions), QUESTION_DIM), np.float32)
    rows = np.arange(len(questions))
    out[rows, questions["probe"].map(L3_PROBES.index).to_numpy()] = 1.0
    organ_index = {o: i for i, o in enumerate(ORGANS)}
    for k, col in enumerate(("organ_a", "organ_b", "organ_c", "organ_d")):
        if col in questions:
            idx = questions[col].map(organ_index).to_numpy(dtype=float)
            ok = ~np.isnan(idx)
            out[rows[ok], len(L3_PROBES) + k * len(ORGANS) + idx[ok].astype(int)] = 1.0
    return out


def slice_views(samples: SparSamples) -> tuple[pd.DataFrame, np.ndarray]:
    """Unique (slice_row, transform) views the questions show, and each question's view row."""
    keys = samples.questions[["slice_row", "transform"]].astype({"slice_row": int, "transform": str})
    views = keys.drop_duplicates().reset_index(drop=True)
    lookup = {(r, t): i for i, (r, t) in enumerate(views.itertuples(index=False))}
    return views, np.array([lookup[(r, t)] for r, t in keys.itertuples(index=False)], dtype=np.int64)


def view_images(samples: SparSamples, views: pd.DataFrame, rows: np.ndarray) -> np.ndarray:
    """uint8 [len(rows), H, W]: the slices of ``views`` rows as their questions present them."""
    slice_rows, transforms = views["slice_row"].to_numpy(), views["transform"].to_numpy()
    return np.stack([np.ascontiguousarray(apply_transform(np.asarray(samples.slices[slice_rows[r]]), transforms[r]))
                     for r in rows])


def token_fields(encoder, token_grid: int, cohort: str, tiles: bool, ids, views: pd.DataFrame | None) -> dict:
    """The key fields of a cohort's cached frozen tokens, keyed like every other feature entry: the
    encoder's recipe (:func:`robustbench_fm.features.recipe.recipe_fields`: identity, weights,
    preprocessing, precision and the major versions of torch and of its library, not its
    description), plus what the tokens are of: the token grid, the cohort, tiles or slice views,
    the inputs' sample_ids and (slices) the views. SPAR's inputs are arrays, never a JPEG the
    reader decodes, so the recipe is the exact-decode one (no decode field)."""
    def digest(text: str) -> str:
        return hashlib.sha256(text.encode()).hexdigest()

    return {**recipe_fields(encoder, decode="exact"), "array": "spar_tokens", "token_grid": int(token_grid),
            "cohort": str(cohort), "tiles": bool(tiles), "inputs": digest("\n".join(map(str, ids))),
            "views": None if views is None else digest(views.to_json())}


@torch.inference_mode()
def cached_tokens(backbone, images, n: int, key: dict | str, cache_dir: Path | None, batch: int,
                  tiles: bool) -> np.ndarray:
    """Frozen token sequences of ``n`` inputs (``images(rows) -> uint8 array``) as float16, kept as
    the array entry keyed by ``key`` (:func:`token_fields`; a name: an array an earlier release
    wrote as ``<cache_dir>/<name>.npy``) under ``cache_dir`` when a cache folder is given (frozen
    heads read cached tokens; the feature store makes it under its lock, writes it atomically and
    records its SHA-256, :meth:`robustbench_fm.features.store.FeatureStore.array`) and then
    memory-mapped. Tiles [n, T, N, D], slices [n, N, D]. Batches are written into the file as they
    come, so the whole native-token array (RadDINO at Level 3: 1,370 tokens × 768 per view) is never held in memory
    at once."""
    backbone.eval()
    device = backbone.mean.device
    step = max(1, batch // 16) if tiles else batch

    def make(alloc) -> np.ndarray:
        out = None
        for start in range(0, n, step):
            x = torch.from_numpy(np.asarray(images(np.arange(start, min(n, start + step))))).to(device)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda"):
                tok = backbone(x.flatten(0, 1)).unflatten(0, x.shape[:2]) if tiles else backbone(x)
            tok = tok.float().cpu().numpy().astype(np.float16)
            if out is None:
                out = alloc((n, *tok.shape[1:]), np.float16)
            out[start:start + len(tok)] = tok
        return out

    if cache_dir is None:
        return make(lambda shape, dtype: np.empty(shape, dtype))
    return FeatureStore(cache_dir).array(".", key, make)


# ------------------------------------------------------------------ tasks

class TileTask:
    """Levels 1-2 over the 16 organ tiles. Level 2 presents the tiles shuffled (a fresh order per
    training batch, a fixed seeded order for evaluation); the target of each input position is
    the grid cell of the organ it holds. ``train``: the in-domain TRAINING tile sets (also for a
    transfer cohort) the canonical-recall rows are taken from: each organ's mean position (Level 1,
    ``ref_med``) and its usual cell (Level 2, ``ref_perm_acc``; :mod:`.metrics`)."""

    def __init__(self, level: str, samples: SparSamples, source, device, setup: Setup, seed: int,
                 train: SparSamples | None = None, train_idx: np.ndarray | None = None):
        self.level, self.s, self.source, self.device, self.setup = level, samples, source, device, setup
        self.reference = None
        if train is not None and train_idx is not None and len(train_idx):
            t_present = np.asarray(train.present[train_idx])
            self.reference = metrics.mean_position(train.centroids[train_idx], t_present) \
                if level == "localization" else metrics.usual_cells(train.grid_cells[train_idx], t_present)
        self.groups = None  # batches mix all samples
        n, t = samples.present.shape
        rng = np.random.default_rng(seed)
        self.eval_perm = np.stack([rng.permutation(t) for _ in range(n)]) if level == "permutation" \
            else np.tile(np.arange(t), (n, 1))
        self.centroids = np.nan_to_num(np.asarray(samples.centroids, np.float32))

    def order(self, idx: np.ndarray, rng) -> np.ndarray:
        if self.level != "permutation" or rng is None:
            return self.eval_perm[idx]
        return rng.permuted(np.tile(np.arange(self.eval_perm.shape[1]), (len(idx), 1)), axis=1)

    def batch(self, idx, rng):
        perm = self.order(idx, rng)
        rows = np.arange(len(idx))[:, None]
        x = torch.from_numpy(np.asarray(self.source[idx])[rows, perm]).to(self.device)
        present = torch.from_numpy(np.asarray(self.s.present[idx])[rows, perm]).to(self.device)
        if self.level == "localization":
            target = torch.from_numpy(self.centroids[idx][rows, perm]).to(self.device)
        else:
            target = torch.from_numpy(np.asarray(self.s.grid_cells[idx])[rows, perm]).to(self.device)
        return x, None, (target, present)

    def loss(self, out, target):
        target, present = target
        if self.level == "localization":  # MSE masked by organ presence (spar.md Level 1)
            err = ((torch.sigmoid(out) - target) ** 2).sum(-1)
            return (err * present).sum() / present.sum().clamp_min(1)
        p = sinkhorn(out, self.setup.sinkhorn_tau, self.setup.sinkhorn_iters)
        return permutation_loss(p, target, present, self.setup.smoothing)

    def score(self, out: np.ndarray, idx: np.ndarray) -> list[dict]:
        """Metric rows (overall and per organ) for outputs on ``idx`` in evaluation order."""
        perm = self.eval_perm[idx]
        rows = np.arange(len(idx))[:, None]
        present = np.asarray(self.s.present[idx])
        if self.level == "localization":  # MED / SDR in the 224 frame, the native slice frame beside
            pred = np.empty_like(out)
            pred[rows, perm] = 1.0 / (1.0 + np.exp(-out))
            native = metrics.native_frame(self.s.table["sample_id"].to_numpy()[idx], self.s.slice_table)
            resized = np.array(self.s.slices.shape[-1:-3:-1], np.float32)  # (W, H) of the resized slices
            m, m_n = (metrics.localization(pred, self.centroids[idx], present, self.setup.sdr_px, scale=sc)
                      for sc in (resized, native))
            scale = np.asarray(resized, float)  # the 224 frame, in float64 as metrics.localization computes ``med``
            dist = np.linalg.norm(np.asarray(pred, float) * scale - np.asarray(self.centroids[idx], float) * scale,
                                  axis=-1)
            self.items = self._slot_items(idx, present, "med", dist)
            overall = {"med": m["med"], "sdr": m["sdr"], "med_native": m_n["med"], "sdr_native": m_n["sdr"],
                       "n": m["n"]}
            per = [{"organ": o, "med": v, "med_native": v_n, "n": int(present[:, j].sum())} for j, (o, v, v_n) in
                   enumerate(zip(ORGANS, m["per_slot_med"], m_n["per_slot_med"]))]
            if self.reference is not None:  # each organ's mean training position, in both frames
                guess = np.broadcast_to(self.reference, pred.shape)
                r, r_n = (metrics.localization(guess, self.centroids[idx], present, self.setup.sdr_px, scale=sc)
                          for sc in (resized, native))
                overall.update(ref_med=r["med"], ref_med_native=r_n["med"])
                for row, v, v_n in zip(per, r["per_slot_med"], r_n["per_slot_med"]):
                    row.update(ref_med=v, ref_med_native=v_n)
        else:
            shown = present[rows, perm]  # present slots only (spar.md Level 2: missing slots are ignored)
            p = sinkhorn(torch.from_numpy(out), self.setup.sinkhorn_tau, self.setup.sinkhorn_iters,
                         torch.from_numpy(shown)).numpy()
            cells = np.empty_like(perm)
            cells[rows, perm] = hungarian(p, shown)
            m = metrics.permutation(cells, np.asarray(self.s.grid_cells[idx]), present)
            self.items = self._slot_items(idx, present, "patch_acc",
                                          (cells == np.asarray(self.s.grid_cells[idx])).astype(float))
            overall = {"patch_acc": m["patch_acc"], "perm_acc": m["perm_acc"], "n": m["n"]}
            per = [{"organ": o, "patch_acc": v, "n": int(present[:, j].sum())} for j, (o, v) in
                   enumerate(zip(ORGANS, m["per_slot_acc"]))]
            if self.reference is not None:  # each organ in its usual training cell
                r = metrics.permutation(metrics.usual_cell_assignment(self.reference, present),
                                        np.asarray(self.s.grid_cells[idx]), present)
                overall.update(ref_patch_acc=r["patch_acc"], ref_perm_acc=r["perm_acc"])
                for row, v in zip(per, r["per_slot_acc"]):
                    row.update(ref_patch_acc=v)
        return [{"finding": self.level, "organ": "all", **overall}] + [{"finding": self.level, **r} for r in per]

    def _slot_items(self, idx: np.ndarray, present: np.ndarray, metric: str, values: np.ndarray) -> pd.DataFrame:
        """The items :meth:`score` scored, for paired comparisons between encoders (``Results.items``):
        one per present organ slot of a test tile set, its ``metric`` value and its volume (subject)."""
        at, slot = np.nonzero(present)
        ids = self.s.table["sample_id"].to_numpy()[idx][at]
        return pd.DataFrame({"item": [f"{i}:{ORGANS[j]}" for i, j in zip(ids, slot)], "finding": self.level,
                             "organ": "all", metric: values[at, slot],
                             "cluster": _volumes(self.s.table)[idx][at]})


def _volumes(table: pd.DataFrame) -> np.ndarray:
    """Each row's volume (``subject_id``: the cluster paired comparisons resample), its sample_id where
    a table names no subject."""
    return table["subject_id" if "subject_id" in table.columns else "sample_id"].astype(str).to_numpy()


class QueryTask:
    """Level 3: a whole (possibly transformed) slice and its question, routed to its probe's own
    head (:class:`~robustbench_fm.methods.spar.heads.ProbeHeads`), which answers with its own
    number of classes and is trained on its own cross-entropy. ``train``: the training questions
    (of the in-domain cohort, also for a transfer cohort) that the majority-class and question-only
    reference answers are taken from (:func:`metrics.reference_answers`, :func:`metrics.canonical_answers`), or
    ``reference``: those answers computed once for the cohort (:func:`reference_rows`)."""

    def __init__(self, samples: SparSamples, source, view_of: np.ndarray, device, train: pd.DataFrame | None = None,
                 reference: tuple | None = None):
        q = samples.questions
        self.s, self.source, self.view_of, self.device = samples, source, view_of, device
        self.cond = encode_questions(q)
        self.probe = q["probe"].map(L3_PROBES.index).to_numpy()
        self.groups = self.probe  # batches of one probe: each step trains the head its batch routes to
        self.label = q["label"].to_numpy(np.int64)
        self.n_classes = q["n_classes"].to_numpy(np.int64)
        self.reference = reference if reference is not None else \
            None if train is None else reference_rows(train, q)

    def batch(self, idx, rng):
        x = torch.from_numpy(np.asarray(self.source(self.view_of[idx]))).to(self.device)
        target = tuple(torch.from_numpy(a[idx]).to(self.device) for a in (self.probe, self.label, self.n_classes))
        return x, torch.from_numpy(self.cond[idx]).to(self.device), target

    def loss(self, out, target):
        """The sum of the six heads' own mean cross-entropies (spar.md Level 3: "cross-entropy loss
        per head"); each head's parameters receive the gradient of their own loss only."""
        probe, label, _ = target
        return probe_losses(out, probe, label, N_CLASSES_L3).sum()

    def score(self, out: np.ndarray, idx: np.ndarray) -> list[dict]:
        """Accuracy per probe from each head's logits (``out`` [n, MAX_CLASSES], -inf beyond a head's classes)."""
        k = self.n_classes[idx]
        pred = np.where(np.arange(MAX_CLASSES)[None] < k[:, None], out, -np.inf).argmax(-1)
        probes = np.array(L3_PROBES)[self.probe[idx]]
        ref = (None, None, None) if self.reference is None else tuple(r[idx] for r in self.reference)
        q = self.s.questions
        subject = _volumes(self.s.slice_table)[q["slice_row"].to_numpy()[idx]]
        # the items scored, for paired comparisons between encoders: each question, right or wrong, its volume
        self.items = pd.DataFrame({"item": q["question_id"].astype(str).to_numpy()[idx], "finding": probes,
                                   "organ": "all", "accuracy": (pred == self.label[idx]).astype(float),
                                   "cluster": subject})
        return [{**r, "organ": "all"} for r in metrics.probe_rows(pred, self.label[idx], probes, self.n_classes[idx],
                                                                  *ref)]


def reference_rows(train: pd.DataFrame, asked: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(majority, question-only prior, canonical recall) answers to ``asked`` from the TRAINING
    questions ``train`` (:func:`metrics.reference_answers`, :func:`metrics.canonical_answers`): the
    same for every encoder and configuration, so a run computes them once per cohort."""
    majority, prior = metrics.reference_answers(train, asked)
    return majority, prior, metrics.canonical_answers(train, asked, prior)


# ------------------------------------------------------------------ configurations

def _head(head: str, level: str, dim: int, n_tokens: int, has_cls: bool, setup: Setup) -> torch.nn.Module:
    """The task head of ``level``: per tile slot at Levels 1-2; at Level 3 six separate heads,
    one per probe, each question-conditioned (:class:`ProbeHeads`)."""
    if level in TILE_LEVELS:
        n_out = 2 if level == "localization" else len(ORGANS)
        if head == "transformer":
            return TransformerHead(dim, n_out, n_tokens, n_tiles=len(ORGANS), d_model=setup.d_model,
                                   layers=setup.head_layers)
        return MLPHead(dim, n_out, has_cls, n_tiles=len(ORGANS), hidden=setup.hidden)
    if head == "transformer":
        return ProbeHeads(lambda k: TransformerHead(dim, k, n_tokens, cond_dim=QUESTION_DIM, d_model=setup.d_model,
                                                    layers=setup.head_layers), N_CLASSES_L3)
    return ProbeHeads(lambda k: MLPHead(dim, k, has_cls, cond_dim=QUESTION_DIM, hidden=setup.hidden), N_CLASSES_L3)


def _split_idx(table: pd.DataFrame, split: str) -> np.ndarray:
    return np.flatnonzero(table["split"].to_numpy() == split)


class EncoderRun:
    """All configurations of one loaded encoder (or of the planted oracle, ``encoder`` =
    :data:`~robustbench_fm.methods.spar.params.ORACLE`, or the canonical-anatomy backbone,
    :data:`~robustbench_fm.methods.spar.params.CANONICAL`, frozen only) on one dataset and its
    transfer datasets."""

    def __init__(self, encoder, samples: SparSamples, transfers: dict[str, SparSamples], setup: Setup,
                 device: torch.device, cache_dir: Path | None, dataset: str, references: dict | None = None):
        self.encoder, self.samples, self.transfers, self.setup = encoder, samples, transfers, setup
        self.device, self.cache_dir, self.dataset = device, cache_dir, dataset
        self.oracle = isinstance(encoder, str) and encoder in PLANTED  # a planted backbone (ORACLE, CANONICAL)
        self.planted = encoder if self.oracle else None
        self._frozen: dict = {}
        self.items: list[pd.DataFrame] = []  # what each configuration scored, item by item (run_encoder)
        # cohort name -> its Level 3 reference answers (reference_rows), shared by every encoder of a job
        self.references = {} if references is None else references

    # --- inputs per (mode, level, cohort)
    def _frozen_source(self, level: str, name: str, samples: SparSamples):
        """Cached frozen tokens of cohort ``name`` for ``level``: (source, view_of or None, backbone dims)."""
        key = (level in TILE_LEVELS, name)
        if key not in self._frozen:
            tiles = level in TILE_LEVELS
            ids = samples.table["sample_id"] if tiles else samples.slice_table["sample_id"]
            views, view_of = (None, None) if tiles else slice_views(samples)
            n = len(ids) if tiles else len(views)
            images = (lambda r: samples.tiles[r]) if tiles else (lambda r: view_images(samples, views, r))
            if self.oracle:  # planted tokens from the masks: cheap, never cached on disk
                geometry = None
                if self.planted == CANONICAL:  # the usual anatomy of the in-domain TRAINING data
                    backbone, geometry = self._canonical(tiles, name, samples, views, images)
                else:
                    backbone = OracleBackbone.for_tiles(samples) if tiles else \
                        OracleBackbone.for_views(samples, views, images)
                tokens = cached_tokens(backbone, images, n, self.planted, None, self.setup.eval_batch_size, tiles)
                if not tiles:  # the oracle reads the question too: tokens per question (models.AskedTokens)
                    asked = oracle_asked(samples, views, view_of, encode_questions(samples.questions), geometry)
                    tokens, view_of = AskedTokens(tokens, view_of, asked), np.arange(len(view_of))
                self._frozen[key] = (tokens, view_of, True)
                return self._frozen[key]
            backbone = Backbone(self.encoder, self.setup.tile_token_grid if tiles else self.setup.token_grid)
            fields = token_fields(self.encoder, backbone.token_grid, name, tiles, ids, None if tiles else views)
            tokens = cached_tokens(backbone, images, n, fields, self.cache_dir, self.setup.eval_batch_size, tiles)
            self._frozen[key] = (tokens, view_of, backbone.has_cls)
        return self._frozen[key]

    def _canonical(self, tiles: bool, name: str, samples: SparSamples, views, images):
        """(backbone, Level 3 geometry or None) of the planted canonical-anatomy backbone on cohort
        ``name``: each organ's mean position over the in-domain TRAINING tile sets (Levels 1-2) or
        slices (Level 3); at Level 3 the view's transform is known on the in-domain cohort only."""
        own = self.samples
        if tiles:
            train = _split_idx(own.table, "train")
            mean_xy = metrics.mean_position(own.centroids[train], own.present[train])
            flat = np.asarray(samples.tiles).reshape(-1, *samples.tiles.shape[2:])
            tok = canonical_tile_tokens(samples, mean_xy)
            return OracleBackbone(flat, tok.reshape(-1, *tok.shape[2:])), None
        train = np.flatnonzero((own.slice_table["split"] == "train").to_numpy())
        mean_xy = metrics.mean_position(own.slice_centroids[train], own.slice_present[train])
        known = name == self.dataset
        backbone = OracleBackbone(images(np.arange(len(views))), canonical_view_tokens(mean_xy, views, known))
        return backbone, canonical_geometry(mean_xy, views, known)

    def _task(self, level, name, samples, source, view_of, seed):
        if level in TILE_LEVELS:
            return TileTask(level, samples, source, self.device, self.setup, seed, self.samples,
                            _split_idx(self.samples.table, "train"))
        if name not in self.references:
            q = self.samples.questions
            self.references[name] = reference_rows(q[q["split"] == "train"], samples.questions)
        return QueryTask(samples, source, view_of, self.device, reference=self.references[name])

    def _inputs(self, mode: str, head: str, level: str, name: str, samples: SparSamples):
        """(source, view_of) for a task: cached tokens (frozen) or images (finetuned)."""
        if mode == "frozen" and head != "combined":
            tokens, view_of, _ = self._frozen_source(level, name, samples)
            return (tokens if level in TILE_LEVELS else (lambda rows: tokens[rows])), view_of
        if level in TILE_LEVELS:
            return samples.tiles, None
        views, view_of = slice_views(samples)
        return (lambda rows: view_images(samples, views, rows)), view_of

    def _model(self, mode: str, head: str, level: str) -> SparModel:
        tiles = level in TILE_LEVELS
        if self.oracle and (mode != "frozen" or head == "combined"):
            raise ValueError(f"the planted '{self.planted}' backbone is fixed: configure it frozen with "
                             "mlp/transformer "
                             "heads only")
        if head == "combined":
            enc = copy.deepcopy(self.encoder)
            enc.model.requires_grad_(True)
            backbone = CombinedViT(enc, n_tiles=len(ORGANS) if tiles else 0, cond_dim=0 if tiles else QUESTION_DIM)
            if tiles:
                h = MLPHead(backbone.dim, 2 if level == "localization" else len(ORGANS), True,
                            n_tiles=len(ORGANS), hidden=self.setup.hidden)
            else:  # the ViT already read the question: each probe's head reads its output token
                h = ProbeHeads(lambda k: MLPHead(backbone.dim, k, True, hidden=self.setup.hidden), N_CLASSES_L3)
            return SparModel(h, backbone, joint_tiles=tiles).to(self.device)
        if mode == "frozen":
            tokens, _, has_cls = self._frozen_source(level, self.dataset, self.samples)
            return SparModel(_head(head, level, tokens.shape[-1], tokens.shape[-2], has_cls, self.setup)) \
                .to(self.device)
        enc = copy.deepcopy(self.encoder)
        enc.model.requires_grad_(True)
        backbone = Backbone(enc, self.setup.tile_token_grid if tiles else self.setup.token_grid)
        with torch.no_grad():
            tok = backbone(torch.zeros(1, 8, 8, dtype=torch.uint8, device=self.device))
        return SparModel(_head(head, level, backbone.dim, tok.shape[-2], backbone.has_cls, self.setup),
                         backbone).to(self.device)

    def run_config(self, head: str, mode: str, level: str, seed: int) -> list[dict]:
        """Train one configuration at one level and seed, and score it: metric rows for the test
        split and every transfer cohort, with the ``lr`` used and the ``epochs`` trained (a Level 3
        probe's own).

        ``setup.lr_selection="fixed"`` (default): one training run at ``setup.train.lr`` (spar.md
        Section 3.2: "learning rate 10^-4"). ``"per_configuration"``: one run per rate of
        ``setup.lr_search``, each from the same seeded initialisation, keeping the one with the
        lowest validation loss ("logarithmic search over 10^-3 to 10^-6", repeated for this
        configuration, level and seed; at a frozen Level 3, for each probe head, see
        :func:`_assemble`)."""
        s, setup = self.samples, self.setup
        table = s.table if level in TILE_LEVELS else s.questions
        source, view_of = self._inputs(mode, head, level, self.dataset, s)
        task = self._task(level, self.dataset, s, source, view_of, seed)
        train_idx, val_idx, test_idx = (_split_idx(table, k) for k in ("train", "val", "test"))
        if len(train_idx) == 0 or len(val_idx) == 0 or len(test_idx) == 0:
            raise ValueError(f"dataset '{self.dataset}': {level} needs train, val and test samples; got "
                             f"{len(train_idx)}/{len(val_idx)}/{len(test_idx)}")
        # frozen Level 3: six heads sharing nothing, each early-stopped and given its learning rate
        # on its own validation loss (train.fit's ``own``); else one model, one choice
        own = ({p: f"head.heads.{p}." for p in range(len(L3_PROBES))}
               if level not in TILE_LEVELS and mode == "frozen" and head != "combined" else None)
        tried = []
        rates = setup.lr_search if setup.lr_selection == "per_configuration" and setup.lr_search \
            else (setup.train.lr,)
        for lr in rates:
            with seeded(seed, self.device):  # initialisation and dropout draw from `seed`; the caller's RNG is restored
                model = self._model(mode, head, level)
                info = fit(model, task.batch, task.loss, train_idx, val_idx,
                           TrainConfig(**{**setup.train.__dict__, "lr": float(lr), "seed": seed}), self.device,
                           task.groups, own)
            tried.append((model, {**info, "lr": float(lr)}))
            if not own:  # one model, one choice: keep only the best so far (a finetuned copy is large)
                tried = [min(tried, key=lambda t: t[1]["val_loss"])]
            del model
        model, info = _assemble(tried, own)
        with seeded(seed, self.device):
            cohorts = [(self.dataset, task, test_idx)]
            for name, ts in self.transfers.items():
                t_source, t_view = self._inputs(mode, head, level, name, ts)
                t_table = ts.table if level in TILE_LEVELS else ts.questions
                cohorts.append((name, self._task(level, name, ts, t_source, t_view, seed), np.arange(len(t_table))))
            rows = []
            for name, t, idx in cohorts:
                if len(idx) == 0:
                    continue
                out = predict(model, t.batch, idx, setup.eval_batch_size, self.device, t.groups)
                rows += [{**r, "eval_dataset": name} for r in t.score(out, idx)]
                self.items.append(t.items.assign(eval_dataset=name, head=head, mode=mode, seed=seed))
        del model, tried
        per = info.get("by_probe", {})
        return [{"head": head, "mode": mode, "seed": seed, "epochs": info["epochs"], "lr": info["lr"], **r,
                 **per.get(r["finding"], {})} for r in rows]


def _assemble(tried: list, own: dict | None) -> tuple[torch.nn.Module, dict]:
    """The model to score from ``tried`` [(model, fit info + lr)] of the learning-rate search
    (spar.md Section 3.2: "logarithmic search over 1e-3 to 1e-6" on validation). Without ``own``:
    the one model left (the search keeps only the best so far). With ``own`` (independent Level 3
    heads): each probe's head from the rate whose model gave THAT head the lowest validation loss,
    so ``info["by_probe"]`` holds each probe's own ``lr`` and ``epochs``; the overall ``lr`` is the
    rate every head chose, or NaN when they differ, and ``epochs`` the most any head trained."""
    if not own:
        return tried[0]
    model = tried[0][0]
    by_probe = {}
    for p, prefix in own.items():
        src, info = min(tried, key=lambda t: t[1]["by_group"][p]["val_loss"])
        if src is not model:
            model.load_state_dict({k: v for k, v in src.state_dict().items() if k.startswith(prefix)}, strict=False)
        by_probe[L3_PROBES[p]] = {"lr": info["lr"], "epochs": info["by_group"][p]["epochs"]}
    lrs = {v["lr"] for v in by_probe.values()}
    return model, {"epochs": max(v["epochs"] for v in by_probe.values()),
                   "lr": lrs.pop() if len(lrs) == 1 else float("nan"), "by_probe": by_probe}


@contextlib.contextmanager
def seeded(seed: int, device) -> Iterator[None]:
    """Torch's generators seeded with ``seed`` inside the block and restored after it (the CPU's
    and, on CUDA, the device's), so a configuration's initialisation and dropout depend on its
    seed only and the caller's random state is untouched (no global seeding leaks out)."""
    devices = [torch.device(device)] if torch.device(device).type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(int(seed))
        yield


def configurations(encoder: str, heads, modes: dict, combined) -> list[tuple[str, str]]:
    """(head, mode) pairs of ``encoder``: its modes (``modes[encoder]`` or ``modes['default']``)
    times ``heads``, plus ViT-Combined (finetuned) for encoders listed in ``combined``."""
    own = modes.get(encoder, modes.get("default", ["frozen"]))
    out = [(h, m) for m in own for h in heads]
    if encoder in combined:
        out.append(("combined", "finetuned"))
    return out


def run_encoder(encoder, samples: SparSamples, transfers: dict[str, SparSamples], setup: Setup,
                configs: list[tuple[str, str]], device, cache_dir: Path | None, dataset: str,
                items: list | None = None, references: dict | None = None) -> pd.DataFrame:
    """Metric rows of every configuration x level x seed of one encoder (long over organs); ``items``
    (a list) receives the scored items of every configuration (one frame each: item, finding, organ,
    the metric's per-item value, cluster = volume, eval_dataset, head, mode, seed). ``references``
    (a dict the caller keeps across the encoders of one job): each cohort's Level 3 reference
    answers, computed on first use (:func:`reference_rows`)."""
    run = EncoderRun(encoder, samples, transfers, setup, device, cache_dir, dataset, references)
    name = encoder if isinstance(encoder, str) else encoder.spec.name
    rows = []
    with torch_threads(setup.cpu_threads if torch.device(device).type == "cpu" else 0):
        for head, mode in configs:
            for level in setup.levels:
                for seed in setup.seeds:
                    log.info("spar %s: %s/%s %s seed %d", name, head, mode, level, seed)
                    rows += run.run_config(head, mode, level, seed)
    if items is not None:
        items += run.items
    return pd.DataFrame(rows)
