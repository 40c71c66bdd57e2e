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

import dataclasses
import logging
from pathlib import Path

import pandas as pd

from ... import data
from ...core.devices import resolve_device
from ...core.errors import MissingInput, UserError
from ...core.locking import FileLock
from ...core.results import Results, write_notes
from ..job import JobContext
from ..params import as_config
from .params import DEFAULT_LABELS, SparParams
from .probes import L3_PROBES
from .run import Setup, TrainConfig, configurations, run_encoder
from .samples import build_samples
from .vqa import run_vqa

PARAMS = SparParams
log = logging.getLogger("robustbench_fm")
HEAD_LABELS = {"mlp": "MLP", "transformer": "Trans", "combined": "Combined"}
SECTIONS = ("Trained from scratch", "Frozen foundation models", "Finetuned foundation models")


def run(features, manifest, **params):
    raise UserError("stage 'spar' trains heads on token sequences and finetunes encoders, so it needs the "
                    "encoder itself, not pooled features; run it through the app (experiment=spar_word)")


def check_params(**params) -> SparParams:
    """Refuse unknown, mistyped or inconsistent parameters (one line each;
    :class:`~robustbench_fm.methods.spar.params.SparParams`)."""
    return PARAMS.parse(params)


def config_label(encoder: str, head: str, mode: str, labels: dict, scratch) -> tuple[str, str]:
    """(row label, section) in the paper's style: CNN-MLP, ViT-Combined, RadDINO-Trans†."""
    base = labels.get(encoder, encoder)
    label = f"{base}-{HEAD_LABELS[head]}"
    if encoder in scratch:
        return label, SECTIONS[0]
    return (label, SECTIONS[1]) if mode == "frozen" else (f"{label}\u2020", SECTIONS[2])


def _samples(dataset: str, root, cache_dir, seed: int, options: dict):

    return build_samples(dataset, root, cache_dir, seed=seed, **options)


def _transfer_samples(transfer: dict, cache_dir, seed: int) -> dict:
    """Samples of every transfer cohort ``{name: {dataset, root, options}}``; a generated
    (phantom) dataset is written first (once, under a lock)."""

    out = {}
    for name, spec in (transfer or {}).items():
        dataset, root, options = spec["dataset"], Path(spec["root"]), dict(spec.get("options") or {})
        adapter = data.get(dataset)
        if adapter.generate is not None:  # idempotent; parallel sweep jobs share the folder
            root.parent.mkdir(parents=True, exist_ok=True)
            with FileLock(root.parent / f".{root.name}.generate.lock", timeout=None):
                adapter.generate(root, **options)
        elif not root.is_dir():
            raise MissingInput(f"stage.params.transfer.{name}: root '{root}' does not exist; point it at the "
                               f"{dataset} folder (stage.params.transfer.{name}.root=<folder>) or drop the cohort "
                               f"with '~stage.params.transfer.{name}' (quoted: the shell reads '~')")
        out[name] = _samples(dataset, root, cache_dir, seed, options)
    return out


#: why a Level 3 probe can have no question in a cohort: the organs its questions need
PROBE_NEEDS = {"kidney_symmetry": "both kidneys", "liver_size": "the liver",
               "relative_position": "two present organs apart", "distance_compare": "four present organs"}


def partial_macro(rows: pd.DataFrame, cohorts: dict) -> tuple[pd.DataFrame, list[str]]:
    """Mark every Level 3 ``macro`` row that averages fewer probes than its cohort should have
    (an organ missing from every slice of a cohort leaves a probe without a question): the
    column ``macro_probes`` says ``k of n probes`` and which were dropped and why, and one note
    per cohort names them (the run's notes and the report). ``cohorts``: eval_dataset name ->
    samples. Expected: every probe of :data:`L3_PROBES` except ``tumour_count``, which is expected
    where the cohort's questions hold it (the in-domain cohort with LiTS slices; zero-shot cohorts
    have none, as in spar.md Section 3.3)."""
    if rows.empty or "finding" not in rows or "eval_dataset" not in rows or not (rows["finding"] == "macro").any():
        return rows, []
    keys = [c for c in ("head", "mode", "seed", "eval_dataset", "label") if c in rows.columns]
    rows = rows.copy()
    column = pd.Series("", index=rows.index, dtype=object)
    notes: dict[str, str] = {}
    for key, group in rows.groupby(keys, sort=False, dropna=False):
        macro = group.index[group["finding"] == "macro"]
        if not len(macro):
            continue
        cohort = str(group["eval_dataset"].iloc[0])
        samples = cohorts.get(cohort)
        asked = set() if samples is None else set(samples.questions["probe"].astype(str))
        expected = [pr for pr in L3_PROBES if pr != "tumour_count" or pr in asked]
        scored = set(group["finding"].astype(str))
        dropped = [pr for pr in expected if pr not in scored]
        if not dropped:
            continue
        why = [f"{pr} ({_why_dropped(pr, asked)})" for pr in dropped]
        text = f"{len(expected) - len(dropped)} of {len(expected)} probes; dropped: {', '.join(why)}"
        column[macro] = text
        notes.setdefault(cohort, f"SPAR {cohort}: the Level 3 macro average is partial, over {text}")
    if (column != "").any():
        rows["macro_probes"] = column
    for line in notes.values():
        log.warning(line)
    return rows, list(notes.values())


def _why_dropped(probe: str, asked: set) -> str:
    if probe in asked:
        return "no question in its evaluated split"
    if probe in PROBE_NEEDS:
        return f"no slice of the cohort holds {PROBE_NEEDS[probe]}"
    return "no question could be drawn"


def spacing_notes(cohorts: dict) -> list[str]:
    """One note per cohort whose volumes' NIfTI headers give no pixel spacing: their distance labels
    are in the 224 frame, not mm (docs/methods/spar.md, Level 3), named per volume."""
    notes = []
    for cohort, samples in cohorts.items():
        table = samples.slice_table
        if not {"spacing_x", "spacing_y"} <= set(table.columns):
            continue
        unknown = table[table["spacing_x"].isna() | table["spacing_y"].isna()]
        subjects = list(dict.fromkeys(unknown["subject_id"].astype(str)))
        if subjects:
            shown = ", ".join(subjects[:20]) + (f" and {len(subjects) - 20} more" if len(subjects) > 20 else "")
            notes.append(f"SPAR {cohort}: {len(subjects)} volume{'s' if len(subjects) != 1 else ''} without pixel "
                         f"spacing in the NIfTI header ({shown}): their distance labels are in the 224 frame, "
                         "not mm")
    for line in notes:
        log.warning(line)
    return notes


def _save(rows: pd.DataFrame, encoder: str, dataset: str, out_dir: Path, params: dict,
          items: list | None = None) -> list[pd.DataFrame]:
    """Each finding's rows (and its scored items, for paired comparisons: ``items.parquet``) under
    ``results/<encoder>/<dataset>/spar/<finding>/``."""
    summaries = []
    items = pd.concat(items, ignore_index=True) if items else None
    for finding, part in rows.groupby("finding", sort=False):
        part = part.reset_index(drop=True)
        part.insert(0, "encoder", encoder)
        part.insert(1, "dataset", dataset)
        own = None if items is None else items[items["finding"] == finding].reset_index(drop=True)
        Results(summary=part, params={**params, "finding": finding}, items=own).save(
            out_dir / "results" / encoder / dataset / "spar" / str(finding))
        summaries.append(part)
    return summaries


def setup_for(setup: Setup, own: dict) -> Setup:
    """``setup`` with one encoder's ``by_encoder`` fields (training ones into ``setup.train``)."""
    train = {k: (float(v) if k in ("lr", "min_delta") else int(v)) for k, v in own.items()
             if k in ("lr", "batch_size", "max_epochs", "patience", "min_delta")}
    rest = {k: (tuple(float(x) for x in v) if k == "lr_search" else int(v)) for k, v in own.items() if k not in train}
    return dataclasses.replace(setup, train=dataclasses.replace(setup.train, **train), **rest)


def run_job(job: JobContext) -> list[pd.DataFrame]:
    """Every configuration of every encoder of ``job`` (or every chat model of ``vqa_models``).
    Encoders are loaded through the job's embedder (the user's weights apply) on the stage's
    own ``device``, with ``encoder_overrides`` (e.g. an input size) replacing spec fields."""

    p = PARAMS.parse(job.params)
    out_dir = Path(job.out_dir)
    cache_dir = Path(job.embedder.cache_dir)
    samples = _samples(job.dataset, job.root, cache_dir, int(job.seed), job.dataset_options)
    summaries = []
    if p.vqa_models:

        for model in p.vqa_models:
            rows = run_vqa(model, samples, seeds=list(p.seeds), device=p.device, **(p.vqa or {}))
            rows["eval_dataset"] = job.dataset
            summaries += _save(rows, model, job.dataset, out_dir, as_config(job.params))
        return summaries
    device = resolve_device(p.device)
    transfers = _transfer_samples(p.transfer or {}, cache_dir, int(job.seed))
    write_notes(out_dir, spacing_notes({job.dataset: samples, **{f"transfer {n}": t for n, t in transfers.items()}}))
    setup = Setup(levels=tuple(p.levels), heads=tuple(p.heads), seeds=tuple(p.seeds),
                  lr_selection=p.lr_selection, lr_search=tuple(float(lr) for lr in p.lr_search),
                  train=TrainConfig(lr=p.lr, batch_size=p.batch_size, max_epochs=p.max_epochs, patience=p.patience,
                                    min_delta=p.min_delta),
                  **{k: getattr(p, k) for k in ("token_grid", "tile_token_grid", "sinkhorn_tau", "sinkhorn_iters",
                                                "smoothing", "sdr_px", "d_model", "head_layers", "hidden",
                                                "cpu_threads")})
    labels = {**DEFAULT_LABELS, **(p.labels or {})}
    planted = list(p.planted) if job.sweep_first else []  # once per sweep: the first job of its fan-out
    references: dict = {}  # each cohort's Level 3 reference answers, the same for every encoder
    for name in [*job.encoders, *planted]:
        if name in p.planted:  # planted: tokens from the masks, frozen heads only
            enc, configs = name, [(h, "frozen") for h in setup.heads]
        else:
            enc = job.embedder.load(name, device=device, **(p.encoder_overrides or {}).get(name, {}))
            configs = configurations(name, setup.heads, p.modes or {}, p.combined or [])
        own = setup_for(setup, (p.by_encoder or {}).get(name) or {})
        items: list[pd.DataFrame] = []
        rows = run_encoder(enc, samples, transfers, own, configs, device, cache_dir / "spar_tokens", job.dataset,
                           items, references)
        rows, notes = partial_macro(rows, {job.dataset: samples, **transfers})
        write_notes(out_dir, notes)
        names = [config_label(name, h, m, labels, p.scratch or []) for h, m in zip(rows["head"], rows["mode"])]
        rows.insert(0, "label", [n[0] for n in names])
        rows.insert(1, "section", [n[1] for n in names])
        summaries += _save(rows, name, job.dataset, out_dir, as_config(job.params), items)
    return summaries
