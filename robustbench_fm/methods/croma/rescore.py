"""The collect step's CRoMa panel: every benchmark of a finished sweep re-scored from the jobs'
stored features (croma.md §2.7, A.12), which the paper's tables and figures read
(:mod:`~robustbench_fm.methods.croma.tables`).

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
from ...core.tables import SweepResults
from ...paper import published
from .labels import BENCHMARKS, SLIDE_LABELS, TILE_LABELS, label
from .params import K_POLICIES, PUBLISHED_K, PUBLISHED_KSTAR_SECTION, CromaParams

PANEL_DIR = Path("collect") / "median_k"
ALPHAS = (0.05, 0.10, 0.20)
PROTOCOLS = ("median-k", "k-star")


@dataclass
class Panel:
    """The re-scored panel of every benchmark of a sweep (module doc)."""

    summary: pd.DataFrame      # benchmark, dataset, finding, encoder, k_star, conf_knn_bacc_max + stage summary
    per_sample: pd.DataFrame   # benchmark, finding, encoder + stage per-sample columns
    by_m: pd.DataFrame         # benchmark, finding, encoder, m, croma, croma_std, f0, q_alpha, ltm
    by_alpha: pd.DataFrame     # benchmark, finding, encoder, alpha, f0, q_alpha, ltm


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


def benchmark_groups(results: SweepResults) -> dict[str, dict]:
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


def panel_manifest(results: SweepResults, cfg, entries: dict[str, Path]) -> pd.DataFrame:
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
    manifest = panel_manifest(results, cfg, entries)
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
    groups = benchmark_groups(results)
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


def typed_rank_medians(results: SweepResults, key: str) -> pd.DataFrame:
    """encoder, median rank_so, median rank_os, median rank_typed of benchmark ``key``
    (:func:`robustbench_fm.methods.croma.panel.typed_ranks` on each job's entry; saved beside the
    panel, with every anchor's rank_typed in ``typed_first_<key>.parquet``)."""
    from .panel import typed_ranks  # lazy: imports torch

    croma_panel(results)  # (re)builds the panel folder, which the saved ranks belong to
    path = results.root / PANEL_DIR / f"typed_ranks_{key}.parquet"
    if not (path.exists() and path.with_name(f"typed_first_{key}.parquet").exists()):
        group = benchmark_groups(results).get(key)
        if group is None:
            raise UserError(f"croma_table12: the sweep {results.root} has no {BENCHMARKS.get(key, key)} "
                             f"({key}) results")
        params = _croma_params(group["cfg"], group["stage"])
        manifest = panel_manifest(results, group["cfg"], group["entries"])
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
