"""Panel extraction (one decode per image) vs one extraction per encoder.

N grey JPEG films (default 2,000 at 2,048 x 2,048 px, like chest films; smooth noise plus grain)
are embedded by a panel of 5 encoders, all in this process (and its decode workers):

* ``decode``: one pass reading every image (the reader only, the extraction's DataLoader and
  as many workers as the panel uses, so the floor has the panel's cores): the cost the panel
  pays once and single runs pay per encoder;
* ``decode_transform[e]``: the same pass through encoder e's transform (so its transform's
  cost is ``decode_transform[e] - decode``);
* ``forward[e]``: encoder e's forward pass alone on random tensors of its input, same batches;
* ``single[e]``: ``extract`` of encoder e into a cold cache (the same workers);
* ``panel``: ``extract_panel`` of the 5 into a cold cache; every entry is checked byte for byte
  against the single run's (shards, meta.json, skipped.csv); ``--also-workers 1`` adds panel
  runs with other worker counts (``panel_by_workers``);
* ``profile``: where the panel's time goes, in ms per image: the worker's share measured in this
  process on the first ``--profile-n`` films (decode, each distinct geometry, packing the chunk
  for the main process), the main process's from the panel run (waiting for the workers' next
  chunk, collate + tail, forwards, shard writes).

Workers: ``--num-workers auto`` is the panel's default (:func:`default_panel_workers`: every core
on CPU), used for every pass above. ``--films DIR`` keeps the films between runs (written once).
The load average before and after is recorded: the machine may be shared.

Goals written beside the ratios: ``panel <= 1.3 x (decode + sum forward)`` (the issue's floor)
and, since each encoder's resize of a full-size film is work no panel can share, the ratio to
``decode + sum transform + sum forward`` too; ``sum single / panel`` is the speed-up.

The default panel is cheap on a CPU: ``planted_blur`` and ``planted_sharp`` (registry) and
three small conv nets defined here that differ in what the transform does (``conv_rgb_224``:
grey -> RGB, shorter side 224 + centre crop, bicubic; ``conv_grey_384``: 384 px bilinear;
``conv_rgb_256_squash``: squash to 256). Any registry names can be given with ``--models``.

    python scripts/bench_panel.py --n 2000 --size 2048 --out benchmarks/cpu2/panel.json

``--compare-decode`` (issue 44) measures instead, in one run, full-size and scaled JPEG decoding
(``decode="exact"`` / ``"scaled"``, :func:`robustbench_fm.data.images.draft_scale`) side by side:
images/s of the panel (``extract_panel``, cold caches) and of the prepared-image store at 224 px
(``prepare``), the runs alternating exact, scaled, exact, scaled (``--rounds``) so the machine's
load hits both alike, and the worker's per-image profile under each (file read + decode, the
geometries, packing; the main process's wait, collate + tail, forwards, writes):

    python scripts/bench_panel.py --compare-decode --n 200 --size 2048 --out benchmarks/cpu2/panel_decode.json
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
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

DEFAULT_MODELS = "planted_blur,planted_sharp,conv_rgb_224,conv_grey_384,conv_rgb_256_squash"
#: conv nets defined here: name -> (channels, input size, resize, interpolation)
CONVS = {"conv_rgb_224": (3, 224, "shorter_center_crop", "bicubic"),
         "conv_grey_384": (1, 384, "shorter_center_crop", "bilinear"),
         "conv_rgb_256_squash": (3, 256, "squash", "bilinear")}


def _write_range(args) -> None:
    root, start, stop, size, seed = args
    for i in range(start, stop):
        rng = np.random.default_rng([seed, i])
        low = Image.fromarray(rng.integers(0, 256, (size // 32, size // 32), dtype=np.uint8))
        arr = np.asarray(low.resize((size, size), Image.BICUBIC), dtype=np.int16)
        arr = np.clip(arr + rng.integers(-6, 7, arr.shape), 0, 255).astype(np.uint8)
        Image.fromarray(arr, mode="L").save(root / "img" / f"{i:06d}.jpg", quality=90)


def write_films(root: Path, n: int, size: int, seed: int = 0) -> pd.DataFrame:
    """``n`` grey JPEGs of ``size`` x ``size`` px, one writing process per core."""
    (root / "img").mkdir(parents=True, exist_ok=True)
    procs = max(1, min(os.cpu_count() or 1, n // 16))
    bounds = np.linspace(0, n, procs + 1).astype(int)
    jobs = [(root, int(a), int(b), size, seed) for a, b in zip(bounds[:-1], bounds[1:])]
    if procs == 1:
        _write_range(jobs[0])
    else:
        with multiprocessing.get_context("spawn").Pool(procs) as pool:
            pool.map(_write_range, jobs)
    return pd.DataFrame({"sample_id": [f"f{i:06d}" for i in range(n)], "path": [f"img/{i:06d}.jpg" for i in range(n)]})


def conv_encoder(name: str, device):
    """A seeded small conv net with its own transform (a registry-like spec, random weights)."""
    from robustbench_fm.encoders.base import Encoder
    from robustbench_fm.encoders.spec import EncoderSpec

    channels, size, resize, interp = CONVS[name]
    spec = EncoderSpec(name=name, library="timm", hub_id=f"bench/{name}", input_size=size, mean=(0.5,) * channels,
                       std=(0.25,) * channels, embedding="pooled", embed_dim=64, params_m=0.01, pretrained=False,
                       seed=0, channels=channels, resize=resize, interpolation=interp)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Conv2d(channels, 16, 7, stride=4), torch.nn.ReLU(),
                                    torch.nn.Conv2d(16, 32, 3, stride=2), torch.nn.ReLU(),
                                    torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 64))
    return Encoder(spec=spec, model=model, forward=model, weights_id=f"bench-{name}-seed0", device=torch.device(device))


def load_encoder(name: str, device):
    from robustbench_fm import encoders

    return conv_encoder(name, device) if name in CONVS else encoders.load(name, device=device)


def engine_entry(encoder, decode: str | None = None, device_transform: bool = False) -> tuple[None, dict]:
    """``(None, key fields)`` of the entry a benchmark hands the extraction engine (which fills only
    entries it is handed; the package files features through its store): the encoder's recipe
    (decode mode included), ``"transform": "device"`` where ``device_transform`` moves its transform
    to the device (such an entry is keyed apart), tagged as a benchmark's."""
    from robustbench_fm.data.images import DEFAULT_DECODE
    from robustbench_fm.features.engine.panel import split_transform
    from robustbench_fm.features.recipe import recipe_fields

    fields = {**recipe_fields(encoder, decode=decode or DEFAULT_DECODE), "entry": "benchmark"}
    if device_transform and split_transform(encoder.transform) is not None:
        fields["transform"] = "device"
    return None, fields


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def forward_seconds(encoder, n: int, batch_size: int) -> float:
    """Seconds of ``encoder.embed`` over n random images in batches of ``batch_size``."""
    spec = encoder.spec
    x = torch.randn(batch_size, spec.channels, spec.input_size, spec.input_size,
                    generator=torch.Generator().manual_seed(0))
    encoder.embed(x[:2])  # warm-up
    _sync(encoder.device)
    t0 = time.perf_counter()
    done = 0
    while done < n:
        b = min(batch_size, n - done)
        encoder.embed(x[:b])
        done += b
    _sync(encoder.device)
    return time.perf_counter() - t0


def pass_seconds(manifest: pd.DataFrame, root: Path, transform, batch_size: int, num_workers: int,
                 nice: bool = False) -> float:
    """Seconds of one DataLoader pass reading every image (and applying ``transform`` if given),
    as the panel's workers do (``nice``: at the lower priority a panel's CPU workers run at), with
    no model."""
    from robustbench_fm.features.engine.panel import WORKER_NICE, _init_worker
    from robustbench_fm.features.engine.rows import _one_thread, _RowsDataset, default_reader

    tf = transform if transform is not None else (lambda im: torch.zeros(1))
    ds = _RowsDataset(manifest.to_dict("records"), root, tf, default_reader)
    loader = DataLoader(ds, batch_size=batch_size, num_workers=num_workers, collate_fn=ds.collate,
                        prefetch_factor=2 if num_workers else None,
                        worker_init_fn=(functools.partial(_init_worker, nice=WORKER_NICE)
                                        if nice and num_workers else None))
    t0 = time.perf_counter()
    with _one_thread(num_workers == 0):
        for _, _, errors in loader:
            assert not errors, errors[0]
    return time.perf_counter() - t0


def profile_worker(manifest: pd.DataFrame, root: Path, panel, n: int, batch_size: int, decode: str = "exact") -> dict:
    """Milliseconds per image of the panel worker's work, in this process with one thread: the
    decode alone, then the worker's whole fetch of each chunk (decode + every distinct geometry
    of the panel, grey films packed as in the pass: :meth:`_PanelDataset.__getitems__`), and
    packing a chunk for the main process (:func:`_pack`); ``geometries`` is their difference.
    ``decode="scaled"``: each image read once per distinct DCT scale its encoders need, as the
    panel's pass does (:meth:`robustbench_fm.features.engine.panel._PanelDataset._split`)."""
    from robustbench_fm.features.engine.panel import _HostPlan, _needs, _pack, _PanelDataset, _standard_steps
    from robustbench_fm.features.engine.rows import _one_thread, default_reader

    plans = [None if (st := _standard_steps(e.transform)) is None else _HostPlan(*st) for e in panel]
    needs = _needs([type("J", (), {"encoder": e})() for e in panel]) if decode == "scaled" else None
    records = manifest.iloc[:n].to_dict("records")
    ds = _PanelDataset(records, root, [e.transform for e in panel], plans, [None] * len(panel), default_reader, needs)
    jobs = tuple(range(len(panel)))
    t = {"decode": 0.0, "decode + geometries": 0.0, "pack": 0.0}
    with _one_thread(True):
        for a in range(0, len(records), batch_size):
            rows = range(a, min(a + batch_size, len(records)))
            t0 = time.perf_counter()
            for i in rows:
                for _, need in ds._split(i, jobs):
                    ds._decode(i, need)
            t1 = time.perf_counter()
            items = ds.__getitems__([(i, jobs) for i in rows])
            t2 = time.perf_counter()
            _pack(items)
            t3 = time.perf_counter()
            t["decode"] += t1 - t0
            t["decode + geometries"] += t2 - t1
            t["pack"] += t3 - t2
    t["geometries"] = t["decode + geometries"] - t["decode"]
    return {k: round(1e3 * v / len(records), 2) for k, v in t.items()}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=DEFAULT_MODELS, help="comma-separated: registry names or " + ", ".join(CONVS))
    ap.add_argument("--n", type=int, default=2000, help="number of films")
    ap.add_argument("--size", type=int, default=2048, help="side of the JPEG films on disk")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--num-workers", default="auto")
    ap.add_argument("--shard-size", type=int, default=1024)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--also-workers", default="", help="comma-separated worker counts for extra panel runs")
    ap.add_argument("--profile-n", type=int, default=200, help="films the worker profile reads")
    ap.add_argument("--films", default=None, help="folder keeping the films between runs (default: a temporary one)")
    ap.add_argument("--out", default="outputs/bench/panel.json")
    ap.add_argument("--compare-decode", action="store_true",
                    help="only compare exact vs scaled JPEG decoding (panel and prepared store, images/s)")
    ap.add_argument("--rounds", type=int, default=2, help="--compare-decode: exact/scaled rounds, alternating")
    args = ap.parse_args(argv)
    if args.compare_decode:
        return compare_decode(args)

    from robustbench_fm import encoders
    from robustbench_fm.features.engine.panel import default_panel_workers, extract, extract_panel
    from robustbench_fm.features.options import ExtractOptions

    device = encoders.resolve_device(args.device)
    workers = default_panel_workers(device) if args.num_workers == "auto" else int(args.num_workers)
    options = ExtractOptions(batch_size=args.batch_size, num_workers=workers, shard_size=args.shard_size)
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    result = {"n_images": args.n, "image_size": args.size, "image_format": "JPEG, grey (L), quality 90",
              "batch_size": args.batch_size, "num_workers": workers,
              "workers_note": "the decode pass, the transform passes, the single runs and the panel all use "
                              "num_workers decode workers (--num-workers auto: the panel's default, one per core "
                              "on CPU; the decode and transform passes' workers at the panel's lower priority)",
              "shard_size": args.shard_size,
              "models": names, "device": str(device), "cpu_count": os.cpu_count(),
              "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
              "python": sys.version.split()[0], "platform": platform.platform(),
              "load_average_before": [round(v, 2) for v in os.getloadavg()]}
    with tempfile.TemporaryDirectory(prefix="bench_panel_") as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        root, manifest = films(args, tmp)
        result["image_write_seconds"] = round(time.perf_counter() - t0, 1)
        panel = [load_encoder(n, device) for n in names]
        result["profile_ms_per_image"] = {"worker (one thread, this process)": profile_worker(
            manifest, root, panel, min(args.profile_n, args.n), args.batch_size)}
        nice = device.type == "cpu"  # as extract_panel's workers
        sec = {"decode": pass_seconds(manifest, root, None, args.batch_size, workers, nice)}
        print(f"decode pass: {sec['decode']:.1f} s", flush=True)
        per = {}
        for enc in panel:
            name = enc.spec.name
            dt = pass_seconds(manifest, root, enc.transform, args.batch_size, workers, nice)
            fwd = forward_seconds(enc, args.n, args.batch_size)
            t = time.perf_counter()
            single = extract(enc, manifest, root, tmp / "single", options, progress=False, read=False,
                             entry=engine_entry(enc))
            per[name] = {"decode_transform_s": round(dt, 3), "transform_s": round(dt - sec["decode"], 3),
                         "forward_s": round(fwd, 3), "single_extract_s": round(time.perf_counter() - t, 3),
                         "entry": single.path}
            print(f"{name}: decode+transform {dt:.1f} s, forward {fwd:.1f} s, single extract "
                  f"{per[name]['single_extract_s']:.1f} s", flush=True)
        t = time.perf_counter()
        stats: dict = {}
        feats = extract_panel(panel, manifest, root, tmp / "panel", options, progress=False, read=False, _stats=stats,
                              entries=[engine_entry(e) for e in panel])
        sec["panel"] = time.perf_counter() - t
        print(f"panel: {sec['panel']:.1f} s ({workers} workers)", flush=True)
        result["profile_ms_per_image"]["main process (panel run)"] = {
            k: round(1e3 * v / args.n, 2) for k, v in stats.items()}
        by_workers = {workers: round(sec["panel"], 3)}
        for w in [int(v) for v in args.also_workers.split(",") if v.strip()]:
            t = time.perf_counter()
            extract_panel(panel, manifest, root, tmp / f"panel-w{w}", dataclasses.replace(options, num_workers=w),
                          progress=False, read=False, entries=[engine_entry(e) for e in panel])
            by_workers[w] = round(time.perf_counter() - t, 3)
            print(f"panel with {w} workers: {by_workers[w]:.1f} s", flush=True)
        identical = {}
        for fs in feats:
            ref = per[fs.path.parent.name].pop("entry")
            identical[fs.path.parent.name] = {p.name: p.read_bytes() for p in sorted(fs.path.iterdir())} == \
                {p.name: p.read_bytes() for p in sorted(ref.iterdir())}
        fwd_sum = sum(p["forward_s"] for p in per.values())
        tf_sum = sum(max(p["transform_s"], 0.0) for p in per.values())
        single_sum = sum(p["single_extract_s"] for p in per.values())
        floor = sec["decode"] + fwd_sum
        result.update({
            "seconds": {"decode_pass": round(sec["decode"], 3), "forward_sum": round(fwd_sum, 3),
                        "transform_sum": round(tf_sum, 3), "single_sum": round(single_sum, 3),
                        "panel": round(sec["panel"], 3)},
            "panel_by_workers": {str(k): v for k, v in by_workers.items()},
            "per_encoder": per,
            "entries_byte_identical": identical,
            "ratios": {
                "panel_over_decode_plus_forwards": round(sec["panel"] / floor, 3),
                "panel_over_decode_plus_transforms_plus_forwards": round(sec["panel"] / (floor + tf_sum), 3),
                "single_sum_over_panel": round(single_sum / sec["panel"], 3)},
            "goals": {"panel_over_decode_plus_forwards_max": 1.3},
        })
        result["meets_goal"] = result["ratios"]["panel_over_decode_plus_forwards"] <= 1.3
        result["load_average_after"] = [round(v, 2) for v in os.getloadavg()]
        if not all(identical.values()):
            raise SystemExit(f"bench_panel: panel entries differ from single-encoder entries: {identical}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return result


def films(args, tmp: Path) -> tuple[Path, pd.DataFrame]:
    """``(root, manifest)`` of ``args.n`` films of ``args.size`` px: under ``--films`` (reused when
    the folder already holds as many, written with seed 0), else written under ``tmp``."""
    root = Path(args.films) / f"{args.size}px" if args.films else tmp / "data"
    done = root / "films_written.txt"  # how many films the folder holds (written with seed 0)
    if done.exists() and int(done.read_text()) >= args.n:
        return root, pd.DataFrame({"sample_id": [f"f{i:06d}" for i in range(args.n)],
                                   "path": [f"img/{i:06d}.jpg" for i in range(args.n)]})
    manifest = write_films(root, args.n, args.size)
    if args.films:
        done.write_text(f"{args.n}\n")
    return root, manifest


def compare_decode(args) -> dict:
    """``--compare-decode``: exact vs scaled decoding, panel and prepared store, one run (module docstring)."""
    from robustbench_fm import encoders
    from robustbench_fm.data import prepared
    from robustbench_fm.features.engine.panel import default_panel_workers, extract_panel
    from robustbench_fm.features.options import ExtractOptions

    device = encoders.resolve_device(args.device)
    workers = default_panel_workers(device) if args.num_workers == "auto" else int(args.num_workers)
    options = ExtractOptions(batch_size=args.batch_size, num_workers=workers, shard_size=args.shard_size)
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    result = {"n_images": args.n, "image_size": args.size, "image_format": "JPEG, grey (L), quality 90",
              "models": names, "batch_size": args.batch_size, "num_workers": workers, "rounds": args.rounds,
              "device": str(device), "cpu_count": os.cpu_count(), "torch": torch.__version__,
              "load_average_before": [round(v, 2) for v in os.getloadavg()]}
    times: dict = {k: [] for k in ("panel_exact", "panel_scaled", "prepare_exact", "prepare_scaled")}
    stats: dict = {"exact": {}, "scaled": {}}
    with tempfile.TemporaryDirectory(prefix="bench_panel_decode_") as tmp:
        tmp = Path(tmp)
        root, manifest = films(args, tmp)
        panel = [load_encoder(n, device) for n in names]
        result["profile_ms_per_image"] = {
            d: {"worker (one thread, this process)": profile_worker(manifest, root, panel,
                                                                     min(args.profile_n, args.n), args.batch_size, d)}
            for d in ("exact", "scaled")}
        for r in range(args.rounds):
            for d in ("exact", "scaled"):
                st: dict = {}
                t = time.perf_counter()
                extract_panel(panel, manifest, root, tmp / f"panel-{d}-{r}", options, progress=False, read=False,
                              _stats=st, decode=d, entries=[engine_entry(e, d) for e in panel])
                times[f"panel_{d}"].append(time.perf_counter() - t)
                for k, v in st.items():
                    stats[d][k] = stats[d].get(k, 0.0) + v
                t = time.perf_counter()
                prepared.prepare(manifest, root, tmp / f"prep-{d}-{r}", 224, workers=workers, progress=False,
                                 decode=d)
                times[f"prepare_{d}"].append(time.perf_counter() - t)
                print(f"round {r} {d}: panel {times[f'panel_{d}'][-1]:.1f} s, "
                      f"prepare {times[f'prepare_{d}'][-1]:.1f} s", flush=True)
    n = args.n
    for d in ("exact", "scaled"):
        result["profile_ms_per_image"][d]["main process (panel runs)"] = {
            k: round(1e3 * v / (n * args.rounds), 2) for k, v in stats[d].items()}
    result["seconds"] = {k: [round(v, 2) for v in vs] for k, vs in times.items()}
    result["images_per_s"] = {k: round(n * len(vs) / sum(vs), 1) for k, vs in times.items()}
    result["speedup_scaled_over_exact"] = {
        "panel": round(sum(times["panel_exact"]) / sum(times["panel_scaled"]), 2),
        "prepare_224": round(sum(times["prepare_exact"]) / sum(times["prepare_scaled"]), 2)}
    result["load_average_after"] = [round(v, 2) for v in os.getloadavg()]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
