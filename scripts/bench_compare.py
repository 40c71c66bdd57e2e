"""Paired comparisons between encoders at a paper panel's scale (issue 58): 22 encoders scored by CANDOR
on the same 20,000 queries (2 matched groups of 10,000 positives and 10,000 negatives; 2 images per
patient), the per-item tables a CANDOR job saves (``items.parquet``, with the patients' bank-role columns),
then ``report.comparisons.compare``
with 1,000 resamples: D and D_all per group and pooled, 231 pairs each, the max-T family of each, the
ranking with rank intervals and the verdict (the margin AUROC is not compared). The items are generated
(each encoder's discordance indicators and margin scores drawn around its own rate), since what is timed
is the comparison, not CANDOR.

    python scripts/bench_compare.py --out benchmarks/cpu2/compare.json     # goal: under 120 s on 2 cores
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from robustbench_fm.core.devices import cpu_model
from robustbench_fm.core.tables import SweepResults
from robustbench_fm.report.comparisons import compare, verdict


def write_run(root: Path, n_encoders: int, n_queries: int, groups: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    per_group = n_queries // groups
    frames = []
    for g in range(groups):
        n = 2 * per_group  # positives (the queries) and as many negatives, all scored by the margin
        ids = np.array([f"g{g}_{i:06d}" for i in range(n)])
        frames.append(pd.DataFrame({"sample_id": ids, "finding": "finding", "target": "finding", "acq_group": f"g{g}",
                                    "cluster": [f"g{g}_p{i // 2}" for i in range(n)],
                                    "query": np.arange(n) < per_group, "label": (np.arange(n) < per_group) * 1.0}))
    base = pd.concat(frames, ignore_index=True)
    shared = rng.normal(size=len(base))
    OmegaConf.save({"dataset": {"name": "bench"}, "stage": {"name": "candor", "params": {}}}, root / "config.yaml")
    for e in range(n_encoders):
        quality = 0.2 + 0.3 * e / n_encoders  # D from 0.2 to 0.5
        score = base["label"] * (1.5 - quality) + 0.7 * shared + 0.7 * rng.normal(size=len(base))
        items = base.assign(margin=score,
                            discordant=np.where(base["query"], (rng.random(len(base)) < quality) * 1.0, np.nan),
                            discordant_all=np.where(base["query"], (rng.random(len(base)) < quality + 0.1) * 1.0,
                                                    np.nan),
                            # the patients' bank role on each half's queries (methods/candor/influence.py)
                            **{f"{m}_bank_{h}": 0.05 * rng.normal(size=len(base))
                               for m in ("discordant", "discordant_all") for h in (0, 1)})
        folder = root / "results" / f"enc{e:02d}" / "bench" / "candor" / "finding"
        folder.mkdir(parents=True)
        items.to_parquet(folder / "items.parquet", index=False)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--encoders", type=int, default=22)
    ap.add_argument("--queries", type=int, default=20_000)
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--out", default="outputs/bench/compare.json")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_run(root, args.encoders, args.queries, args.groups)
        load = os.getloadavg()[0]
        start, cpu = time.perf_counter(), time.process_time()
        found = compare(SweepResults(root), n_boot=args.n_boot)
        lines = verdict(found)
        seconds, cpu_s = time.perf_counter() - start, time.process_time() - cpu
    record = {"encoders": args.encoders, "queries": args.queries, "groups": args.groups, "n_boot": args.n_boot,
              "pairs": len(found.pairs), "verdict_lines": len(lines), "seconds": round(seconds, 2),
              "cpu_seconds": round(cpu_s, 2),
              "goal_seconds": 120, "cpu": cpu_model(), "load_average_at_start": round(load, 2), "cpus": os.cpu_count(),
              "machine": platform.machine(), "python": platform.python_version()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record))
    return record


if __name__ == "__main__":
    main()
