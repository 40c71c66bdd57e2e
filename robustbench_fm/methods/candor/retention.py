"""Erasure (occlusion) retention (candor.md, "Occlusion Retention" and "Occlusion Retention and
Discordance"; candor_v1.md Eq. 4).

For a positive x of finding F with an expert box b_F, ρ_g(x) = cos(g(x), g(x ⊖ b_F)), where
x ⊖ b_F is x with the box mean-filled (:mod:`robustbench_fm.features.occlusion`). Retention near one
means the representation barely moves when the evidence leaves the image. Reported per finding:

* ``retention``: the mean ρ over the boxed positives, with a 95 % interval of ``n_boot``
  bootstrap resamples clustered by patient (``cluster_col``; candor.md "Reporting");
* ``c``: the mean cosine of random pairs of the boxed (unoccluded) images of every finding of the
  job — one c per encoder and domain, the same on every row (:func:`domain_c`) — ``n_pairs`` pairs
  of distinct images drawn with replacement (seed), or every pair when there are at most
  ``n_pairs`` of them; and the standardised ``retention_std = (retention − c) / (1 − c)``, which
  removes the encoder's baseline similarity of unrelated images (NaN when c is within 1e-6 of 1);
* ``retention_control`` (and ``_std``): the same with the control box, the box's size at its
  horizontally mirrored position, or a seeded random non-overlapping position when the mirror
  overlaps the box; positives with no possible control (no room for a same-size box left or right
  of the box, nor above or below it) have none and are left out of ``n_control`` only;
* ``control_minus_box``: the mean of ρ_control − ρ_box over the positives that have a control
  (paired; positive when erasing the expert box moves the features more than erasing the control,
  the paper's "occluding the annotated box lowers retention more than occluding the control box").

With several findings a ``"pooled"`` row pools every boxed positive of them (with the default
``findings: [pneumothorax, pneumonia]`` this is the paper's chest retention, "the mean over the
boxed pneumothorax and pneumonia positives"); its ``c`` is every row's: all their boxed images.

Two entry points:

* :func:`run_job` (the app): builds the boxed positives of each finding from the job's dataset or
  the ``sources`` given, writes a derived manifest (originals, ``<id>#<finding>#box`` and
  ``<id>#<finding>#control`` rows carrying the occlusion columns), embeds it through the
  extraction engine (cached like any other manifest: a re-run does no forward pass) and scores it
  with :func:`run`.
* :func:`run` (``evaluate("retention", features, manifest, finding=[...])``): features you bring,
  on a manifest holding the original rows and the occluded rows; an occluded row names its
  original in ``occlusion_of``, its kind (``box`` or ``control``) in ``occlusion`` and its
  finding in ``occlusion_finding`` (:func:`derived_manifest` writes such a manifest; the
  originals have ``occlusion`` empty).

Boxes: a source manifest with ``mask_<finding>`` columns (IDRiD's segmentation part: the lesion
masks) gives the bounding box of that lesion type's mask pixels; otherwise the ``box_x0..box_y1``
columns (MS-CXR, RSNA, VinDr). An adapter with a ``box_finding`` option (MS-CXR) is built once
per finding so that its box columns hold that finding's boxes.

``summary`` columns: finding, n, retention, retention_sd, retention_ci_low, retention_ci_high,
retention_std, retention_control, retention_control_std, n_control, control_minus_box, c, box_area.
``per_sample`` columns: sample_id, finding, patient_id, rho_box, rho_control, control_placement,
box_area.
"""
from __future__ import annotations

import inspect
import logging
import re
import zlib
from pathlib import Path

import numpy as np
import pandas as pd

from ... import data
from ...core.errors import InvalidSetting, UserError
from ...core.neighbors import l2_normalize
from ...core.results import Results
from ...core.stats import cluster_bootstrap_ratio, summarize_bootstrap
from ...data.images import read_mask
from ...data.manifest import BOX_COLUMNS
from ...features import occlusion as occ
from ...features.load import load_features
from ..job import JobContext
from .params import RetentionParams

PARAMS = RetentionParams

log = logging.getLogger("robustbench_fm.retention")

POOLED = "pooled"
VARIANT_COLUMN, OF_COLUMN, FINDING_COLUMN = "occlusion", "occlusion_of", "occlusion_finding"
PLACEMENT_COLUMN = "occlusion_placement"
SUMMARY_COLUMNS = ["finding", "n", "retention", "retention_sd", "retention_ci_low", "retention_ci_high",
                   "retention_std", "retention_control", "retention_control_std", "n_control", "control_minus_box", "c",
                   "box_area"]
PER_SAMPLE_COLUMNS = ["sample_id", "finding", "patient_id", "rho_box", "rho_control", "control_placement",
                      "box_area"]
_CROP_COLUMNS = ("crop_left", "crop_top", "crop_right", "crop_bottom")


def check_params(**params) -> RetentionParams:
    """One-line errors for bad parameters (called at plan time;
    :class:`~robustbench_fm.methods.candor.params.RetentionParams`)."""
    return PARAMS.parse(params)


# ------------------------------------------------------------------------------------------
# boxed positives and the derived manifest


def boxed_positives(manifest: pd.DataFrame, finding: str, root: str | Path | None = None) -> pd.DataFrame:
    """The positives of ``finding`` that carry its expert region, with ``box_x0..box_y1``.

    ``mask_<finding>`` columns (mask files relative to ``root``) give the bounding box of the mask
    pixels; otherwise the manifest's box columns. Rows without a box (or an empty mask) are left out.
    """
    mask_col = f"mask_{finding}"
    if finding not in manifest.columns or not (mask_col in manifest.columns
                                               or set(BOX_COLUMNS) <= set(manifest.columns)):
        return manifest.iloc[:0].assign(**{c: pd.Series(dtype=float) for c in BOX_COLUMNS})
    pos = manifest[pd.to_numeric(manifest[finding], errors="coerce") == 1]
    if mask_col in manifest.columns:

        pos = pos[pos[mask_col].notna()]
        boxes = [occ.mask_box(read_mask(Path(root) / rel)) for rel in pos[mask_col]]
        pos = pos.assign(**dict(zip(BOX_COLUMNS, np.array(boxes, dtype=float).reshape(-1, 4).T)))
    return pos.dropna(subset=list(BOX_COLUMNS)).reset_index(drop=True)


def derived_manifest(boxed: dict[str, pd.DataFrame], fill: str = "image_mean", seed: int = 42,
                     cluster_col: str = "patient_id") -> pd.DataFrame:
    """Originals + occluded rows for ``{finding: boxed positives}`` (module docstring).

    Columns: sample_id, path (and crop columns), patient_id (the original's ``cluster_col``, else
    its sample_id), the occlusion columns, occlusion, occlusion_of, occlusion_finding,
    occlusion_placement (``mirror``/``random`` on control rows). A control row is absent where
    no control position exists. The control's random draw is seeded per sample and finding.
    """
    occ.check_fill(fill)
    originals, derived = [], []
    for finding, rows in boxed.items():
        if rows.empty:
            continue
        keep = [c for c in ("sample_id", "path", *_CROP_COLUMNS) if c in rows.columns]
        base = rows[keep].copy()
        base["sample_id"] = base["sample_id"].astype(str)
        base["patient_id"] = (rows[cluster_col].astype(str) if cluster_col in rows.columns
                              else base["sample_id"]).to_numpy()
        originals.append(base)
        boxes = rows[list(BOX_COLUMNS)].to_numpy(float)
        box_rows = base.assign(**dict(zip(occ.OCCLUSION_BOX_COLUMNS, boxes.T)))
        box_rows[VARIANT_COLUMN], box_rows[PLACEMENT_COLUMN] = "box", "expert"
        controls = [occ.control_box(b, occ.sample_rng(seed, f"{sid}#{finding}"))
                    for sid, b in zip(base["sample_id"], boxes)]
        have = np.array([c is not None for c, _ in controls], dtype=bool)
        ctrl = np.array([c for c, _ in controls if c is not None], dtype=float).reshape(-1, 4)
        ctrl_rows = base[have].assign(**dict(zip(occ.OCCLUSION_BOX_COLUMNS, ctrl.T)))
        ctrl_rows[VARIANT_COLUMN] = "control"
        ctrl_rows[PLACEMENT_COLUMN] = [p for c, p in controls if c is not None]
        for part in (box_rows, ctrl_rows):
            part[OF_COLUMN] = part["sample_id"]
            part[FINDING_COLUMN] = finding
            part["sample_id"] = part["sample_id"] + f"#{finding}#" + part[VARIANT_COLUMN]
            part[occ.FILL_COLUMN] = fill
            derived.append(part)
    if not originals:
        return pd.DataFrame(columns=["sample_id", "path", "patient_id", *occ.OCCLUSION_COLUMNS, VARIANT_COLUMN,
                                     OF_COLUMN, FINDING_COLUMN, PLACEMENT_COLUMN])
    out = pd.concat([pd.concat(originals).drop_duplicates("sample_id"), *derived], ignore_index=True)
    return out


# ------------------------------------------------------------------------------------------
# scoring


def pair_cosine(unit: np.ndarray, n_pairs: int, rng: np.random.Generator) -> float:
    """Mean cosine of random pairs of distinct rows of ``unit`` (unit-norm rows): every pair when
    there are at most ``n_pairs``, else ``n_pairs`` pairs drawn uniformly with replacement."""
    n = len(unit)
    if n < 2:
        return float("nan")
    if n * (n - 1) // 2 <= n_pairs:
        i, j = np.triu_indices(n, k=1)
    else:
        i = rng.integers(0, n, size=n_pairs)
        j = (i + rng.integers(1, n, size=n_pairs)) % n  # uniform over the other n - 1 rows
    return float(np.einsum("ij,ij->i", unit[i], unit[j]).mean())


#: ``1 - c`` at or below this leaves the standardised retention undefined (NaN): random pairs of
#: the boxed images are then as similar as an image is to itself.
MIN_SPREAD = 1e-6


def standardise(value: float, c: float) -> float:
    """(ρ − c) / (1 − c) (candor.md, "Occlusion Retention and Discordance"); NaN when 1 − c is
    at most :data:`MIN_SPREAD`."""
    return (value - c) / (1.0 - c) if 1.0 - c > MIN_SPREAD else float("nan")


def _per_sample(unit: np.ndarray, manifest: pd.DataFrame, finding: str) -> pd.DataFrame:
    """ρ_box and ρ_control of every boxed positive of ``finding`` (rows with unreadable images out)."""
    variant = manifest[VARIANT_COLUMN].astype(object)
    row_of = pd.Series(np.arange(len(manifest)), index=manifest["sample_id"].astype(str))
    orig = manifest[variant.isna() | (variant.astype(str) == "")]
    mine = manifest[FINDING_COLUMN].astype(str) == finding
    box = manifest[mine & (variant == "box")]
    ctrl = manifest[mine & (variant == "control")].set_index(OF_COLUMN)
    of = box[OF_COLUMN].astype(str)
    missing = ~of.isin(orig["sample_id"].astype(str))
    if missing.any():
        raise ValueError(f"retention: occluded row {box['sample_id'].iloc[int(np.argmax(missing))]!r} names "
                         f"occlusion_of {of[missing].iloc[0]!r}, which is not a row of the manifest; "
                         "keep the original rows")
    i_orig, i_box = row_of[of].to_numpy(), row_of[box["sample_id"].astype(str)].to_numpy()
    rho_box = np.einsum("ij,ij->i", unit[i_orig], unit[i_box])
    has_ctrl = of.isin(ctrl.index).to_numpy()
    rho_ctrl = np.full(len(box), np.nan)
    i_ctrl = row_of[ctrl.loc[of[has_ctrl], "sample_id"].astype(str)].to_numpy()
    rho_ctrl[has_ctrl] = np.einsum("ij,ij->i", unit[i_orig[has_ctrl]], unit[i_ctrl])
    placement = np.full(len(box), None, dtype=object)
    if PLACEMENT_COLUMN in ctrl.columns:
        placement[has_ctrl] = ctrl.loc[of[has_ctrl], PLACEMENT_COLUMN].to_numpy()
    b = box[list(occ.OCCLUSION_BOX_COLUMNS)].to_numpy(float)
    patients = manifest["patient_id"].astype(str).to_numpy()[i_orig] if "patient_id" in manifest.columns \
        else of.to_numpy()
    out = pd.DataFrame({"sample_id": of.to_numpy(), "finding": finding, "patient_id": patients,
                        "rho_box": rho_box, "rho_control": rho_ctrl, "control_placement": placement,
                        "box_area": (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1]), "_row": i_orig})
    return out[np.isfinite(out["rho_box"])].reset_index(drop=True)


def domain_c(unit: np.ndarray, parts: list[pd.DataFrame], n_pairs: int, seed: int) -> float:
    """The one reference c of the job (an encoder on one domain's boxed images): the mean cosine of
    random pairs of all boxed images of every finding scored (candor.md "Occlusion Retention and
    Discordance": "c is the mean cosine similarity of random pairs of the boxed images"; our reading:
    one c per encoder and domain, so that every finding's and the pooled standardised retention
    share one reference and the chest pool is not a mix of the sources' references).
    Its pairs are drawn from a generator of their own (``seed``, "c")."""
    rows = np.unique(np.concatenate([p["_row"].to_numpy() for p in parts])) if parts else np.zeros(0, int)
    return pair_cosine(unit[rows], n_pairs, np.random.default_rng([int(seed), zlib.crc32(b"c")]))


def _summary_row(finding: str, ps: pd.DataFrame, c: float, n_boot: int, seed: int) -> dict:
    rng = np.random.default_rng([int(seed), zlib.crc32(finding.encode())])
    rho = ps["rho_box"].to_numpy(float)
    boot = cluster_bootstrap_ratio(rho, np.ones(len(rho)), ps["patient_id"], n_boot, rng) if n_boot and len(rho) \
        else np.array([])
    ci = summarize_bootstrap(boot)
    ctrl = ps["rho_control"].dropna()
    paired = (ps["rho_control"] - ps["rho_box"]).dropna()
    retention = float(rho.mean()) if len(rho) else float("nan")
    control = float(ctrl.mean()) if len(ctrl) else float("nan")
    return {"finding": finding, "n": len(rho), "retention": retention, "retention_sd": ci["sd"],
            "retention_ci_low": ci["ci_low"], "retention_ci_high": ci["ci_high"],
            "retention_std": standardise(retention, c), "retention_control": control,
            "retention_control_std": standardise(control, c), "n_control": len(ctrl),
            "control_minus_box": float(paired.mean()) if len(paired) else float("nan"), "c": c,
            "box_area": float(ps["box_area"].mean()) if len(ps) else float("nan")}


def run(features: np.ndarray, manifest: pd.DataFrame, finding, params: RetentionParams | None = None,
        **kw) -> Results:
    """Retention of ``finding`` (a name or a list) from features of the original and occluded rows;
    ``params``: :class:`~robustbench_fm.methods.candor.params.RetentionParams`.

    ``manifest`` is a derived manifest (module docstring); ``cluster_col`` names the column the
    bootstrap clusters by (``patient_id``; the original's sample_id when absent). ``fill`` and
    ``sources`` only matter to :func:`run_job` (they decide which images are embedded).
    """
    p = PARAMS.parse(params, **kw)
    n_pairs, seed, n_boot, cluster_col = p.n_pairs, p.seed, p.n_boot, p.cluster_col
    findings = [finding] if isinstance(finding, str) else [str(f) for f in finding]
    for col in (VARIANT_COLUMN, OF_COLUMN, FINDING_COLUMN, *occ.OCCLUSION_BOX_COLUMNS):
        if col not in manifest.columns:
            raise InvalidSetting(f"retention: manifest has no '{col}' column; it needs the original rows and the "
                             "occluded rows (robustbench_fm.methods.candor.retention.derived_manifest writes them)")
    manifest = manifest.reset_index(drop=True)
    if cluster_col != "patient_id" and cluster_col in manifest.columns:
        manifest = manifest.assign(patient_id=manifest[cluster_col])
    unit = l2_normalize(features, "retention: features", dtype=np.float64)
    parts = {f: _per_sample(unit, manifest, f) for f in findings}
    c = domain_c(unit, list(parts.values()), int(n_pairs), seed)
    rows = [_summary_row(f, parts[f], c, int(n_boot), seed) for f in findings]
    per_sample = pd.concat(parts.values(), ignore_index=True)
    if len(findings) > 1:
        rows.append(_summary_row(POOLED, per_sample, c, int(n_boot), seed))
    params = {"finding": findings, "n_pairs": int(n_pairs), "seed": seed, "n_boot": int(n_boot),
              "cluster_col": cluster_col, "fill": p.fill}
    return Results(summary=pd.DataFrame(rows, columns=SUMMARY_COLUMNS),
                   per_sample=per_sample[PER_SAMPLE_COLUMNS], params=params)


# ------------------------------------------------------------------------------------------
# the app's job: build, extract, score


def _sources(job: JobContext) -> list[dict]:
    """The ``sources`` parameter, or the job's own dataset."""
    return list(PARAMS.parse(job.params).sources or [{"dataset": job.dataset}])


def _override_value(value) -> str:
    """``value`` in Hydra's override syntax (strings double-quoted unless plainly safe)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_override_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_override_value(v) for v in value) + "]"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    text = str(value)
    if re.fullmatch(r"[A-Za-z_/.][A-Za-z0-9_./-]*", text) and text.lower() not in ("true", "false", "null", "nan",
                                                                                      "inf"):
        return text
    return '"' + text.replace('"', '\\"') + '"'  # Hydra: backslashes are literal except before a quote


def _check_roots(job: JobContext) -> None:
    """One line naming every source whose folder is missing, the sources to keep and the
    override for each (before anything is read or embedded)."""
    sources = _sources(job)
    gone = [(i, s) for i, s in enumerate(sources) if s.get("root") is not None and not Path(s["root"]).is_dir()]
    if not gone:
        return
    key = job.override_of("sources")
    have = [s for i, s in enumerate(sources) if i not in dict(gone)]
    named = " and ".join(f"'{s['dataset']}' (root '{s['root']}')" for _, s in gone)
    keep = _override_value(have) if have else "[{dataset: <boxed dataset>, root: <its folder>}]"
    roots = ", ".join(f"{key}.{i}.root=<folder of {s['dataset']}>" for i, s in gone)
    raise FileNotFoundError(
        f"stage retention: retention source{'s' if len(gone) > 1 else ''} {named} "
        f"{'do' if len(gone) > 1 else 'does'} not exist; set {key} to the boxed datasets you have: "
        f"'{key}={keep}', or give the folder{'s' if len(gone) > 1 else ''}: {roots}")


def _source_boxes(src: dict, job: JobContext) -> tuple[Path, dict[str, pd.DataFrame]]:
    """(root, {finding: boxed positives}) of one source. An adapter with a ``box_finding`` option
    is built once per finding (for the findings it lists); the job's own dataset reuses the
    job's manifest and dataset options unless the source gives its own."""
    name = src["dataset"]
    adapter = data.get(name)
    own = name == job.dataset and (src.get("root") is None or Path(src["root"]) == job.root)
    if src.get("root") is None and not own:
        raise UserError(f"stage retention: source '{name}' has no root; add root: <folder holding {name}>")
    root = Path(src.get("root") or job.root)
    options = dict(src.get("options") or (job.dataset_options if own else {}))
    verify = job.verify_images
    findings = job.findings
    if "box_finding" in inspect.signature(adapter.build).parameters:
        return root, {f: boxed_positives(data.build_manifest(name, root, verify, **{**options, "box_finding": f}),
                                         f, root) for f in findings if f in adapter.findings}
    table = job.manifest if own and not src.get("options") else data.build_manifest(name, root, verify, **options)
    return root, {f: boxed_positives(table, f, root) for f in findings}


def run_job(job: JobContext) -> list[pd.DataFrame]:
    """Embed originals and occluded images of every source with every encoder of the job (through
    the job's embedder: the user's encoder options apply as in any run), score them with
    :func:`run` and save ``results/<encoder>/<dataset>/retention/<finding>/``."""
    if job.embedder.extract.num_shards > 1:
        raise UserError("stage retention embeds its own occluded images; run it without extract.num_shards")
    p = PARAMS.parse(job.params)
    fill, seed, cluster_col = p.fill, p.seed, p.cluster_col
    _check_roots(job)
    derived = []
    for src in _sources(job):
        name = src["dataset"]
        root, boxes = _source_boxes(src, job)
        table = derived_manifest(boxes, fill, seed, cluster_col)
        log.info("retention: %s: %d boxed positives of %s, %d rows to embed", name,
                 int((table[VARIANT_COLUMN] == "box").sum()), ", ".join(job.findings), len(table))
        if len(table):
            derived.append((name, root, table))
    if not derived:
        raise UserError(f"stage retention: no boxed positives of {', '.join(job.findings)} in "
                        f"{', '.join(s['dataset'] for s in _sources(job))}; set stage.findings to findings "
                        f"with boxes or masks, or {job.override_of('sources')} to datasets that have them")
    combined = pd.concat([t for _, _, t in derived], ignore_index=True)
    dup = combined["sample_id"].duplicated()
    if dup.any():
        raise UserError(f"stage retention: sample_id {combined['sample_id'][dup].iloc[0]!r} occurs in two sources; "
                        "list each dataset once in stage.params.sources")
    summaries = []
    for name in job.encoders:
        encoder = job.embedder.load(name)
        parts = []
        for dataset, root, table in derived:
            feats = job.embedder.embed(table, root, encoder)
            log.info("retention %s on %s: %d images embedded, %d forward passes, cache %s", name, dataset,
                     feats.n_images_embedded, feats.n_forward, feats.path)
            parts.append(load_features(feats.path, table)[1])
        del encoder
        summaries += job.save(np.concatenate(parts), combined, name)
    return summaries
