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

Speed at the floor, in the same run:

* ``device_transform``: full-size grey JPEG films embedded by ``random_vit_s`` with the host
  transform and with the resize/normalise on the device (``extract_panel(device_transform=True)``):
  min cosine between the two (goal >= 0.9999) and the largest pixel difference of one film;
* ``extract_vs_forward``: per ViT size (S, B, L; random weights), extraction throughput from
  224-px JPEGs, host transform and device transform, over the pure forward throughput on the
  same batches (goal >= 0.9 for ViT-B and larger; ViT-S reported);
* ``panel``: ``scripts/bench_panel.py`` on the device (5 encoders on full-size JPEG films, the
  panel pass vs 5 single runs, the decode pass and the forwards measured separately);
* ``candor_floor`` / ``croma_floor``: the chest-scale CANDOR benchmark and the 20,400 x 1,024
  CRoMa benchmark on the device with their similarity floors (ratio goal <= 3 on a GPU), each with
  a cProfile of the stage (the 25 functions with the largest cumulative time) showing what
  dominates.

Every section is written to the JSON as soon as it is done (a run cut short keeps what it has).
``--smoke`` runs every section at toy sizes; ``--allow-cpu`` lets it run without CUDA (tests).

    python scripts/bench_gpu_paths.py --out benchmarks/h200/gpu_paths.json            # ~5-8 min on an H200
    python scripts/bench_gpu_paths.py --smoke --allow-cpu --out /tmp/gpu_paths.json
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from robustbench_fm import encoders, evaluate
from robustbench_fm.core.neighbors import l2_normalize, topk_similarity
from robustbench_fm.features import extract
from robustbench_fm.features.engine.panel import extract_panel, split_transform
from robustbench_fm.features.options import ExtractOptions
from robustbench_fm.methods.candor.shortlist import Shortlist

#: the engine's options of the device-transform comparison: 32 a batch, the device's default workers
AUTO32 = ExtractOptions(batch_size=32, num_workers="auto")

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling benchmark scripts
import bench_candor  # noqa: E402
import bench_croma  # noqa: E402
import bench_panel  # noqa: E402


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


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def device_transform_check(tmp: Path, device: str, n: int, size: int) -> dict:
    """Host vs device transform of full-size grey films through random_vit_s (fp32 and the
    entry's AMP), against the CPU host transform."""
    from PIL import Image

    manifest = bench_panel.write_films(tmp / "films", n, size, seed=3)
    out = {"n_images": n, "image_size": size}
    cpu = encoders.load("random_vit_s", device="cpu")
    ref = extract(cpu, manifest, tmp / "films", tmp / "c-cpu", batch_size=16, progress=False).embeddings
    mode, device_tf = split_transform(cpu.transform)
    with Image.open(tmp / "films" / manifest["path"][0]) as im:
        host = cpu.transform(im)
        grey = torch.as_tensor(np.array(im.convert("L")))[None]
    dev = device_tf(grey.to(device)).cpu()
    out["max_abs_pixel_diff_normalised"] = float((host - dev).abs().max())
    for label, amp in (("fp32", None), ("amp", "bfloat16")):
        enc = encoders.load("random_vit_s", device=device)
        enc.spec = enc.spec.replace(amp_dtype=amp)
        (host_fs,) = extract_panel([enc], manifest, tmp / "films", tmp / f"c-host-{label}", AUTO32,
                                   progress=False, entries=[bench_panel.engine_entry(enc)])
        (dev_fs,) = extract_panel([enc], manifest, tmp / "films", tmp / f"c-dev-{label}", AUTO32,
                                  progress=False, device_transform=True,
                                  entries=[bench_panel.engine_entry(enc, device_transform=True)])
        out[label] = {"min_cosine_device_vs_host_transform": float(_cos(host_fs.embeddings, dev_fs.embeddings).min()),
                      "min_cosine_device_transform_vs_cpu": float(_cos(ref, dev_fs.embeddings).min()),
                      "min_cosine_host_transform_vs_cpu": float(_cos(ref, host_fs.embeddings).min()),
                      "host_images_per_s": round(host_fs.images_per_s, 1),
                      "device_images_per_s": round(dev_fs.images_per_s, 1)}
    out["goal_min_cosine"] = 0.9999
    out["meets_goal"] = out["fp32"]["min_cosine_device_vs_host_transform"] >= 0.9999
    return out


VIT_SPECS = {"vit_s": ("random_vit_s", {}),
             "vit_b": ("random_vit_s", dict(name="random_vit_b", hub_id="vit_base_patch16_224", embed_dim=768,
                                            params_m=86.6)),
             "vit_l": ("random_vit_l", {})}


def extract_vs_forward(tmp: Path, device: str, n: int, batch_size: int, models=tuple(VIT_SPECS)) -> dict:
    """Extraction from 224-px JPEGs (host and device transform) over the pure forward, per ViT."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_extract

    manifest = bench_panel.write_films(tmp / "jpeg224", n, 224, seed=4)
    out = {"n_images": n, "image_size": 224, "batch_size": batch_size, "models": {}}
    for label in models:
        base, changes = VIT_SPECS[label]
        spec = encoders.get(base).replace(**changes) if changes else encoders.get(base)
        enc = encoders.load(spec, device=device)
        bench_extract.forward_throughput(enc, batch_size, batch_size)  # warm-up
        fwd, _ = bench_extract.forward_throughput(enc, n, batch_size)
        options = ExtractOptions(batch_size=batch_size, num_workers="auto")
        (host,) = extract_panel([enc], manifest, tmp / "jpeg224", tmp / f"cache-{label}-host", options,
                                progress=False, read=False, entries=[bench_panel.engine_entry(enc)])
        (dev,) = extract_panel([enc], manifest, tmp / "jpeg224", tmp / f"cache-{label}-dev", options,
                               progress=False, read=False, device_transform=True,
                               entries=[bench_panel.engine_entry(enc, device_transform=True)])
        fwd_after, _ = bench_extract.forward_throughput(enc, n, batch_size)
        fwd = (fwd + fwd_after) / 2
        out["models"][label] = {"encoder": spec.name, "forward_images_per_s": round(fwd, 1),
                                "extract_host_transform_images_per_s": round(host.images_per_s, 1),
                                "extract_device_transform_images_per_s": round(dev.images_per_s, 1),
                                "ratio_host_over_forward": round(host.images_per_s / fwd, 3),
                                "ratio_device_over_forward": round(dev.images_per_s / fwd, 3),
                                "goal_ratio_min": 0.9 if label != "vit_s" else None}
        del enc
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return out


def _profile(fn, top: int = 25) -> tuple[object, float, list]:
    """``fn()`` under cProfile: (result, seconds, the ``top`` functions by cumulative time)."""
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    out = prof.runcall(fn)
    seconds = time.perf_counter() - t0
    stats = pstats.Stats(prof, stream=io.StringIO()).sort_stats("cumulative")
    rows = []
    for (path, line, func), (_, ncalls, tottime, cumtime, _) in stats.stats.items():
        rows.append({"function": f"{Path(path).name}:{line}:{func}", "calls": ncalls, "tottime_s": round(tottime, 3),
                     "cumtime_s": round(cumtime, 3)})
    rows.sort(key=lambda r: -r["cumtime_s"])
    return out, seconds, rows[:top]


def candor_floor(device: str, smoke: bool) -> dict:
    """bench_candor at chest scale on ``device`` (its floor and ratio), then the stage profiled."""
    argv = ["--device", device, "--out", str(Path(tempfile.gettempdir()) / "candor_floor.json")]
    if smoke:
        argv += ["--groups", "2", "--group-size", "400", "--dim", "32", "--bank-size", "200",
                 "--max-group-sample", "200", "--n-boot", "50"]
    timed = bench_candor.main(argv)
    groups, size, dim = (2, 400, 32) if smoke else (11, 8000, 1024)
    man, feats = bench_candor.cohort(groups, size, dim)
    params = dict(finding=list(bench_candor.CHEST_FINDINGS), bank_size=200 if smoke else 4000,
                  max_group_sample=200 if smoke else 4000, n_boot=50 if smoke else 1000, device=device)
    _, seconds, top = _profile(lambda: evaluate("candor", feats, man, **params))
    return {"timed": timed, "ratio_over_similarity_floor": timed["ratio_over_similarity_floor"], "goal_ratio_max": 3.0,
            "profiled_seconds": round(seconds, 2), "profile_top": top}


def croma_floor(device: str, smoke: bool) -> dict:
    """bench_croma's normal case (ours only) on ``device`` with its floor, then the stage profiled."""
    size = dict(tiles_per_slide=30, slides_per_cell=5, dim=64) if smoke else \
        dict(tiles_per_slide=300, slides_per_cell=17, dim=1024)
    timed = bench_croma.bench_case("normal", size, device, reference=False)
    x, manifest = bench_croma.make_cohort("normal", **size)
    from robustbench_fm.methods.croma import stage as croma

    _, seconds, top = _profile(lambda: croma.run(x, manifest, device=device))
    return {"timed": timed, "ratio_over_similarity_floor": timed["ratio_over_similarity_floor"], "goal_ratio_max": 3.0,
            "profiled_seconds": round(seconds, 2), "profile_top": top}


SECTIONS = ("neighbors", "candor", "croma", "extraction", "device_transform", "extract_vs_forward", "panel",
            "candor_floor", "croma_floor")


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/h200/gpu_paths.json")
    ap.add_argument("--sections", default=",".join(SECTIONS), help="comma list of: " + ", ".join(SECTIONS))
    ap.add_argument("--smoke", action="store_true", help="toy sizes (a check that every section runs)")
    ap.add_argument("--allow-cpu", action="store_true", help="run on the CPU when there is no CUDA (tests)")
    ap.add_argument("--panel-n", type=int, default=1000, help="films of the panel section")
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda and not args.allow_cpu:
        raise SystemExit("bench_gpu_paths: no CUDA device here; run it on a GPU machine")
    device = "cuda" if cuda else "cpu"
    sections = [x.strip() for x in args.sections.split(",") if x.strip()]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        raise SystemExit(f"bench_gpu_paths: unknown sections {unknown}; choose from {', '.join(SECTIONS)}")
    result = {"device": torch.cuda.get_device_name(0) if cuda else "cpu", "torch": torch.__version__,
              "smoke": args.smoke, "seconds": {}}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        runs = {
            "neighbors": lambda: neighbors_check(rng),
            "candor": lambda: candor_check(rng),
            "croma": lambda: croma_check(np.random.default_rng(1)),  # its own stream: other inputs stay put
            "extraction": lambda: extraction_check(tmp / "extraction", rng),
            "device_transform": lambda: device_transform_check(tmp / "dt", device, 8 if args.smoke else 64,
                                                               256 if args.smoke else 2048),
            "extract_vs_forward": lambda: extract_vs_forward(tmp / "evf", device, 16 if args.smoke else 4096,
                                                             8 if args.smoke else 256,
                                                             ("vit_s",) if args.smoke else tuple(VIT_SPECS)),
            "panel": lambda: bench_panel.main(["--n", "8" if args.smoke else str(args.panel_n), "--size",
                                               "256" if args.smoke else "2048", "--batch-size",
                                               "4" if args.smoke else "128", "--device", device,
                                               "--out", str(tmp / "panel.json")]),
            "candor_floor": lambda: candor_floor(device, args.smoke),
            "croma_floor": lambda: croma_floor(device, args.smoke),
        }
        for name in sections:
            t0 = time.perf_counter()
            try:
                result[name] = runs[name]()
            except Exception as exc:  # noqa: BLE001  (one section failing must not lose the others)
                result[name] = {"error": f"{type(exc).__name__}: {' '.join(str(exc).split())}"}
            result["seconds"][name] = round(time.perf_counter() - t0, 1)
            out.write_text(json.dumps(result, indent=1, default=str) + "\n")
            print(f"{name}: {result['seconds'][name]} s", flush=True)
    print(json.dumps(result, indent=1, default=str))
    return result


if __name__ == "__main__":
    main()
