"""Running a registered stage: on features you already have (:func:`evaluate`, the public
``robustbench_fm.evaluate``) and once per finding with its results saved (:func:`score_and_save`,
what a job and a ``run_job`` stage do after extraction)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..core.errors import InvalidSetting
from ..core.handover import HandedOver, hand_over
from ..core.results import Results
from ..data import manifest as mf
from . import get, method
from .params import StageParams, with_params


def evaluate(stage: str, features, manifest, params: StageParams | dict | None = None, **kw) -> Results:
    """Run metric ``stage`` on ``features`` aligned row-for-row with ``manifest``.

    ``features``: an (N, D) array/tensor in manifest order, or the path of a feature parquet
    (a cache shard, a cache folder, or any parquet with ``sample_id`` + ``embedding``), then
    aligned to the manifest by ``sample_id``. ``manifest``: a DataFrame or a CSV/parquet path.
    ``kw`` are the stage's parameters (see the stage module's docstring) and ``finding``; ``params``:
    its typed parameters instead (the plan's :class:`~robustbench_fm.methods.params.StageParams`,
    handed to the stage's ``run`` unchanged: :func:`~robustbench_fm.methods.params.with_params`). An in-memory
    float64 matrix is passed on as float64, anything else as float32. A stage declared
    ``overwrites_features`` may overwrite features read from a path, or a matrix marked with
    :func:`~robustbench_fm.core.handover.hand_over`; any other matrix is left as it is.
    """
    module = get(stage)
    handed_over = isinstance(features, HandedOver)
    if isinstance(manifest, (str, Path)):
        manifest = mf.read(manifest)
    else:
        manifest = mf.validate(manifest)
    if isinstance(features, (str, Path)):
        # the features package imports torch: only when features come as a path
        from ..features.load import align_features, load_features

        ids, emb = load_features(features)
        features = align_features(ids, emb, manifest, str(features))
        handed_over = True
    else:
        features = np.asarray(features.cpu() if hasattr(features, "cpu") else features)
        # float64 stays float64 (CRoMa computes distances in the input precision); all else float32
        features = features.astype(np.float64 if features.dtype == np.float64 else np.float32, copy=False)
        if features.ndim != 2 or features.shape[0] != len(manifest):
            raise InvalidSetting(f"features: shape {features.shape} does not match the manifest's "
                             f"{len(manifest)} rows; pass an (N, D) matrix aligned with the manifest")
    if handed_over and method(stage).overwrites_features:
        features = hand_over(features)
    return with_params(module.run, params, features, manifest, **kw)


def score_and_save(stage: str, features, manifest: pd.DataFrame, findings, params: StageParams | dict, out: Path,
                   encoder: str, dataset: str, handed_over: bool = False) -> list[pd.DataFrame]:
    """Run ``stage`` for every finding and save ``results/<encoder>/<dataset>/<stage>/<finding>/``.

    ``params``: the stage's parameters, the plan's typed object (passed on unchanged) or a mapping.
    ``handed_over``: the caller will not read an in-memory ``features`` again, so the stage's last
    call may overwrite it (:func:`evaluate`).

    A stage declared ``multi_finding`` (its ``Method``, :mod:`robustbench_fm.methods`) gets all
    findings in one call (CANDOR shares one similarity pass per matched group across them); its
    results are saved per finding alike.
    """
    findings = [str(f) for f in findings]
    last = hand_over(features) if handed_over and isinstance(features, np.ndarray) else features
    if method(stage).multi_finding:
        res = evaluate(stage, last, manifest, params, finding=findings)
        # rows pooled across findings (e.g. CANDOR's severity-weighted chest rate) keep their own name
        findings = findings + sorted(set(res.summary["finding"].astype(str)) - set(findings))
        parts = [(f, Results(summary=res.summary[res.summary["finding"] == f].reset_index(drop=True),
                             per_sample=None if res.per_sample is None else
                             res.per_sample[res.per_sample["finding"] == f].reset_index(drop=True),
                             params={**res.params, "finding": f},
                             items=None if res.items is None else
                             res.items[res.items["finding"] == f].reset_index(drop=True),
                             neighbours=None if res.neighbours is None else
                             res.neighbours[res.neighbours["finding"] == f].reset_index(drop=True))) for f in findings]
    else:
        parts = [(f, evaluate(stage, last if i == len(findings) - 1 else features, manifest, params, finding=f))
                 for i, f in enumerate(findings)]
    summaries = []
    for finding, res in parts:
        res.summary.insert(0, "encoder", encoder)
        res.summary.insert(1, "dataset", dataset)
        if res.neighbours is not None and "encoder" not in res.neighbours.columns:
            res.neighbours.insert(0, "encoder", encoder)
        res.save(Path(out) / "results" / encoder / dataset / stage / finding)
        summaries.append(res.summary)
    return summaries
