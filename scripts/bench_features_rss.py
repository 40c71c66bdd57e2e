"""Peak memory of reading one manifest's features the way a CANDOR job does (issue 31 item 7).

A view of N x D float32 features (default 160,000 x 768, 469 MiB) served by the per-image store
from one chunk of 1,024-row shards is read in a fresh process by the app's path,
``pipeline.job.run_stage_on_entries`` minus the stage: ``load_features(view)``, then
``align_features`` to the manifest, then ``l2_normalize`` of the matrix the job hands over
(``core.handover.hand_over``: the first thing CANDOR does, in place since CANDOR declares
``overwrites_features``; ``--copy`` normalises into a new matrix as for an API caller's). The peak
RSS above the process's baseline (imports done) is reported in units of the feature matrix.

    python scripts/bench_features_rss.py --out benchmarks/cpu2/features_rss.json
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import resource, sys, json
import numpy as np, pandas as pd
from robustbench_fm.core.handover import hand_over
from robustbench_fm.core.neighbors import l2_normalize
from robustbench_fm.features.load import align_features, load_features
view, n, copy = sys.argv[1], int(sys.argv[2]), sys.argv[3] == '1'
manifest = pd.DataFrame({"sample_id": [f"s{i}" for i in range(n)]})
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
ids, emb = load_features(view)
after_load = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
features = align_features(ids, emb, manifest, view)
del ids, emb
after_align = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
x = l2_normalize(features if copy else hand_over(features))
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"baseline_kib": base, "after_load_kib": after_load, "after_align_kib": after_align,
                  "peak_kib": peak, "checksum": float(x[:, 0].sum())}))
"""


def build(folder: Path, n: int, d: int, shard: int = 1024) -> Path:
    """A recipe folder with one chunk of ``n`` random rows and the view of a manifest ``s0..s{n-1}``."""
    import numpy as np
    import pandas as pd
    import pyarrow as pa

    from robustbench_fm.features import store
    from robustbench_fm.features.cache import FeatureCache

    rng = np.random.default_rng(0)
    ids = np.array([f"{i:032x}" for i in range(n)], dtype=object)
    enc = folder / "enc"
    recipe = enc / "images-bench"
    fields = {"encoder": "enc", "embed_dim": d, "images": "bench", "n_rows": n}
    from robustbench_fm.features.key import cache_key

    chunk = recipe / cache_key(fields)
    cache = FeatureCache(folder, fields, shard_size=shard, n_rows=n, folder=chunk)
    for i in range(cache.n_shards):
        lo, hi = cache.shard_bounds(i)
        cache.write_shard(i, ids[lo:hi], rng.standard_normal((hi - lo, d), dtype=np.float32))
    cache.write_meta("complete")
    store._write_parquet(recipe / f"{chunk.name}{store.IDS_SUFFIX}",
                         pa.table({"image_id": list(ids), "path": [f"{i}.png" for i in range(n)]}))
    view = enc / "v-bench"
    view.mkdir(parents=True)
    store._write_parquet(view / store.VIEW_NAME, pa.table({
        "sample_id": [f"s{i}" for i in range(n)], "image_id": list(ids),
        "chunk": [f"images-bench/{chunk.name}"] * n, "row": pa.array(np.arange(n), pa.int64())}))
    (view / "meta.json").write_text(json.dumps({"format": store.VIEW_FORMAT, "key": "v-bench", "n_rows": n,
                                                "fields": {}, "status": "complete"}))
    del pd
    return view


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=160_000)
    ap.add_argument("--d", type=int, default=768)
    ap.add_argument("--out", default=None)
    ap.add_argument("--label", default="")
    ap.add_argument("--copy", action="store_true", help="normalise into a new matrix (an API caller's features)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        view = build(Path(tmp), args.n, args.d)
        child = [sys.executable, "-c", CHILD, str(view), str(args.n), str(int(args.copy))]
        got = json.loads(subprocess.run(child, check=True, capture_output=True,
                                        text=True).stdout.strip().splitlines()[-1])
    matrix_kib = args.n * args.d * 4 / 1024
    result = {"n": args.n, "d": args.d, "matrix_mib": round(matrix_kib / 1024, 1), "label": args.label,
              **{k.replace("_kib", "_copies"): round((v - got["baseline_kib"]) / matrix_kib, 2)
                 for k, v in got.items() if k.endswith("_kib") and k != "baseline_kib"},
              "peak_mib_above_baseline": round((got["peak_kib"] - got["baseline_kib"]) / 1024, 1)}
    print(json.dumps(result))
    if args.out:
        out = Path(args.out)
        runs = json.loads(out.read_text())["runs"] if out.exists() else []
        out.write_text(json.dumps({"runs": [*runs, result]}, indent=1) + "\n")


if __name__ == "__main__":
    main()
