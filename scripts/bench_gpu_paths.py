"""GPU code paths give the CPU's numbers: neighbour search, CANDOR and extraction, side by side.

Run on a machine with CUDA; writes JSON (default ``outputs/bench/gpu_paths.json``):

* ``neighbors``: blocked top-k and the shared shortlist on CUDA vs CPU (max |Δ similarity|,
  share of identical neighbour indices);
* ``croma``: the CRoMa stage (its scope pass runs on the same neighbour engine) with
  ``device="cuda"`` vs ``"cpu"`` on a 2×2 cohort of slides, float32 and float64 (max |Δ| over the
  summary's statistics, whether k* agrees), and wall times;
* ``candor``: ``evaluate("candor", ...)`` with ``device="cuda"`` vs ``"cpu"`` on a 3-group,
  3-finding cohort (max |Δ DM|, discordance flips, identical summary columns), and wall times;
* ``extraction``: ``random_vit_s`` features of the same PNG files on CUDA with the entry's AMP
  (bf16) and in fp32 vs CPU fp32 (min cosine, max |Δ|).

    python scripts/bench_gpu_paths.py --out outputs/bench/gpu_paths.json
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from robustbench_fm import encoders, evaluate
from robustbench_fm.core.neighbors import Shortlist, l2_normalize, topk_similarity
from robustbench_fm.features import extract


def _timed(fn):
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def neighbors_check(rng) -> dict:
    x = l2_normalize(rng.standard_normal((20000, 768), dtype=np.float32))
    q, c = rng.choice(20000, 3000, replace=False), np.sort(rng.choice(20000, 12000, replace=False))
    (v_cpu, i_cpu), t_cpu = _timed(lambda: topk_similarity(torch.as_tensor(x), q, c, 5))
    (v_gpu, i_gpu), t_gpu = _timed(lambda: topk_similarity(torch.as_tensor(x, device="cuda"), q, c, 5))
    rows = np.sort(rng.choice(20000, 8000, replace=False))
    sl_cpu = Shortlist(torch.as_tensor(x), rows).mean_topk(rows[:4000], rows[::2], 5)
    sl_gpu = Shortlist(torch.as_tensor(x, device="cuda"), rows).mean_topk(rows[:4000], rows[::2], 5)
    return {"topk_max_abs_diff": float((v_cpu - v_gpu.cpu()).abs().max()),
            "topk_same_indices": float((i_cpu == i_gpu.cpu()).float().mean()),
            "topk_seconds_cpu": round(t_cpu, 3), "topk_seconds_cuda": round(t_gpu, 3),
            "shortlist_max_abs_diff": float(np.abs(sl_cpu - sl_gpu).max())}


def croma_check(rng, devices=("cpu", "cuda")) -> dict:
    from robustbench_fm.methods.croma import stage as croma

    n_slides, tiles = 40, 150
    slide = np.repeat(np.arange(n_slides), tiles)
    label, centre = slide % 2, (slide // 2) % 2
    man = pd.DataFrame({"sample_id": [f"t{i}" for i in range(len(slide))], "bio_label": label.astype(str),
                        "site": centre.astype(str), "slide_id": slide.astype(str)})
    base = rng.standard_normal((len(slide), 384)) + 0.3 * rng.standard_normal((2, 384))[label] \
        + 0.3 * rng.standard_normal((2, 384))[centre]
    out = {}
    for dtype in (np.float32, np.float64):
        runs = {}
        for device in devices:
            runs[device] = _timed(lambda: croma.run(base.astype(dtype), man, device=device).summary.iloc[0])
        (a, t_a), (b, t_b) = runs[devices[0]], runs[devices[1]]
        stats = ("ri", "mari", "tau", "croma", "f0", "q_alpha", "ltm", "bio_knn_bacc", "conf_knn_bacc")
        out[np.dtype(dtype).name] = {"max_abs_diff": float(max(abs(a[c] - b[c]) for c in stats)),
                                     "same_k": bool(a["k"] == b["k"]), f"seconds_{devices[0]}": round(t_a, 2),
                                     f"seconds_{devices[1]}": round(t_b, 2)}
    return out


def candor_check(rng) -> dict:
    n, findings = 15000, ["f0", "f1", "f2"]
    man = pd.DataFrame({"sample_id": [f"s{i}" for i in range(n)], "patient_id": [f"p{i // 2}" for i in range(n)],
                        "acq_group": rng.choice(["a|PA", "a|AP", "b|PA"], n)})
    feats = rng.standard_normal((n, 512), dtype=np.float32)
    for j, f in enumerate(findings):
        man[f] = (rng.random(n) < 0.2 + 0.1 * j).astype(float)
        feats[:, j] += 0.5 * man[f].to_numpy()
    params = dict(finding=findings, bank_size=2000, max_group_sample=4000, n_boot=200)
    cpu, t_cpu = _timed(lambda: evaluate("candor", feats, man, device="cpu", **params))
    gpu, t_gpu = _timed(lambda: evaluate("candor", feats, man, device="cuda", **params))
    same_cols = [c for c in ("d", "d_all", "d_sd", "d_ci_low", "d_ci_high", "n_queries")
                 if cpu.summary[c].equals(gpu.summary[c])]
    return {"dm_max_abs_diff": float(np.abs(cpu.per_sample["dm"] - gpu.per_sample["dm"]).max()),
            "discordance_flips": int((cpu.per_sample["discordant"] != gpu.per_sample["discordant"]).sum()),
            "n_queries": int(len(cpu.per_sample)), "identical_summary_columns": same_cols,
            "margin_auroc_max_abs_diff": float(np.abs(cpu.summary["margin_auroc"] - gpu.summary["margin_auroc"]).max()),
            "seconds_cpu": round(t_cpu, 2), "seconds_cuda": round(t_gpu, 2)}


def extraction_check(tmp: Path, rng) -> dict:
    from PIL import Image

    (tmp / "img").mkdir(parents=True)
    for i in range(64):
        Image.fromarray(rng.integers(0, 256, (224, 224, 3), dtype=np.uint8)).save(tmp / "img" / f"{i}.png")
    man = pd.DataFrame({"sample_id": [str(i) for i in range(64)], "path": [f"img/{i}.png" for i in range(64)]})
    out = {}
    feats = {}
    for label, device, amp in (("cpu", "cpu", None), ("cuda_amp", "cuda", "bfloat16"), ("cuda_fp32", "cuda", None)):
        enc = encoders.load("random_vit_s", device=device)
        enc.spec = enc.spec.replace(amp_dtype=amp)
        feats[label] = extract(enc, man, tmp, tmp / f"cache-{label}", batch_size=32, progress=False).embeddings
    for label in ("cuda_amp", "cuda_fp32"):
        a, b = feats["cpu"], feats[label]
        cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
        out[label] = {"min_cosine_to_cpu": float(cos.min()), "max_abs_diff": float(np.abs(a - b).max())}
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="outputs/bench/gpu_paths.json")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench_gpu_paths: no CUDA device here; run it on a GPU machine")
    rng = np.random.default_rng(0)
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "neighbors": neighbors_check(rng), "candor": candor_check(rng)}
    result["croma"] = croma_check(np.random.default_rng(1))  # its own stream: the other checks' inputs stay put
    with tempfile.TemporaryDirectory() as tmp:
        result["extraction"] = extraction_check(Path(tmp), rng)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
