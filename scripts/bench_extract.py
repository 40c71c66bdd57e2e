"""Extraction throughput versus the model's own forward throughput.

For each encoder: N PNG files (224x224, written to a temp folder) go through
``robustbench_fm.features.engine.rows`` into a cold cache (decode + transform + batching + forward +
parquet shards + read-back), and the same number of images goes through ``encoder.embed`` as
random tensors of the same batch size (forward only). The ratio says how much the input
pipeline and the cache cost on top of the model; decode-only throughput (DataLoader + transform,
no model) is measured too, to show whether decoding could be the bottleneck.

    python scripts/bench_extract.py --models random_vit_s,random_vit_l --n 256 \
        --out outputs/bench/extract.json
    python scripts/bench_extract.py --models '' --rss 2000,20000 --rss-model planted_blur   # flat memory

``--rss`` runs the whole extraction (PNG files -> batches -> parquet shards) over each number of
images in a fresh process and reports its peak resident memory: it must not grow with the
number of images (target: 20,000 within 10% of 2,000).

``--num-workers auto`` (default) uses ``robustbench_fm.features.default_num_workers``: one
decode worker on CPU (it prepares the next batch while the model's threads run this one;
decoding is a few percent of a ViT forward on CPU, so more workers would only steal cores from
the model), every core but one (at most 8) with a GPU. ``--num-workers auto,0`` also times
inline decoding for comparison. Load from other processes on a shared machine moves the forward
throughput a lot; it is measured before and after the extraction runs and averaged.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from PIL import Image
from torch.utils.data import DataLoader


def _write_range(args) -> None:
    root, start, stop, size, seed = args
    for i in range(start, stop):
        rng = np.random.default_rng([seed, i])
        low = Image.fromarray(rng.integers(0, 256, (size // 16, size // 16, 3), dtype=np.uint8))
        arr = np.asarray(low.resize((size, size), Image.BICUBIC), dtype=np.int16)
        arr = np.clip(arr + rng.integers(-8, 9, arr.shape), 0, 255).astype(np.uint8)
        Image.fromarray(arr).save(root / "img" / f"{i:06d}.png")


def write_images(root: Path, n: int, size: int, seed: int = 0) -> pd.DataFrame:
    """Smooth random images (low-res noise upsampled, plus mild grain): photo-like PNG sizes,
    written by one process per core."""
    (root / "img").mkdir(parents=True, exist_ok=True)
    procs = max(1, min(os.cpu_count() or 1, n // 256))
    bounds = np.linspace(0, n, procs + 1).astype(int)
    jobs = [(root, int(a), int(b), size, seed) for a, b in zip(bounds[:-1], bounds[1:])]
    if procs == 1:
        _write_range(jobs[0])
    else:
        with multiprocessing.get_context("spawn").Pool(procs) as pool:
            pool.map(_write_range, jobs)
    return pd.DataFrame({"sample_id": [f"b{i:06d}" for i in range(n)],
                         "path": [f"img/{i:06d}.png" for i in range(n)]})


def _rss_child(model: str, root: str, n: int, device: str, batch_size: int, out: str) -> None:
    """Extract the first n images in a fresh process and record its peak resident memory
    (``VmHWM``: ``ru_maxrss`` would carry over the parent's peak, Linux keeps it across exec)."""

    from robustbench_fm import encoders
    from robustbench_fm.features import extract

    manifest = pd.DataFrame({"sample_id": [f"b{i:06d}" for i in range(n)],
                             "path": [f"img/{i:06d}.png" for i in range(n)]})
    encoder = encoders.load(model, device=device)
    fs = extract(encoder, manifest, root, Path(out).parent / f"cache-rss-{n}", batch_size=batch_size,
                 num_workers="auto", progress=False, read=False)
    peak_kib = _peak_rss_kib()
    Path(out).write_text(json.dumps({"n": n, "peak_rss_mib": round(peak_kib / 1024, 1),
                                     "images_per_s": round(fs.images_per_s, 1)}))


def _peak_rss_kib() -> int:
    """This process's peak resident memory in KiB: ``VmHWM`` of /proc/self/status on Linux,
    else ``ru_maxrss`` (KiB on Linux, bytes on macOS)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak // 1024 if sys.platform == "darwin" else peak


def peak_rss(model: str, counts: list[int], size: int, device: str, batch_size: int, tmp: Path) -> dict:
    """Peak RSS of extraction runs over ``counts`` images (each in its own process, cold cache)."""
    write_images(tmp / "rss", max(counts), size, seed=1)
    ctx = multiprocessing.get_context("spawn")
    runs = []
    for n in counts:
        out = tmp / f"rss-{n}.json"
        proc = ctx.Process(target=_rss_child, args=(model, str(tmp / "rss"), n, device, batch_size, str(out)))
        proc.start()
        proc.join()
        if proc.exitcode != 0:
            raise RuntimeError(f"RSS run over {n} images failed (exit {proc.exitcode})")
        runs.append(json.loads(out.read_text()))
    return {"model": model, "runs": runs,
            "ratio_largest_over_smallest": round(runs[-1]["peak_rss_mib"] / runs[0]["peak_rss_mib"], 3)}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def forward_throughput(encoder, n: int, batch_size: int) -> tuple[float, float]:
    """Images/s of ``encoder.embed`` on random tensors of the encoder's input size, n images in
    batches of ``batch_size``."""
    size, channels = encoder.spec.input_size, encoder.spec.channels
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch_size, channels, size, size, generator=gen)
    if encoder.device.type == "cuda":
        x = x.pin_memory()
    _sync(encoder.device)
    t0 = time.perf_counter()
    done = 0
    while done < n:
        b = min(batch_size, n - done)
        encoder.embed(x[:b])
        done += b
    _sync(encoder.device)
    seconds = time.perf_counter() - t0
    return n / seconds, seconds


def decode_throughput(encoder, manifest: pd.DataFrame, root: Path, batch_size: int, num_workers: int) -> float:
    """Images/s of reading + transforming + collating alone (no model)."""
    from robustbench_fm.features.engine.rows import (
        _one_thread,
        _RowsDataset,
        default_reader,
    )

    ds = _RowsDataset(manifest.to_dict("records"), root, encoder.transform, default_reader)
    loader = DataLoader(ds, batch_size=batch_size, num_workers=num_workers, collate_fn=ds.collate,
                        prefetch_factor=4 if num_workers else None)
    t0 = time.perf_counter()
    with _one_thread(num_workers == 0):  # as extract() does
        for _ in loader:
            pass
    return len(ds) / (time.perf_counter() - t0)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="random_vit_s", help="comma-separated encoder names")
    ap.add_argument("--n", type=int, default=256, help="number of images")
    ap.add_argument("--size", type=int, default=224, help="side of the PNG files on disk (the encoder resizes)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--num-workers", default="auto",
                    help="DataLoader workers or 'auto'; a comma list (e.g. auto,1) also times the others")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--rss", default="", help="comma list of image counts (e.g. 2000,20000): peak RSS of "
                    "extraction runs over that many images, each in a fresh process")
    ap.add_argument("--rss-model", default="random_vit_s", help="encoder of the --rss runs")
    ap.add_argument("--out", default="outputs/bench/extract.json")
    args = ap.parse_args(argv)

    from robustbench_fm import encoders
    from robustbench_fm.features import default_num_workers, extract

    if args.threads:
        torch.set_num_threads(args.threads)
    device = encoders.resolve_device(args.device)
    workers = [default_num_workers(device) if w.strip() == "auto" else int(w)
               for w in str(args.num_workers).split(",")]
    result = {
        "n_images": args.n, "image_size": args.size, "batch_size": args.batch_size, "num_workers": workers[0],
        "num_workers_arg": args.num_workers, "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(), "device": str(device),
        "device_name": (torch.cuda.get_device_name(device) if device.type == "cuda"
                        else platform.processor() or platform.machine()),
        "torch": torch.__version__, "python": sys.version.split()[0], "models": {},
    }
    with tempfile.TemporaryDirectory(prefix="bench_extract_") as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        manifest = write_images(tmp / "data", args.n, args.size)
        result["image_write_seconds"] = round(time.perf_counter() - t0, 2)
        for name in [m.strip() for m in args.models.split(",") if m.strip()]:
            encoder = encoders.load(name, device=device)
            forward_throughput(encoder, args.batch_size, args.batch_size)  # warm-up
            _sync(device)
            # forward before and after the extraction runs, so load drift on a shared machine shows
            fwd_before, fwd_s = forward_throughput(encoder, args.n, args.batch_size)
            runs = {}
            for nw in workers:
                fs = extract(encoder, manifest, tmp / "data", tmp / f"cache-{name}-w{nw}",
                             batch_size=args.batch_size, num_workers=nw, shard_size=1024, progress=False)
                assert fs.n_images_embedded == args.n and fs.embeddings.shape[0] == args.n
                runs[nw] = {"extract_images_per_s": round(fs.images_per_s, 2),
                            "extract_seconds": round(fs.seconds, 3), "n_forward_batches": fs.n_forward,
                            "decode_only_images_per_s": round(decode_throughput(
                                encoder, manifest, tmp / "data", args.batch_size, nw), 2)}
            fwd_after, _ = forward_throughput(encoder, args.n, args.batch_size)
            fwd = (fwd_before + fwd_after) / 2
            main_run = runs[workers[0]]
            entry = {"embed_dim": encoder.spec.embed_dim, "num_workers": workers[0],
                     "forward_images_per_s": round(fwd, 2),
                     "forward_images_per_s_before_after": [round(fwd_before, 2), round(fwd_after, 2)],
                     **main_run,
                     "ratio_extract_over_forward": round(main_run["extract_images_per_s"] / fwd, 3)}
            if len(workers) > 1:
                entry["by_num_workers"] = {str(nw): {**r, "ratio_extract_over_forward":
                                                     round(r["extract_images_per_s"] / fwd, 3)}
                                           for nw, r in runs.items()}
            result["models"][name] = entry
            for nw, r in runs.items():
                print(f"{name} num_workers={nw}: extract {r['extract_images_per_s']:.2f} img/s, forward "
                      f"{fwd:.2f} img/s ({fwd_before:.2f} before, {fwd_after:.2f} after), ratio "
                      f"{r['extract_images_per_s'] / fwd:.3f}, decode-only {r['decode_only_images_per_s']:.1f} img/s",
                      flush=True)
            del encoder
        if args.rss:
            counts = sorted(int(c) for c in args.rss.split(","))
            result["peak_rss"] = peak_rss(args.rss_model, counts, args.size, str(device), args.batch_size, tmp)
            print(f"peak RSS {args.rss_model}: " + ", ".join(f"{r['n']} images {r['peak_rss_mib']} MiB"
                                                             for r in result["peak_rss"]["runs"]), flush=True)
        out = Path(args.out)  # written before the temp folder (thousands of files) is deleted
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
