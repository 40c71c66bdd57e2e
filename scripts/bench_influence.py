"""What the banks' role costs (issue 58 item 3, docs/comparisons.md "Both roles of a patient"): a CANDOR and a
CRoMa stage's wall time with each patient's (slide's) influence as the other items' neighbour
(``methods/candor/influence.py``, ``methods/croma/influence.py``) and without it (the influence function
replaced by zeros), in one run, and their ratio (``ratio_with_influence``); the groups of CANDOR run on
threads, so the influence calls' summed time (``influence_thread_seconds``) may exceed the wall time.

* CANDOR: 20,000 queries (2 matched groups of 20,000 images, half positive, every sampled positive a
  query: ``max_group_sample`` = 20,000), d = 768, banks of 4,000, 2 images per patient, no bootstrap
  (``n_boot`` = 0: the comparison resamples).
* CRoMa: the Camelyon shape of scripts/bench_croma.py (2 labels × 2 centres × 5,100 tiles, slides of
  300, d = 1,024), k = 10, m = 5.

    python scripts/bench_influence.py --out benchmarks/cpu2/influence.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import pandas as pd

from robustbench_fm.core.devices import cpu_model


class Timed:
    """A function wrapped to add its wall time to ``seconds``."""

    def __init__(self, fn):
        self.fn, self.seconds, self.calls = fn, 0.0, 0

    def __call__(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start
            self.calls += 1


def candor_case(quick: bool) -> dict:
    from robustbench_fm.methods.candor import stage

    rng = np.random.default_rng(0)
    per_group, d = (4000, 128) if quick else (20_000, 768)
    n = 2 * per_group
    labels = (np.arange(n) % 2 == 0).astype(float)
    x = rng.normal(size=(n, d)).astype(np.float32)
    x[:, 0] += 1.5 * labels
    manifest = pd.DataFrame({"sample_id": [f"s{i:06d}" for i in range(n)],
                             "patient_id": [f"p{i // 4}" for i in range(n)],
                             "acq_group": np.where(np.arange(n) < per_group, "a", "b"), "finding": labels})
    timed = Timed(stage.bank_influence)
    try:
        stage.bank_influence = lambda *a, **kw: np.zeros((2, int(a[5].max()) + 1))
        start = time.perf_counter()
        stage.run(x, manifest, "finding", n_boot=0, max_group_sample=per_group, device="cpu")
        without = time.perf_counter() - start
        stage.bank_influence = timed
        start = time.perf_counter()
        res = stage.run(x, manifest, "finding", n_boot=0, max_group_sample=per_group, device="cpu")
        total = time.perf_counter() - start
    finally:
        stage.bank_influence = timed.fn
    queries = int(res.summary.loc[res.summary["acq_group"] == stage.POOLED, "n_queries"].iloc[0])
    return {"images": n, "dim": d, "queries": queries, "stage_seconds": round(total, 2),
            "stage_seconds_without_influence": round(without, 2), "ratio_with_influence": round(total / without, 3),
            "influence_thread_seconds": round(timed.seconds, 2), "influence_calls": timed.calls}


def croma_case(quick: bool) -> dict:
    from robustbench_fm.methods.croma import stage

    rng = np.random.default_rng(1)
    per_cell, per_slide, d = (600, 50, 64) if quick else (5100, 300, 1024)
    rows = []
    for lab in range(2):
        for site in range(2):
            for t in range(per_cell):
                rows.append((f"l{lab}", f"c{site}", f"l{lab}c{site}s{t // per_slide}"))
    manifest = pd.DataFrame(rows, columns=["bio_label", "site", "slide_id"])
    manifest.insert(0, "sample_id", [f"t{i:06d}" for i in range(len(manifest))])
    x = rng.normal(size=(len(manifest), d)).astype(np.float32)
    x[:, 0] += 0.8 * (manifest["bio_label"] == "l1")
    x[:, 1] += 0.5 * (manifest["site"] == "c1")
    timed = Timed(stage.median_influence)
    try:
        stage.median_influence = lambda *a, **kw: np.zeros((2, int(np.max(a[4])) + 1))
        start = time.perf_counter()
        stage.run(x, manifest, k=10, m=5, device="cpu")
        without = time.perf_counter() - start
        stage.median_influence = timed
        start = time.perf_counter()
        stage.run(x, manifest, k=10, m=5, device="cpu")
        total = time.perf_counter() - start
    finally:
        stage.median_influence = timed.fn
    return {"tiles": len(manifest), "dim": d, "slides": int(manifest["slide_id"].nunique()),
            "stage_seconds": round(total, 2), "stage_seconds_without_influence": round(without, 2),
            "ratio_with_influence": round(total / without, 3), "influence_seconds": round(timed.seconds, 2)}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small shapes (a smoke run)")
    ap.add_argument("--out", default="outputs/bench/influence.json")
    args = ap.parse_args(argv)
    load = os.getloadavg()[0]
    record = {"candor": candor_case(args.quick), "croma": croma_case(args.quick), "quick": args.quick,
              "cpu": cpu_model(), "load_average_at_start": round(load, 2), "cpus": os.cpu_count(),
              "machine": platform.machine(), "python": platform.python_version()}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))
    return record


if __name__ == "__main__":
    main()
