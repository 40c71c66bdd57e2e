"""The CRoMa paper's tables and figures from a finished sweep (croma.md §2.7, §3, Appendix A).

**Panel protocols** (croma.md §2.7 "Evaluation protocol", A.12; conventions A.5). Every job of a
sweep scores one encoder at its own biologically selected k*. The collect step then re-scores the
whole panel of each benchmark from the jobs' feature-cache entries (``SweepResults.entries()``):

* ``median-k`` (tile benchmarks, the default): k = the lower median of the encoders' k*
  (:func:`robustbench_fm.methods.croma.panel.median_k`) and every encoder is re-scored at that k, so RI,
  MaRI, τ, support and the kNN accuracies share one neighbourhood size;
* ``k-star`` (the slide-level PCaBiop panel, ``report.croma_protocol: k-star``): each encoder at
  its own k*; Table 14's confounder accuracy is the maximum over the k grid.

**Operating k** (``report.croma_k``): ``median`` (default) is the protocol above, the
lower median taken over a **roster** of encoders: ``report.croma_roster`` null (default) = every
encoder the sweep launched on the benchmark (its ``jobs.json`` and job folders), which for the
``croma_*`` experiments is the paper's panel (``configs/panel/croma_tiles.yaml``), ``paper`` =
the paper's 21 tile (4 slide) encoders, or a list of names. The collect step refuses, in one line
naming them and their job states, to take that median when a roster encoder has no result (its
job failed, was interrupted or never ran), unless ``report.croma_partial_roster: true``; the
encoders outside the roster are scored at the shared k without voting. ``published`` = the
paper's k per benchmark (Camelyon 11, TCGA-4x4 71, Tolkach-ESCA 61, TCGA-2x2 61; under
``k-star``, Table 14's k⋆ per slide encoder). Those published k were the median over croma's
26-model roster (results/PROVENANCE.json), five of whose encoders the paper does not report, so
``median`` over the paper's 21 may pick another grid value. An integer fixes k; so does a
``stage.params.k`` the jobs ran with (the panel keeps it). The summaries record ``k_policy``.

The same pass gives CRoMa at m = 1..20 and LTM_α at α ∈ {0.05, 0.10, 0.20} (Tables 7 and 8).
Everything is persisted in ``<sweep>/collect/median_k/`` as a run folder (``config.yaml``,
``results/<encoder>/<benchmark>/croma/<finding>/``, ``by_m.parquet``, ``by_alpha.parquet``,
``panel.json``), reused while the sweep's entries and CRoMa parameters are unchanged. ``<benchmark>`` is the dataset
name, with ``-<view>`` for a non-default view (``pcabiop-binary``, ``pcabiop-isup``). Jobs of the
``shortcut`` stage (view ``apd``) are re-scored on the dataset's ``ri`` view: its rows are a subset
of the APD rows, so CRoMa and APD come from the very same cached features (Table 11).

Table frames use the published CSVs' exact row labels (``Model`` / ``Benchmark`` / ``Metric``
column; ``section`` first where the paper repeats row labels across panels) and column headers.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from ...core.atomic import write_atomic, write_text_atomic
from ...core.errors import UserError
from ...core.stats import spearman
from ...core.tables import PaperTable, SweepResults
from ...paper import published
from .params import CONTROLS, K_POLICIES, PUBLISHED_K, PUBLISHED_KSTAR_SECTION, CromaParams

#: the three tile benchmarks Figure 5 averages ranks over (croma.md §3.4)
TILE_BENCHMARKS = ("pathorob_camelyon", "pathorob_tcga4x4", "pathorob_tolkach")
TABLES = ["croma_table3", "croma_table4", "croma_table5", "croma_table7", "croma_table8", "croma_table9",
          "croma_table10", "croma_table11", "croma_table12", "croma_table13", "croma_table14", "croma_figures"]

PANEL_DIR = Path("collect") / "median_k"
#: registry name -> the row label of Tables 3-5, 12, 13 (croma_table2_models.csv)
TILE_LABELS = {"virchow2": "Virchow2", "virchow": "Virchow", "uni2_h": "UNI2-h", "uni": "UNI",
               "conch_v1_5": "CONCHv1.5", "conch": "CONCH", "h_optimus_1": "H-optimus-1",
               "h_optimus_0": "H-optimus-0", "h0_mini": "H0-mini", "prov_gigapath": "Prov-GigaPath",
               "midnight_12k": "Midnight-12k", "prost40m": "Prost40M", "phikon": "Phikon", "phikon_v2": "Phikon-v2",
               "hibou_l": "Hibou-L", "hibou_b": "Hibou-B", "mstar": "mSTAR", "gpfm": "GPFM", "musk": "MUSK",
               "genbio_pathfm": "GenBio-PathFM", "dinov2_b": "DINOv2-B"}
#: registry name -> the row label of Table 14
SLIDE_LABELS = {"prism": "PRISM", "titan": "TITAN", "gigapath_slide": "Prov-GigaPath", "moozy": "MOOZY"}
BENCHMARKS = {"pathorob_camelyon": "Camelyon", "pathorob_tcga4x4": "TCGA-4x4", "pathorob_tcga2x2": "TCGA-2x2",
              "pathorob_tolkach": "Tolkach-ESCA", "pcabiop-binary": "PCaBiop", "pcabiop-isup": "PCaBiop-ISUP"}
#: published column -> panel summary column (Δ = MaRI − RI)
SCORE_COLUMNS = {"bio bacc": "bio_knn_bacc", "conf bacc": "conf_knn_bacc", "RI": "ri", "MaRI": "mari",
                 "Δ": None, "CRoMa": "croma", "F(0)": "f0", "LTM10": "ltm", "support": "support"}
#: bold = best per score column (captions: conf bacc and Δ are diagnostics)
BEST = {"bio bacc": "max", "RI": "max", "MaRI": "max", "CRoMa": "max", "F(0)": "min", "LTM10": "max",
        "support": "max"}
ALPHAS = (0.05, 0.10, 0.20)
PROTOCOLS = ("median-k", "k-star")


@dataclass
class Panel:
    """The re-scored panel of every benchmark of a sweep (module doc)."""

    summary: pd.DataFrame      # benchmark, dataset, finding, encoder, k_star, conf_knn_bacc_max + stage summary
    per_sample: pd.DataFrame   # benchmark, finding, encoder + stage per-sample columns
    by_m: pd.DataFrame         # benchmark, finding, encoder, m, croma, croma_std, f0, q_alpha, ltm
    by_alpha: pd.DataFrame     # benchmark, finding, encoder, alpha, f0, q_alpha, ltm


# ----------------------------------------------------------------------------- panel re-scoring
def _jobs(results: SweepResults) -> list[tuple[object, dict]]:
    """(resolved config, entries.json record) of every job folder that recorded its cache
    entries; a folder without its own config.yaml (a sweep's collect/<dataset>-<stage>) uses the
    sweep's. A bring-your-own-features job (``features_file``) is named by its record (its data's
    name, e.g. ``features_dataset=pathorob_camelyon``), not by the config's unused dataset."""
    out = []
    for d in results.job_dirs:
        if (d / "entries.json").exists():
            cfg = OmegaConf.load(d / "config.yaml") if (d / "config.yaml").exists() else results.config.copy()
            rec = json.loads((d / "entries.json").read_text())
            if cfg.get("features_file"):
                cfg.dataset.name = rec["dataset"]
            out.append((cfg, rec))
    return out


def _view(cfg) -> str | None:
    return (cfg.dataset.get("options") or {}).get("view")


def benchmark_key(dataset: str, view: str | None) -> str:
    """The benchmark a job's rows belong to: the dataset, ``-<view>`` for views other than ri."""
    return dataset if view in (None, "ri") else f"{dataset}-{view}"


def _groups(results: SweepResults) -> dict[str, dict]:
    """Jobs grouped by benchmark: {key: {"cfg", "stage", "entries": {encoder: entry}}}; shortcut
    jobs are re-scored on the ri view of their dataset."""
    groups: dict[str, dict] = {}
    entries = {(e, ds, st, str(p)) for e, ds, st, p in results.entries()}
    for cfg, rec in _jobs(results):
        if rec["stage"] not in ("croma", "shortcut"):
            continue
        if rec["stage"] == "shortcut" and _view(cfg) is not None:
            cfg.dataset.options.view = "ri"
        key = benchmark_key(rec["dataset"], _view(cfg))
        group = groups.setdefault(key, {"cfg": cfg, "stage": rec["stage"], "entries": {}})
        for e in rec["entries"]:
            if (e["encoder"], rec["dataset"], rec["stage"], e["entry"]) in entries:
                group["entries"].setdefault(e["encoder"], Path(e["entry"]))
    return groups


def _croma_params(cfg, stage: str) -> dict:
    """The croma stage's parameters: the job's own, or the stage's defaults for shortcut jobs."""
    if stage == "croma":
        params = OmegaConf.to_container(cfg.stage.params, resolve=True)
        findings = [str(f) for f in cfg.stage.findings]
    else:
        params, findings = _default_params(), ["bio_label"]
    params["device"] = str(cfg.get("device", "auto"))
    params.setdefault("on_incomplete", CromaParams.on_incomplete)  # a job config from before the option
    params.setdefault("m_sweep", CromaParams.m_sweep)  # likewise
    params["stage_k"] = params.pop("k", None)  # a k the user fixed for the jobs: the panel's k policy
    return {"findings": findings, **params}


def _default_params() -> dict:
    """The croma stage's defaults (:class:`CromaParams`), the label aside."""
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in CromaParams().to_dict().items()
            if k != "label_col"}


def _manifest(results: SweepResults, cfg, entries: dict[str, Path]) -> pd.DataFrame:
    """The jobs' manifest rebuilt from their config (through the collector's loader), without the
    rows any encoder skipped."""
    from ...features import skipped_ids  # lazy: imports torch

    manifest = results.manifest(cfg)
    skipped = {s for entry in entries.values() for s in skipped_ids(entry)}
    return manifest[~manifest["sample_id"].isin(skipped)].reset_index(drop=True)


def _features(entry: Path, manifest: pd.DataFrame) -> np.ndarray:
    from ...features.load import align_features, load_features  # lazy: imports torch

    ids, emb = load_features(entry)
    return align_features(ids, emb, manifest, str(entry))


def _m_sweep(manifest: pd.DataFrame, params: dict, label_col: str) -> int:
    """Largest m ≤ ``m_sweep`` (20) every unit has candidates for (at least the stage's m;
    :func:`~robustbench_fm.methods.croma.stage.sweep_end`)."""
    from . import stage as croma  # lazy: imports torch

    scopes = croma.build_scopes(manifest, label_col, params["confounder_col"], params["exclude_col"],
                                params["design"], params["subset_col"], params["on_incomplete"])
    return croma.sweep_end(scopes, params["m"], params["m_sweep"])


@dataclass
class KPolicy:
    """The collect step's operating k (``report.croma_k``, ``report.croma_roster``,
    ``report.croma_partial_roster``; module doc, "Operating k")."""

    k: str | int = "median"          # median | published | a fixed k
    roster: list[str] | str | None = None   # None: the sweep's jobs of the benchmark; "paper"; or names
    partial: bool = False

    @classmethod
    def from_config(cls, config) -> KPolicy:
        report = (config.get("report") if config is not None else None) or {}
        k = report.get("croma_k", "median")
        if isinstance(k, str) and k.strip().isdigit():
            k = int(k)
        if isinstance(k, bool) or not (k in K_POLICIES or (isinstance(k, int) and k >= 1)):
            raise UserError(f"report.croma_k={k!r} is unknown; use median (over the roster's k*), published "
                            "(the paper's k per benchmark) or a positive integer k")
        roster = report.get("croma_roster")
        if roster is not None and not isinstance(roster, str):
            roster = [str(e) for e in roster]
        if isinstance(roster, str) and roster != "paper":
            raise UserError(f"report.croma_roster={roster!r} is unknown; use null (the sweep's encoders), paper "
                            "(the paper's panel) or a list of encoder names")
        partial = report.get("croma_partial_roster", False)
        if not isinstance(partial, bool):
            raise UserError(f"report.croma_partial_roster={partial!r} must be true or false")
        return cls(k, roster, partial)

    def stamp(self) -> dict:
        return {"k": self.k, "roster": self.roster, "partial": self.partial}


def _job_status(job: Path) -> tuple[str, str]:
    """(status, error) from a job folder's status.json; ``never started`` without one."""
    f = job / "status.json"
    if not f.exists():
        return "never started", ""
    record = json.loads(f.read_text())
    return str(record.get("status", "unknown")), str(record.get("error", "") or "")


def sweep_jobs(results: SweepResults) -> list[dict]:
    """Every croma / shortcut job of the sweep, finished or not: {encoder, benchmark (None when the
    job never started and its benchmark is unknown), status, detail, entry (recorded or not)}.
    Planned jobs come from the sweep's ``jobs.json``, the others from its job folders."""
    rows, dirs = [], set()
    for d in sorted(p for p in results.root.iterdir() if p.is_dir() and p.name not in ("collect", ".submitit")):
        if not (d / "config.yaml").exists():
            continue
        dirs.add(d.name)
        cfg = OmegaConf.load(d / "config.yaml")
        stage = str(OmegaConf.select(cfg, "stage.name", default=""))
        if stage not in ("croma", "shortcut"):
            continue
        view = _view(cfg)
        dataset = str(cfg.dataset.name)
        if (d / "entries.json").exists() and cfg.get("features_file"):  # named by its record (_jobs)
            dataset = json.loads((d / "entries.json").read_text())["dataset"]
        key = benchmark_key(dataset, "ri" if stage == "shortcut" and view is not None else view)
        status, detail = _job_status(d)
        if (d / "entries.json").exists():
            names = [e["encoder"] for e in json.loads((d / "entries.json").read_text())["entries"]]
            entry = True
        else:
            name = str(OmegaConf.select(cfg, "encoder.name", default=""))
            names = [name] if f"_{name}-" in d.name or not cfg.get("encoders") else [str(e) for e in cfg.encoders]
            entry = False
        rows += [dict(encoder=n, benchmark=key, status=status, detail=detail, entry=entry) for n in names]
    planned = results.root / "jobs.json"
    if planned.is_file():
        for job in json.loads(planned.read_text()).get("jobs", []):
            if Path(job["dir"]).name in dirs:
                continue
            names = [o.split("=", 1)[1] for o in job.get("overrides", []) if o.startswith("encoder=")]
            rows += [dict(encoder=n, benchmark=None, status="never started", detail="", entry=False) for n in names]
    return rows


def _roster(key: str, policy: KPolicy, jobs: list[dict], present: list[str]) -> list[str]:
    if policy.roster == "paper":
        return list(SLIDE_LABELS if key.startswith("pcabiop") else TILE_LABELS)
    if policy.roster is not None:
        return list(policy.roster)
    names = [j["encoder"] for j in jobs if j["benchmark"] in (key, None)] + present
    return list(dict.fromkeys(names))


def _why_missing(name: str, key: str, jobs: list[dict]) -> str:
    mine = [j for j in jobs if j["encoder"] == name and j["benchmark"] in (key, None)]
    if not mine:
        return f"{name} (no job in this sweep)"
    j = mine[0]
    detail = f": {j['detail'][:80]}" if j["detail"] else ""
    return f"{name} ({j['status']}{detail})" if j["status"] != "done" else f"{name} (done, no cache entry recorded)"


def operating_ks(key: str, protocol: str, policy: KPolicy, k_star: dict[str, int], jobs: list[dict]
                 ) -> tuple[dict[str, int], str]:
    """Each encoder's operating k on benchmark ``key`` and how it was set (module doc, "Operating
    k"). ``median`` under median-k takes the lower median of the k* of the roster's encoders and
    refuses (one line naming them) when roster encoders have no result, unless
    ``policy.partial``; under k-star each encoder keeps its k*. ``published``: the paper's k
    (:data:`~robustbench_fm.methods.croma.params.PUBLISHED_K`; k-star: Table 14's k⋆ per encoder).
    An int: every encoder at that k."""
    from .panel import median_k  # lazy: imports torch

    name = f"{BENCHMARKS.get(key, key)} ({key})"
    if isinstance(policy.k, int):
        return {e: policy.k for e in k_star}, f"k = {policy.k} (fixed)"
    if policy.k == "published":
        if protocol == "k-star":
            section = PUBLISHED_KSTAR_SECTION.get(key)
            table = published.table("croma", 14, "") if section else None
            ks = {} if table is None else {
                r["row"]: int(r["value"]) for _, r in table[(table["column"] == "k⋆")
                                                            & (table["section"] == section)].iterrows()}
            lacking = [e for e in k_star if label(e, slide=True) not in ks]
            if lacking:
                raise UserError(f"croma collect: {name}: the paper publishes no k* for {', '.join(lacking)}; "
                                "use report.croma_k=median (each encoder's own k*) or a fixed k")
            return {e: ks[label(e, slide=True)] for e in k_star}, "the published k* of each encoder (Table 14)"
        if key not in PUBLISHED_K:
            raise UserError(f"croma collect: {name}: the paper publishes no operating k for this benchmark "
                            f"(published: {', '.join(f'{b}={k}' for b, k in PUBLISHED_K.items())}); use "
                            "report.croma_k=median or a fixed k")
        return {e: PUBLISHED_K[key] for e in k_star}, f"k = {PUBLISHED_K[key]} (the paper's published k)"
    if protocol == "k-star":
        return dict(k_star), "each encoder at its own k*"
    roster = _roster(key, policy, jobs, list(k_star))
    members = [e for e in roster if e in k_star]
    missing = [e for e in roster if e not in k_star]
    if missing and not policy.partial:
        why = "; ".join(_why_missing(e, key, jobs) for e in missing)
        raise UserError(f"croma collect: {name}: cannot take the panel median k: {len(missing)} of the "
                        f"{len(roster)} roster encoders have no result: {why}; "
                        "rerun them, or set report.croma_partial_roster=true to take the median over the "
                        f"{len(members)} present (or report.croma_k=published / a fixed k)")
    if not members:
        raise UserError(f"croma collect: {name}: no encoder of the roster ({', '.join(roster)}) has a result; "
                        "name the sweep's encoders in report.croma_roster")
    shared = median_k(k_star[e] for e in members)
    partial = f", partial roster: {', '.join(missing)} missing" if missing else ""
    return {e: shared for e in k_star}, f"k = {shared} (lower median of the k* of {len(members)} encoders{partial})"


def _score_benchmark(results: SweepResults, key: str, group: dict, protocol: str, out: Path,
                     policy: KPolicy | None = None, jobs: list[dict] | None = None) -> list[pd.DataFrame]:
    """Re-score one benchmark's panel (module doc); saves results under ``out`` and returns
    [summary, by_m, by_alpha] frames."""
    from . import stage as croma  # lazy: imports torch
    from .panel import sweeps  # lazy: imports torch

    cfg, entries = group["cfg"], group["entries"]
    params = _croma_params(cfg, group["stage"])
    findings = params.pop("findings")
    policy = policy or KPolicy()
    stage_k = params.pop("stage_k")
    if stage_k is not None:  # the user fixed k for the jobs (stage.params.k): the panel keeps it
        if policy.k != "median" and policy.k != stage_k:
            raise UserError(f"croma collect: stage.params.k={stage_k} and report.croma_k={policy.k} disagree; "
                            "set one of them")
        policy = KPolicy(int(stage_k), policy.roster, policy.partial)
    manifest = _manifest(results, cfg, entries)
    prep_keys = ("confounder_col", "exclude_col", "k_grid", "design", "subset_col", "on_short", "on_incomplete",
                 "device", "block_size", "m_sweep")
    summaries, by_ms, by_alphas = [], [], []
    for finding in findings:
        m_max = _m_sweep(manifest, params, finding)
        grid_pass = {}
        for encoder, entry in entries.items():  # pass 1: k*, the confounder curve and the m / α sweeps
            prep = croma.prepare(_features(entry, manifest), manifest, label_col=finding, m=m_max,
                                 **{k: params[k] for k in prep_keys})
            k_star = croma.select_k(prep)[0]
            by_m, by_alpha = sweeps({encoder: prep}, ms=range(1, m_max + 1), alphas=ALPHAS, headline_m=params["m"])
            grid_pass[encoder] = (k_star, max(croma.confounder_curve(prep).values()), by_m, by_alpha)
            by_ms.append(by_m.assign(benchmark=key, finding=finding))
            by_alphas.append(by_alpha.assign(benchmark=key, finding=finding))
        ks, how = operating_ks(key, protocol, policy, {e: v[0] for e, v in grid_pass.items()}, jobs or [])
        for encoder, entry in entries.items():  # pass 2: every encoder at the policy's k
            k_star, conf_max = grid_pass[encoder][:2]
            res = croma.run(_features(entry, manifest), manifest, finding=finding, k=ks[encoder],
                            m=params["m"], alpha=params["alpha"], tau=params["tau"],
                            **{k: params[k] for k in prep_keys})
            res.summary.insert(0, "encoder", encoder)
            res.summary.insert(1, "dataset", cfg.dataset.name)
            res.summary.insert(2, "benchmark", key)
            res.summary = res.summary.assign(k_star=k_star, conf_knn_bacc_max=conf_max, protocol=protocol,
                                             k_policy=how)
            res.params.update(protocol=protocol, k_star=k_star, k_policy=how)
            res.save(out / "results" / encoder / key / "croma" / finding)
            summaries.append(res.summary)
    return [pd.concat(summaries, ignore_index=True), pd.concat(by_ms, ignore_index=True),
            pd.concat(by_alphas, ignore_index=True)]


def croma_panel(results: SweepResults) -> Panel:
    """The sweep's re-scored panels (module doc), computed once and then read from
    ``<sweep>/collect/median_k/``."""
    out = results.root / PANEL_DIR
    groups = _groups(results)
    if not groups:
        raise UserError(f"croma tables: no croma or shortcut job with recorded cache entries (entries.json) in "
                        f"{results.root}; run the experiment's sweep first")
    protocol = str((results.config.get("report") or {}).get("croma_protocol", "median-k"))
    if protocol not in PROTOCOLS:
        raise UserError(f"report.croma_protocol={protocol!r} is unknown; use one of {', '.join(PROTOCOLS)}")
    policy = KPolicy.from_config(results.config)
    jobs = sweep_jobs(results)
    stamp = json.dumps({"protocol": protocol, "k_policy": policy.stamp(),
                        "benchmarks": {k: {e: str(p) for e, p in sorted(g["entries"].items())}
                                       for k, g in sorted(groups.items())},
                        "params": {k: _croma_params(g["cfg"], g["stage"]) for k, g in sorted(groups.items())}},
                       indent=1, default=str)
    if not ((out / "panel.json").exists() and (out / "panel.json").read_text() == stamp):
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        parts = [_score_benchmark(results, k, g, protocol, out, policy, jobs) for k, g in sorted(groups.items())]
        first = next(iter(groups.values()))["cfg"]
        write_text_atomic(out / "config.yaml", OmegaConf.to_yaml(first))
        for i, name in ((1, "by_m"), (2, "by_alpha")):
            frame = pd.concat([p[i] for p in parts], ignore_index=True)
            write_atomic(out / f"{name}.parquet", lambda f, frame=frame: frame.to_parquet(f, index=False))
        write_text_atomic(out / "panel.json", stamp)
    saved = SweepResults(out)
    return Panel(saved.summaries("croma"), saved.per_sample("croma").rename(columns={"dataset": "benchmark"}),
                 pd.read_parquet(out / "by_m.parquet"), pd.read_parquet(out / "by_alpha.parquet"))


# ----------------------------------------------------------------------------- layouts
def label(encoder: str, slide: bool = False) -> str:
    """The published row label of a registry name (the name itself when the paper has none)."""
    return (SLIDE_LABELS if slide else TILE_LABELS).get(encoder, encoder)


def _ordered(frame: pd.DataFrame) -> pd.DataFrame:
    """Pathology encoders by CRoMa (highest first), then the natural-image controls."""
    control = frame["encoder"].isin(CONTROLS)
    return pd.concat([frame[~control].sort_values("croma", ascending=False, kind="stable"),
                      frame[control]], ignore_index=True)


def _score_frame(rows: pd.DataFrame, slide: bool = False) -> pd.DataFrame:
    out = pd.DataFrame({"Model": [label(e, slide) for e in rows["encoder"]]})
    for col, source in SCORE_COLUMNS.items():
        out[col] = (rows["mari"] - rows["ri"]).to_numpy() if source is None else rows[source].to_numpy()
    return out


def _benchmark_rows(results: SweepResults, key: str) -> dict[str, pd.DataFrame]:
    summary = croma_panel(results).summary
    rows = summary[summary["benchmark"] == key]
    if rows.empty:
        raise UserError(f"croma tables: the sweep {results.root} has no {BENCHMARKS.get(key, key)} ({key}) "
                         f"results; benchmarks present: {', '.join(sorted(summary['benchmark'].unique()))}")
    return {str(f): _ordered(g) for f, g in rows.groupby("finding", sort=False)}


def _score_table(results: SweepResults, key: str, name: str, caption: str) -> list[PaperTable]:
    """Tables 3, 4, 5 and 13: one row per encoder at the panel's median k (one table per finding)."""
    tables = []
    per_finding = _benchmark_rows(results, key)
    for finding, rows in per_finding.items():
        how = rows["k_policy"].iloc[0] if "k_policy" in rows else f"k = {int(rows['k'].iloc[0])}"
        tables.append(PaperTable(name if len(per_finding) == 1 else f"{name}_{finding}", _score_frame(rows),
                                 f"{caption} Shared operating point: {how} (label: {finding}). {F0_NOTE}", BEST))
    return tables


#: croma.md Eq. 12 writes F(0) = P[CRoMa_m(i) < 0]; the reference (croma 1.0.1) and this package count ≤ 0
F0_NOTE = "F(0) = share of samples with CRoMa <= 0 (croma 1.0.1; the paper's Eq. 12 writes < 0)."


def croma_table3(results: SweepResults) -> list[PaperTable]:
    """Table 3: robustness on Camelyon (median-k)."""
    return _score_table(results, "pathorob_camelyon", "croma_table3", "Table 3: robustness on Camelyon.")


def croma_table4(results: SweepResults) -> list[PaperTable]:
    """Table 4: robustness on TCGA-4x4 (median-k)."""
    return _score_table(results, "pathorob_tcga4x4", "croma_table4", "Table 4: robustness on TCGA-4x4.")


def croma_table5(results: SweepResults) -> list[PaperTable]:
    """Table 5: robustness on Tolkach-ESCA (median-k)."""
    return _score_table(results, "pathorob_tolkach", "croma_table5", "Table 5: robustness on Tolkach-ESCA.")


def croma_table13(results: SweepResults) -> list[PaperTable]:
    """Table 13: robustness on the paired TCGA-2x2 design (median-k)."""
    return _score_table(results, "pathorob_tcga2x2", "croma_table13",
                        "Table 13: robustness on TCGA-2x2 (paired quartets).")


def croma_table14(results: SweepResults) -> list[PaperTable]:
    """Table 14: slide encoders on PCaBiop, (a) cancer detection and (b) ISUP grading (pairs),
    each encoder at its own k*; conf bacc is the maximum over the k grid (A.12)."""
    sections = {"pcabiop-binary": "(a) Cancer detection", "pcabiop-isup": "(b) ISUP grading"}
    summary = croma_panel(results).summary
    parts = []
    for key, section in sections.items():
        rows = summary[summary["benchmark"] == key]
        if rows.empty:
            continue
        rows = rows.sort_values("croma", ascending=False, kind="stable")
        frame = _score_frame(rows.assign(conf_knn_bacc=rows["conf_knn_bacc_max"]), slide=True).drop(columns="Δ")
        frame.insert(0, "section", section)
        frame.insert(2, "k⋆", rows["k"].to_numpy())
        parts.append(frame)
    if not parts:
        raise UserError(f"croma_table14: the sweep {results.root} has no PCaBiop results (dataset pcabiop, "
                         "view binary or isup); run experiment=croma_pcabiop")
    return [PaperTable("croma_table14", pd.concat(parts, ignore_index=True),
                       "Table 14: slide-level encoders on PCaBiop (a) and PCaBiop-ISUP (b), each at its own k*.",
                       {c: d for c, d in BEST.items() if c != "Δ"}, group_by="section")]


def _pathology(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[~frame["encoder"].isin(CONTROLS)]


def _benchmark_label(key: str, table: str) -> str:
    special = {("croma_table8", "pathorob_tcga4x4"): "TCGA (4×4)", ("croma_table9", "pathorob_tcga4x4"): "TCGA 4x4"}
    return special.get((table, key), BENCHMARKS.get(key, key))


def _per_benchmark(frame: pd.DataFrame, row) -> pd.DataFrame:
    """One row per benchmark: ``row(benchmark, part)`` on the benchmark's pathology rows of its first
    finding (Tables 7–9 rank the encoders of one task per benchmark)."""
    return pd.DataFrame([row(key, part[part["finding"] == part["finding"].iloc[0]])
                         for key, part in _pathology(frame).groupby("benchmark", sort=True)])


def croma_table7(results: SweepResults) -> list[PaperTable]:
    """Table 7: Spearman ρ between the LTM_α rankings of the pathology encoders (A.2)."""
    from .panel import alpha_sensitivity  # lazy: imports torch

    def row(key, part):
        r = alpha_sensitivity(part)
        return {"Benchmark": _benchmark_label(key, "croma_table7"), "ρ(0.05,0.10)": r["rho_a0.05_a0.1"],
                "ρ(0.10,0.20)": r["rho_a0.1_a0.2"], "ρ(0.05,0.20)": r["rho_a0.05_a0.2"]}
    return [PaperTable("croma_table7", _per_benchmark(croma_panel(results).by_alpha, row),
                       "Table 7: rank stability of LTM_α across α.", decimals=2)]


def croma_table8(results: SweepResults) -> list[PaperTable]:
    """Table 8: Spearman ρ between the median-CRoMa rankings at m = 1, 5, 20 (A.3); NaN where a
    benchmark's cells are too small for m = 20."""
    from .panel import m_sensitivity  # lazy: imports torch

    def row(key, part):
        pairs = tuple(p for p in ((1, 5), (5, 20), (1, 20)) if set(p) <= set(part["m"]))
        r = m_sensitivity(part, pairs=pairs)
        return {"Benchmark": _benchmark_label(key, "croma_table8"), "n": r["n"],
                **{f"ρ(m={a},m={b})": r.get(f"rho_m{a}_m{b}", np.nan) for a, b in ((1, 5), (5, 20), (1, 20))}}
    return [PaperTable("croma_table8", _per_benchmark(croma_panel(results).by_m, row),
                       "Table 8: rank stability of median CRoMa across m.")]


def croma_table9(results: SweepResults) -> list[PaperTable]:
    """Table 9: Spearman ρ between RI, MaRI and CRoMa over the pathology encoders (median-k)."""
    from .panel import metric_agreement  # lazy: imports torch

    def row(key, part):
        r = metric_agreement(part)
        return {"Benchmark": _benchmark_label(key, "croma_table9"), "RI vs MaRI": r["rho_ri_mari"],
                "CRoMa vs RI": r["rho_croma_ri"], "CRoMa vs MaRI": r["rho_croma_mari"]}
    return [PaperTable("croma_table9", _per_benchmark(croma_panel(results).summary, row),
                       "Table 9: rank agreement of RI, MaRI and CRoMa.", decimals=2)]


TCGA_SITE = "TCGA"  # Tolkach-ESCA's held-out TCGA cohort: medical_center VALSET3_TCGA


def _sample_sites(results: SweepResults, key: str, per_sample: pd.DataFrame) -> pd.Series:
    """sample_id -> site (medical_center) of benchmark ``key``: the per-sample ``site`` column when
    the results carry one, else the rows' site in the benchmark's manifest (rebuilt from its config)."""
    if "site" in per_sample.columns:
        return per_sample.drop_duplicates("sample_id").set_index("sample_id")["site"].astype(str)
    group = _groups(results)[key]
    manifest = _manifest(results, group["cfg"], group["entries"]).drop_duplicates("sample_id")
    return manifest.set_index("sample_id")["site"].astype(str)


def croma_table10(results: SweepResults) -> list[PaperTable]:
    """Table 10: median CRoMa (m=5) on Tolkach-ESCA and on its TCGA extension, and the boost.

    Reading (croma.md A.7: "we re-scored a larger Tolkach-ESCA cohort that adds the held-out TCGA
    cases"; Table 10's Tolkach-ESCA column differs from Table 5's, e.g. Midnight-12k 0.60 vs 0.58):
    ONE CRoMa run (the median-k panel of a Tolkach-ESCA benchmark whose rows include the
    VALSET3_TCGA cases, e.g. a croma job on the larger cohort), whose per-sample values are then
    split by cohort: "Tolkach-ESCA" = median per-sample CRoMa over the rows of the original cohorts
    (every site other than TCGA), "TCGA extension" = median over the TCGA rows. "Boost" =
    median(r on TCGA rows) / median(r on original rows) with r = d_OS/d_SO, the per-sample typed
    distances of the same run (rows with undefined or non-finite r left out). Pathology encoders
    by boost (highest first), then the natural-image control in its own section. The default
    Tolkach view (``tolkach_esca_reduced``, no TCGA rows) cannot give this table."""
    per_sample = croma_panel(results).per_sample
    chosen = None
    for key in sorted(k for k in per_sample["benchmark"].unique() if str(k).startswith("pathorob_tolkach")):
        part = per_sample[per_sample["benchmark"] == key]
        part = part[part["finding"] == part["finding"].iloc[0]]
        sites = part["sample_id"].map(_sample_sites(results, key, part))
        tcga = sites.str.contains(TCGA_SITE, na=False)
        if tcga.any() and (~tcga & sites.notna()).any():
            chosen = (key, part.assign(_tcga=tcga.to_numpy()))
            break
    if chosen is None:
        raise UserError(f"croma_table10: the sweep {results.root} has no Tolkach-ESCA CRoMa results with both the "
                         f"original cohorts and the held-out TCGA cases (site {TCGA_SITE}); the default view "
                         "(tolkach_esca_reduced) has no TCGA rows: score the larger cohort (tolkach_esca.csv)")
    key, part = chosen
    r = part["d_os"] / part["d_so"].where(part["d_so"] > 0)
    part = part.assign(_r=r.where(np.isfinite(r)))
    rows = []
    for encoder, g in part.groupby("encoder", sort=False):
        orig, tcga = g[~g["_tcga"]], g[g["_tcga"]]
        rows.append({"encoder": encoder, "Tolkach-ESCA": orig["croma"].median(),
                     "TCGA extension": tcga["croma"].median(),
                     "Boost": tcga["_r"].median() / orig["_r"].median()})
    frame = pd.DataFrame(rows)
    control = frame["encoder"].isin(CONTROLS)
    frame = pd.concat([frame[~control].sort_values("Boost", ascending=False, kind="stable"), frame[control]],
                      ignore_index=True)
    frame.insert(0, "section", np.where(frame["encoder"].isin(CONTROLS), "natural-image control",
                                        "pathology encoders"))
    frame.insert(1, "Model", [label(e) for e in frame.pop("encoder")])
    return [PaperTable("croma_table10", frame,
                       "Table 10: median CRoMa (m=5) on the original Tolkach-ESCA cohorts and on the held-out TCGA "
                       f"cases of one run ({key}), and the boost in median d_OS/d_SO (TCGA / original).",
                       group_by="section", decimals=2)]


def typed_rank_medians(results: SweepResults, key: str) -> pd.DataFrame:
    """encoder, median rank_so, median rank_os, median rank_typed of benchmark ``key``
    (:func:`robustbench_fm.methods.croma.panel.typed_ranks` on each job's entry; saved beside the
    panel, with every anchor's rank_typed in ``typed_first_<key>.parquet``)."""
    from .panel import typed_ranks  # lazy: imports torch

    croma_panel(results)  # (re)builds the panel folder, which the saved ranks belong to
    path = results.root / PANEL_DIR / f"typed_ranks_{key}.parquet"
    if not (path.exists() and path.with_name(f"typed_first_{key}.parquet").exists()):
        group = _groups(results).get(key)
        if group is None:
            raise UserError(f"croma_table12: the sweep {results.root} has no {BENCHMARKS.get(key, key)} "
                             f"({key}) results")
        params = _croma_params(group["cfg"], group["stage"])
        manifest = _manifest(results, group["cfg"], group["entries"])
        rows, first = [], []
        for encoder, entry in group["entries"].items():
            ranks = typed_ranks(_features(entry, manifest), manifest, params["findings"][0], params["confounder_col"],
                                params["exclude_col"], device=params["device"])
            rows.append({"encoder": encoder, "rank_so": ranks["rank_so"].median(),
                         "rank_os": ranks["rank_os"].median(), "rank_typed": ranks["rank_typed"].median()})
            first.append(pd.DataFrame({"encoder": encoder, "rank_typed": ranks["rank_typed"],
                                       "candidates": len(manifest) - 1}))
        frame, first = pd.DataFrame(rows), pd.concat(first, ignore_index=True)
        write_atomic(path.with_name(f"typed_first_{key}.parquet"), lambda f: first.to_parquet(f, index=False))
        write_atomic(path, lambda f: frame.to_parquet(f, index=False))
    return pd.read_parquet(path)


def croma_table12(results: SweepResults) -> list[PaperTable]:
    """Table 12: typed-neighbour ranks on Camelyon: pooled CRoMa and the median (over anchors) rank
    of each anchor's nearest SO match and OS distractor among all other samples, same-slide ones
    included (the reference's definition, :func:`robustbench_fm.methods.croma.panel.typed_ranks`).
    The caption gives the paper's "Pooled across the 20 encoders, the first SO or OS neighbour
    occurs at a median rank of ≈149 among 20,400 candidates", read as the median over every anchor
    of every pathology encoder of min(rank SO, rank OS)."""
    key = "pathorob_camelyon"
    rows = _benchmark_rows(results, key)
    finding, summary = next(iter(rows.items()))
    ranks = typed_rank_medians(results, key).set_index("encoder").loc[summary["encoder"]]
    frame = pd.DataFrame({"Model": [label(e) for e in summary["encoder"]], "CRoMa": summary["croma"].to_numpy(),
                          "median rank SO": ranks["rank_so"].to_numpy(), "median rank OS": ranks["rank_os"].to_numpy()})
    first = _pathology(pd.read_parquet(results.root / PANEL_DIR / f"typed_first_{key}.parquet"))
    pooled = (f" Pooled across the {first['encoder'].nunique()} pathology encoders, the first SO or OS neighbour "
              f"occurs at a median rank of {first['rank_typed'].median():g} among {int(first['candidates'].iloc[0]):,} "
              "candidates (paper: about 149 among 20,400).") if len(first) else ""
    return [PaperTable("croma_table12", frame,
                       f"Table 12: typed-neighbour ranks on Camelyon (label: {finding}).{pooled}", decimals=2)]


def _apd(results: SweepResults) -> pd.DataFrame:
    """encoder, benchmark, apd_id, apd_ood from the sweep's shortcut summaries."""
    shortcut = results.summaries("shortcut")
    if shortcut.empty:
        raise UserError(f"croma_table11: the sweep {results.root} has no shortcut results; "
                         "run experiment=croma_shortcut")
    wide = shortcut.pivot_table(index=["encoder", "dataset"], columns="test_set", values="apd").reset_index()
    wide.columns = [c if c in ("encoder", "dataset") else f"apd_{c}" for c in wide.columns]
    return wide.rename(columns={"dataset": "benchmark"})


def croma_table11(results: SweepResults) -> list[PaperTable]:
    """Table 11: Spearman ρ between CRoMa / RI / MaRI (median-k, ri rows) and APD_ID / APD_OOD over
    the pathology encoders, per benchmark and pooled over all encoder-benchmark pairs."""
    summary = croma_panel(results).summary
    merged = _pathology(_apd(results).merge(summary, on=["encoder", "benchmark"]))
    rows = []
    for test_set, section in (("id", "APD_ID"), ("ood", "APD_OOD")):
        for metric, col in (("CRoMa", "croma"), ("RI", "ri"), ("MaRI", "mari")):
            row = {"section": section, "Metric": metric}
            for key in ("pathorob_camelyon", "pathorob_tcga4x4", "pathorob_tolkach"):
                part = merged[merged["benchmark"] == key]
                ok = part.dropna(subset=[f"apd_{test_set}"]) if f"apd_{test_set}" in part else part.iloc[:0]
                row[BENCHMARKS[key]] = spearman(ok[col], ok[f"apd_{test_set}"]) if len(ok) else np.nan
            pooled = merged.dropna(subset=[f"apd_{test_set}"]) if f"apd_{test_set}" in merged else merged.iloc[:0]
            row["pooled"] = spearman(pooled[col], pooled[f"apd_{test_set}"]) if len(pooled) else np.nan
            rows.append(row)
    return [PaperTable("croma_table11", pd.DataFrame(rows),
                       "Table 11: Spearman ρ of robustness metrics with downstream shortcut susceptibility (APD).",
                       decimals=2)]


# ----------------------------------------------------------------------------- figures
def figure5_ranks(panel: Panel) -> tuple[pd.DataFrame, list[str]]:
    """Figure 5's mean ranks (:func:`robustbench_fm.methods.croma.panel.mean_ranks`): the pathology
    encoders (controls left out) ranked by median CRoMa and by LTM10 within each tile benchmark of
    the sweep (first finding), averaged over those benchmarks; and the benchmarks used. Paper
    (§3.4, Figure 5): "Each of the 3 tile benchmarks ranks the 20 pathology encoders by median
    CRoMa [...] and by worst-decile mean LTM10 [...] The axes show the mean rank across
    benchmarks". A sweep holding fewer tile benchmarks averages over those it holds."""
    from .panel import mean_ranks  # lazy: imports torch

    present = [k for k in TILE_BENCHMARKS if k in set(panel.summary["benchmark"])]
    benches = {}
    for key in present:
        rows = _pathology(panel.summary[panel.summary["benchmark"] == key])
        benches[BENCHMARKS[key]] = rows[rows["finding"] == rows["finding"].iloc[0]]
    return (mean_ranks(benches) if benches else pd.DataFrame()), [BENCHMARKS[k] for k in present]


def croma_figures(results: SweepResults) -> list[PaperTable]:
    """Figures 3/4/9 (and 6 with shortcut results) per benchmark into ``<sweep>/figures/``:
    ridgeline of per-sample CRoMa, median–tail Pareto plane of the pathology encoders (the
    natural-image control left out, as in the paper's Figures 3, 14, 15), typed-distance plane with
    75% outlines, CRoMa against APD with the probe-accuracy top row; and Figure 5 (mean median-CRoMa
    rank against mean LTM10 rank over the sweep's tile benchmarks, ``croma_figure5_mean_ranks``,
    with its ranks as CSV). Returns no table."""
    from . import plots as cp  # lazy: imports matplotlib

    panel = croma_panel(results)
    out = results.root / "figures"
    ranks, used = figure5_ranks(panel)
    if len(ranks):
        ranks = ranks.assign(Model=[label(e) for e in ranks["encoder"]])
        out.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out / "croma_figure5_mean_ranks.csv", ranks.to_csv(index=False))
        cp.plot_mean_ranks(ranks.assign(encoder=ranks["Model"]), out / "croma_figure5_mean_ranks", benchmarks=used)
    shortcut = results.summaries("shortcut")
    probes = results.per_sample("shortcut")
    for key, summary in panel.summary.groupby("benchmark", sort=True):
        finding = summary["finding"].iloc[0]
        slide = key.startswith("pcabiop")
        summary = summary[summary["finding"] == finding].assign(
            encoder=lambda f: [label(e, slide) for e in f["encoder"]])
        per_sample = panel.per_sample[(panel.per_sample["benchmark"] == key) & (panel.per_sample["finding"] == finding)]
        per_sample = per_sample.assign(encoder=[label(e, slide) for e in per_sample["encoder"]])
        cp.plot_ridgeline(per_sample.dropna(subset=["croma"]), out / f"{key}_ridgeline")
        cp.plot_pareto(summary[~summary["encoder"].isin([label(c) for c in CONTROLS])], out / f"{key}_pareto")
        typed = per_sample[(per_sample["d_so"] > 0) & (per_sample["d_os"] > 0)]
        cp.plot_typed_distances(typed, out / f"{key}_typed_distances")
        if not shortcut.empty and key in set(shortcut["dataset"]):
            apd = _apd(results)
            apd = apd[apd["benchmark"] == key].assign(encoder=lambda f: [label(e) for e in f["encoder"]])
            probe = probes[probes["dataset"] == key].assign(encoder=lambda f: [label(e) for e in f["encoder"]])
            cp.plot_croma_vs_apd(summary[["encoder", "croma"]].merge(apd, on="encoder"), out / f"{key}_croma_vs_apd",
                                 probe=probe)
    return []
