"""Forward passes and source decodes per unique (encoder, image) over the CANDOR experiment list.

The sequence of issue 31 on miniature chest datasets in their real layouts (the test fixtures
tests/fixtures/chest_pool_fixtures.py and chest_fixtures.py: MIMIC-CXR-JPG with MS-CXR boxes,
CheXpert, PadChest, VinDr-CXR, VinDr-PCXR, RSNA pneumonia), one planted encoder, one shared
``paths.root`` (so one feature cache and one prepared-image store), each experiment run through
the Python API (``robustbench_fm.run``, the command line without ``-m``) in this process:

    chest_candor -> candor_heads -> candor_failure_detection -> candor_ablation_box_verified
    -> candor_ablation_resolution -> dataset=pool of mimic_cxr -> fixed_sample=10 -> chest_candor

Counted in this process (decode workers off): every row an encoder's forward pass embeds
(``features.engine.rows.embed_full_batch``, padding excluded) and every image decode
(``data.images.read_image``: a source image, or a prepared copy read by the encoder). Unique:
the distinct (encoder, image identity) pairs the feature store holds at the end, and the
distinct (source image: file content, ``#`` locator, crop; size it is stored at, or native)
decoded. The goal is 1.00 for both.

    python scripts/bench_reuse.py --out benchmarks/cpu2/reuse.json
"""
from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))

COMMON = ["encoders=[planted_sharp]", "device=cpu", "extract.num_workers=0", "stage.params.n_boot=20"]
SEQUENCE = [
    ("chest_candor", "chest_candor", []),
    ("candor_heads (chest_pool)", "candor_heads", ["stage.findings=[pneumonia]", "stage.params.epochs=5"]),
    ("candor_failure_detection", "candor_failure_detection", ["stage.findings=[pneumonia]", "stage.params.epochs=5"]),
    ("box-verified ablation", "candor_ablation_box_verified", []),
    ("resolution ablation", "candor_ablation_resolution", []),
    ("dataset=pool of mimic_cxr", "chest_candor",
     ["dataset=pool", "~dataset.options.views", "dataset.options.members=[{dataset: mimic_cxr, "
      "root: mimic-cxr-jpg/2.1.0, options: {views: [PA, AP]}}]", "stage.findings=[pneumothorax]"]),
    ("fixed_sample=10", "chest_candor", ["fixed_sample=10"]),
    ("chest_candor again", "chest_candor", []),
]


def write_data(data: Path, seed: int = 0, per_view: int = 24) -> None:
    """The chest_pool sites (chest_pool_fixtures: MIMIC-CXR with its own split, CheXpert, PadChest,
    VinDr-CXR, VinDr-PCXR), MS-CXR boxes on 12 of the MIMIC-CXR files and RSNA pneumonia."""
    import chest_fixtures as cf
    import chest_pool_fixtures as cp
    import pandas as pd

    rng = np.random.default_rng(seed)
    cp.write_chest_pool(data, per_view=per_view, seed=seed)
    mimic = data / cp.FOLDERS["mimic_cxr"]
    files = sorted((mimic / "files").rglob("*.jpg"))[:12]
    cf.write_ms_cxr_boxes(mimic, pd.DataFrame({"dicom_id": [f.stem for f in files],
                                               "path": [str(f.relative_to(mimic)) for f in files]}))
    cf.write_rsna_pneumonia_planted(data / "rsna-pneumonia-detection-challenge", rng)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "cpu2" / "reuse.json"))
    ap.add_argument("--work", default=None, help="folder for the data, cache and runs (default: a temp folder)")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    import robustbench_fm
    from robustbench_fm.data import images as images_mod
    from robustbench_fm.data import prepared as prepared_mod
    extract_mod = importlib.import_module("robustbench_fm.features.engine.rows")  # the module, not the function
    from robustbench_fm.features.engine import panel as panel_mod

    work = Path(args.work or tempfile.mkdtemp(prefix="bench_reuse-"))
    write_data(work / "data")
    forwards: Counter = Counter()
    decodes: Counter = Counter()
    sources: set = set()
    content: dict = {}

    real_embed = extract_mod.embed_full_batch

    def counting_embed(encoder, x, batch_size):
        forwards[encoder.spec.name] += int(x.shape[0])
        return real_embed(encoder, x, batch_size)

    real_read = images_mod.read_image
    real_prepare = prepared_mod.prepare
    phase = ["native"]

    def prepare_at(manifest, image_root, store_root, size, *a, **kw):
        phase[0] = f"{size}px"
        try:
            return real_prepare(manifest, image_root, store_root, size, *a, **kw)
        finally:
            phase[0] = "native"

    def counting_read(image_root, row, need=None):
        rel, _, locator = str(row["path"]).partition("#")
        file = Path(image_root) / rel
        prepared = "prepared" in file.parts
        if not prepared:
            if file not in content:
                content[file] = hashlib.sha256(file.read_bytes()).hexdigest()
            crop = tuple(row.get(c) for c in images_mod.CROP_COLUMNS)
            sources.add((content[file], locator, repr(crop), phase[0]))
        decodes["prepared copy" if prepared else "source"] += 1
        return real_read(image_root, row, need)

    extract_mod.embed_full_batch = panel_mod.embed_full_batch = counting_embed
    extract_mod.read_image = prepared_mod.read_image = counting_read
    prepared_mod.prepare = prepare_at
    steps = []
    for label, experiment, extra in SEQUENCE:
        before_f, before_d = sum(forwards.values()), decodes["source"]
        t0 = time.perf_counter()
        out = robustbench_fm.run(experiment, [f"paths.root={work}", *COMMON, *extra],
                                 run_dir=work / "runs" / f"{len(steps)}-{experiment}")
        steps.append({"step": label, "experiment": experiment, "overrides": extra, "ok": out.ok,
                      "errors": out.errors[:3], "forward_rows": sum(forwards.values()) - before_f,
                      "source_decodes": decodes["source"] - before_d,
                      "seconds": round(time.perf_counter() - t0, 1)})
        print(json.dumps(steps[-1]), flush=True)
    cache = work / "outputs" / "cache" / "features"
    unique_pairs = 0
    for enc_dir in sorted(p for p in cache.iterdir() if p.is_dir() and not p.name.startswith("_")):
        ids = set()
        import pyarrow.parquet as pq

        for f in enc_dir.glob("images-*/*.ids.parquet"):
            ids.update(pq.read_table(f, columns=["image_id"]).column(0).to_pylist())
        unique_pairs += len(ids)
    total_forward = sum(forwards.values())
    result = {
        "machine": "cpu2", "encoder": "planted_sharp", "steps": steps,
        "forward_rows": {"total": total_forward, "unique": unique_pairs,
                         "ratio": round(total_forward / unique_pairs, 3) if unique_pairs else None},
        "source_decodes": {"total": decodes["source"], "unique": len(sources),
                           "ratio": round(decodes["source"] / len(sources), 3) if sources else None},
        "prepared_copy_decodes": decodes["prepared copy"],
        "goal": {"forward_rows": 1.0, "source_decodes": 1.0},
        "before (issue 31, main 45a9efd)": {"forward_rows": 1.81, "source_decodes": 1.84},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("forward_rows", "source_decodes")}))


if __name__ == "__main__":
    main()
