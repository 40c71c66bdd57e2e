"""SPAR-Bench stage (spar.md Sections 3.1-3.3): trains task heads on each encoder's token
sequences (frozen) or the whole encoder (finetuned), scores Levels 1-3 in domain and zero-shot on
the transfer cohorts, or, with ``vqa_models``, poses the Level 3 questions to image-text chat
models (SPAR-VQA).

The stage drives the encoder itself (``run_job``); pooled features alone cannot feed its
Transformer heads or finetuning, so ``run`` refuses with one line. Results:
``results/<encoder or chat model>/<dataset>/spar/<finding>/`` with finding ``localization``,
``permutation``, one per Level 3 probe and ``macro``; rows per configuration (``label``,
``section``, ``head``, ``mode``), ``seed``, ``eval_dataset`` and ``organ`` (``all`` or one organ).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ...core.devices import resolve_device
from ...core.errors import UserError
from ...core.results import Results
from ..job import JobContext

GROUP_COLUMNS = ["label", "section", "head", "mode", "eval_dataset", "organ", "seed"]
PARAM_COLUMNS = ["epochs", "chance"]
DEFAULT_LABELS = {"resnet50_in1k": "CNN", "vit_b32_in1k": "ViT", "rad_dino": "RadDINO", "biomedclip": "BiomedCLIP",
                  "sam_med2d": "SAM-Med2D"}
HEAD_LABELS = {"mlp": "MLP", "transformer": "Trans", "combined": "Combined"}
SECTIONS = ("Trained from scratch", "Frozen foundation models", "Finetuned foundation models")


def run(features, manifest, **params):
    raise UserError("stage 'spar' trains heads on token sequences and finetunes encoders, so it needs the "
                    "encoder itself, not pooled features; run it through the app (experiment=spar_word)")


def check_params(levels=("localization", "permutation", "spatial_queries"), heads=("mlp", "transformer"),
                 modes=None, combined=(), seeds=(42,), lr=1e-4, batch_size=16, max_epochs=50, patience=20,
                 sinkhorn_tau=0.3, sinkhorn_iters=20, smoothing=0.1, token_grid=7, tile_token_grid=2,
                 vqa_models=(), **_):
    from .run import HEADS, LEVELS, MODES
    from .vqa import MODELS

    for name, values, known in (("levels", levels, LEVELS), ("heads", heads, HEADS)):
        bad = [v for v in values if v not in known]
        if bad:
            raise ValueError(f"stage.params.{name}: unknown {bad}; use {', '.join(known)}")
    for enc, own in (modes or {}).items():
        bad = [m for m in own if m not in MODES]
        if bad:
            raise ValueError(f"stage.params.modes.{enc}: unknown {bad}; use {', '.join(MODES)}")
    bad = [m for m in vqa_models if m not in MODELS]
    if bad:
        raise ValueError(f"stage.params.vqa_models: unknown {bad}; known: {', '.join(MODELS)}")
    if not seeds:
        raise ValueError("stage.params.seeds must list at least one seed")
    if lr <= 0 or batch_size < 1 or max_epochs < 1 or patience < 1:
        raise ValueError("stage.params: need lr > 0, batch_size >= 1, max_epochs >= 1, patience >= 1")
    if sinkhorn_tau <= 0 or sinkhorn_iters < 1 or not 0 <= smoothing < 1:
        raise ValueError("stage.params: need sinkhorn_tau > 0, sinkhorn_iters >= 1, 0 <= smoothing < 1")
    if token_grid < 1 or tile_token_grid < 1:
        raise ValueError("stage.params: token_grid and tile_token_grid must be >= 1")


def config_label(encoder: str, head: str, mode: str, labels: dict, scratch) -> tuple[str, str]:
    """(row label, section) in the paper's style: CNN-MLP, ViT-Combined, RadDINO-Trans†."""
    base = labels.get(encoder, encoder)
    label = f"{base}-{HEAD_LABELS[head]}"
    if encoder in scratch:
        return label, SECTIONS[0]
    return (label, SECTIONS[1]) if mode == "frozen" else (f"{label}\u2020", SECTIONS[2])


def _samples(dataset: str, root, cache_dir, seed: int, options: dict):
    from .samples import build_samples

    return build_samples(dataset, root, cache_dir, seed=seed, **options)


def _transfer_samples(transfer: dict, cache_dir, seed: int) -> dict:
    """Samples of every transfer cohort ``{name: {dataset, root, options}}``; a generated
    (phantom) dataset is written first (once, under a lock)."""
    from ... import data
    from ...core.locking import FileLock

    out = {}
    for name, spec in (transfer or {}).items():
        dataset, root, options = spec["dataset"], Path(spec["root"]), dict(spec.get("options") or {})
        adapter = data.get(dataset)
        if adapter.generate is not None:  # idempotent; parallel sweep jobs share the folder
            root.parent.mkdir(parents=True, exist_ok=True)
            with FileLock(root.parent / f".{root.name}.generate.lock", timeout=None):
                adapter.generate(root, **options)
        elif not root.is_dir():
            raise FileNotFoundError(f"stage.params.transfer.{name}: root '{root}' does not exist; point it "
                                    f"at the {dataset} folder or drop the cohort (stage.params.transfer={{}})")
        out[name] = _samples(dataset, root, cache_dir, seed, options)
    return out


def _save(rows: pd.DataFrame, encoder: str, dataset: str, out_dir: Path, params: dict) -> list[pd.DataFrame]:
    summaries = []
    for finding, part in rows.groupby("finding", sort=False):
        part = part.reset_index(drop=True)
        part.insert(0, "encoder", encoder)
        part.insert(1, "dataset", dataset)
        Results(summary=part, params={**params, "finding": finding}).save(
            out_dir / "results" / encoder / dataset / "spar" / str(finding))
        summaries.append(part)
    return summaries


def run_job(job: JobContext) -> list[pd.DataFrame]:
    """Every configuration of every encoder of ``job`` (or every chat model of ``vqa_models``).
    Encoders are loaded through the job's embedder (the user's weights apply) on the stage's
    own ``device``, with ``encoder_overrides`` (e.g. an input size) replacing spec fields."""
    from .run import Setup, TrainConfig, configurations, run_encoder

    p = job.params
    out_dir = Path(job.out_dir)
    cache_dir = Path(job.embedder.cache_dir)
    samples = _samples(job.dataset, job.root, cache_dir, int(job.seed), job.dataset_options)
    summaries = []
    if p.get("vqa_models"):
        from .vqa import run_vqa

        for model in p["vqa_models"]:
            rows = run_vqa(model, samples, seeds=p.get("seeds", [42]), device=p.get("device", "auto"),
                           **(p.get("vqa") or {}))
            rows["eval_dataset"] = job.dataset
            summaries += _save(rows, model, job.dataset, out_dir, p)
        return summaries
    device = resolve_device(p.get("device", "auto"))
    transfers = _transfer_samples(p.get("transfer") or {}, cache_dir, int(job.seed))
    setup = Setup(levels=tuple(p["levels"]), heads=tuple(p["heads"]), seeds=tuple(p["seeds"]),
                  train=TrainConfig(lr=p["lr"], batch_size=p["batch_size"], max_epochs=p["max_epochs"],
                                    patience=p["patience"]),
                  **{k: p[k] for k in ("token_grid", "tile_token_grid", "sinkhorn_tau", "sinkhorn_iters",
                                       "smoothing", "sdr_px", "d_model", "head_layers", "hidden") if k in p})
    labels = {**DEFAULT_LABELS, **(p.get("labels") or {})}
    for name in job.encoders:
        enc = job.embedder.load(name, device=device, **(p.get("encoder_overrides") or {}).get(name, {}))
        configs = configurations(name, setup.heads, p.get("modes") or {}, p.get("combined") or [])
        rows = run_encoder(enc, samples, transfers, setup, configs, device, cache_dir / "spar_tokens", job.dataset)
        names = [config_label(name, h, m, labels, p.get("scratch") or []) for h, m in zip(rows["head"], rows["mode"])]
        rows.insert(0, "label", [n[0] for n in names])
        rows.insert(1, "section", [n[1] for n in names])
        summaries += _save(rows, name, job.dataset, out_dir, p)
    return summaries
