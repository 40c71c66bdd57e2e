"""Power of the paired comparisons (issue 58 item 3: "state its power against today's"): one encoder made
worse (``--degrade``: Gaussian noise of that SD added to enc0's features of each null cohort of
tests/fixtures/null_cohorts.py), the others equally good; per compared metric and row type, the share of
the worse encoder's pairs it is found worse in (``p_adj`` ≤ 0.05, right direction) with both roles of a
patient resampled (this project's comparison) and with the query role only (the ``*_bank_*`` columns
zeroed: the comparison before issue 58), the mean difference, and each design's variance ratio (the
differences' variance over the cohorts over the mean squared bootstrap SD: below 1 conservative).

    python scripts/power_compare.py --degrade 1.0 --cohorts 100 --out benchmarks/cpu2/power.json

One core: the stages run with one torch thread.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
import calibrate_compare as cal  # noqa: E402
import null_cohorts as nc  # noqa: E402

WORSE = "enc0"


def _records(pairs: pd.DataFrame, roles: str, design: str, cohort: int) -> list[dict]:
    out = []
    for _, p in pairs[(pairs["encoder_a"] == WORSE) | (pairs["encoder_b"] == WORSE)].iterrows():
        sign = 1.0 if p["encoder_a"] == WORSE else -1.0  # the worse encoder's estimate minus the other's
        other = p["encoder_b"] if p["encoder_a"] == WORSE else p["encoder_a"]
        out.append(dict(design=design, cohort=cohort, metric=p["metric"], row=str(p["row"]), other=other,
                        row_type=cal.row_type(p["row"]),
                        roles=roles, difference=sign * p["difference"],
                        sd=(p["ci_high"] - p["ci_low"]) / (2 * cal.Z95),
                        found=bool(p["p_adj"] <= cal.ALPHA and p["better"] not in ("", WORSE))))
    return out


def run(design, cohorts: int, degrade: float, n_encoders: int, n_boot: int) -> list[dict]:
    croma = isinstance(design, nc.CromaDesign)
    stage, finding = ("croma", "bio_label") if croma else ("candor", nc.FINDING)
    records = []
    for c in range(cohorts):
        manifest, feats = nc.croma_cohort(design, c, n_encoders) if croma else nc.cohort(design, c, n_encoders)
        rng = np.random.default_rng(10_000 + c)
        feats[WORSE] = feats[WORSE] + degrade * rng.standard_normal(feats[WORSE].shape)
        items, _ = cal.stage_tables(stage, manifest, feats, finding)
        zero = {col: 0.0 for col in items.columns if "_bank_" in col}
        for roles, table in (("both", items), ("queries only", items.assign(**zero))):
            pairs = cal.compare(stage, table, None, n_boot, c)
            records += _records(pairs[pairs["metric"].isin(cal.COMPARED[stage])], roles, design.name, c)
    return records


def summarise(records: pd.DataFrame) -> list[dict]:
    out = []
    for (design, metric, rtype, roles), part in records.groupby(["design", "metric", "row_type", "roles"], sort=False):
        # per (row, other encoder): the differences' variance over the cohorts / their mean squared SD
        ratios = part.groupby(["row", "other"]).apply(lambda g: g["difference"].var() / (g["sd"] ** 2).mean(),
                                                      include_groups=False)
        out.append(dict(design=design, metric=metric, row_type=rtype, roles=roles, n_pairs=len(part),
                        power=cal.rate(part["found"].sum(), len(part)),
                        mean_difference=round(float(part["difference"].mean()), 4),
                        variance_ratio=round(float(ratios.mean()), 3)))
    return out


def markdown(summary: list[dict], degrade: float) -> str:
    lines = [f"| design | metric | rows | mean difference (enc0 + noise SD {degrade} − an equal encoder) | "
             "found worse, both roles | found worse, queries only | variance ratio, both / queries only |",
             "|---|---|---|---|---|---|---|"]
    by = {(s["design"], s["metric"], s["row_type"], s["roles"]): s for s in summary}
    for (design, metric, rtype, roles), s in by.items():
        if roles != "both":
            continue
        o = by[(design, metric, rtype, "queries only")]
        lines.append(f"| {design} | {metric} | {rtype} | {s['mean_difference']:+.3f} | "
                     f"{s['power']['rate']:.3f} ± {s['power']['se']:.3f} | {o['power']['rate']:.3f} ± "
                     f"{o['power']['se']:.3f} | {s['variance_ratio']:.2f} / {o['variance_ratio']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--degrade", type=float, default=1.0)
    ap.add_argument("--cohorts", type=int, default=100)
    ap.add_argument("--designs", default="A,C,croma")
    ap.add_argument("--encoders", type=int, default=3)
    ap.add_argument("--n-boot", type=int, default=cal.N_BOOT)
    ap.add_argument("--out", default="outputs/bench/power.json")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    known = {d.name: d for d in (*nc.DESIGNS, nc.CROMA_DESIGN)}
    start = time.perf_counter()
    records = []
    for name in args.designs.split(","):
        records += run(known[name], args.cohorts, args.degrade, args.encoders, args.n_boot)
        print(f"{name}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    summary = summarise(pd.DataFrame(records))
    table = markdown(summary, args.degrade)
    result = {"degrade": args.degrade, "cohorts": args.cohorts, "encoders": args.encoders, "n_boot": args.n_boot,
              "summary": summary, "wall_seconds": round(time.perf_counter() - start, 1), "cpus": os.cpu_count(),
              "machine": platform.machine(), "python": platform.python_version(), "markdown": table}
    return cal.write_result(args.out, result)


if __name__ == "__main__":
    main()
