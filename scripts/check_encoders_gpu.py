"""Every encoder entry a stock library builds offline, at full depth with random weights, on CUDA.

Two images go through each entry's own transform and ``embed`` (the entry's autocast dtype) and
through the fp32 forward; the JSON (default ``outputs/bench/encoders_gpu.json``) records per
entry the parameter count against the spec, the output shape, finiteness, that the two images
give different features, and the minimum cosine between the autocast and fp32 features.

    python scripts/check_encoders_gpu.py --out outputs/bench/encoders_gpu.json
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from PIL import Image

from robustbench_fm import encoders


def stock(spec) -> bool:
    """Built by timm, open_clip, torchxrayvision or a transformers config alone."""
    return spec.library in ("timm", "open_clip", "torchxrayvision") or (
        spec.library == "transformers" and bool(spec.architecture))


def check(name: str, images: list[Image.Image]) -> dict:
    spec, t0 = encoders.get(name), time.perf_counter()
    with torch.device("cuda"):
        enc = encoders.load(spec.replace(pretrained=False, seed=0, hub_file=None), device="cuda")
    x = torch.stack([enc.transform(im) for im in images])
    feats = enc.embed(x)
    with torch.inference_mode():
        fp32 = enc.forward(x.cuda()).float()
    torch.cuda.synchronize()
    return {"name": name, "params_m": round(sum(p.numel() for p in enc.model.parameters()) / 1e6, 2),
            "spec_m": spec.params_m, "input": list(x.shape), "out": list(feats.shape),
            "dim_ok": tuple(feats.shape) == (2, spec.embed_dim), "finite": bool(torch.isfinite(feats).all()),
            "distinct": not torch.allclose(feats[0], feats[1]), "amp": enc.uses_amp,
            "amp_vs_fp32_min_cos": round(torch.nn.functional.cosine_similarity(feats, fp32).min().item(), 4),
            "seconds": round(time.perf_counter() - t0, 1)}


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="outputs/bench/encoders_gpu.json")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("check_encoders_gpu: no CUDA device here; run it on a GPU machine")
    images = [Image.new("RGB", (300, 260), (120, 30, 200)), Image.linear_gradient("L").resize((240, 320))]
    results = []
    for name in [n for n in encoders.names() if stock(encoders.get(n))]:
        try:
            results.append(check(name, images))
        except Exception as err:  # noqa: BLE001  (recorded per entry; the others go on)
            results.append({"name": name, "error": " ".join(repr(err).split())[:400]})
        torch.cuda.empty_cache()
        print(results[-1], flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    print("all ok:", all(r.get("dim_ok") and r.get("finite") and r.get("distinct") for r in results))
    return results


if __name__ == "__main__":
    main()
