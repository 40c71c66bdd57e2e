"""Wall time of the papers' full sweeps on N GPUs, from measured throughputs and counted FLOPs.

For every encoder of a panel the forward GFLOPs per image are counted with
``torch.utils.flop_counter.FlopCounterMode`` on the meta device (the entry's own architecture,
no weights, no memory); entries whose architecture needs a package that is not installed fall
back to 2 × parameters × tokens at a 16-px patch (marked ``estimated``). A GPU's effective rate
is taken from a ``scripts/bench_extract.py`` run on it (the largest measured model's forward
images/s × its counted GFLOPs), its decode rate from the same run (decode-only images/s with its
worker count). One encoder's extraction takes max(forward, decode) time (they overlap); jobs are
one per encoder, placed longest first on N GPUs, and the sweep's wall time is the busiest GPU's.

    python scripts/estimate_cost.py --bench benchmarks/h200/extract_gpu.json --gpus 1,4,8 \
        --out outputs/bench/cost.json --markdown outputs/bench/cost.md
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from robustbench_fm import encoders

#: The papers' sweeps: (panel, images per encoder) — CANDOR: 605,443 images over 22 encoders;
#: CRoMa: ~150,000 tiles over its tile panel.
SWEEPS = {"candor_all": 605_443, "croma_tiles": 150_000}


def panel(name: str) -> list[str]:
    from omegaconf import OmegaConf

    from robustbench_fm.cli.main import CONFIG_DIR

    return list(OmegaConf.load(CONFIG_DIR / "panel" / f"{name}.yaml").encoders)


def gflops_per_image(name: str) -> tuple[float, str]:
    """Forward GFLOPs of one image through the entry's architecture: counted, or estimated."""
    spec = encoders.get(name)
    try:
        random = spec.replace(pretrained=False, seed=0)
        with torch.device("meta"):
            enc = encoders.load(random, device="meta")
            x = torch.empty(1, spec.channels, spec.input_size, spec.input_size)
            with FlopCounterMode(display=False) as counter:
                enc.forward(x)
        return counter.get_total_flops() / 1e9, "counted"
    except Exception:  # noqa: BLE001  (an optional package or a hub config that is not here)
        tokens = (spec.input_size // 16) ** 2 + 1
        return 2 * spec.params_m * 1e6 * tokens / 1e9, "estimated"


def schedule(hours: list[float], gpus: int) -> float:
    """Makespan of jobs placed longest first on the least loaded of ``gpus`` GPUs."""
    load = [0.0] * gpus
    for h in sorted(hours, reverse=True):
        load[load.index(min(load))] += h
    return max(load)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", default="benchmarks/h200/extract_gpu.json",
                    help="a scripts/bench_extract.py JSON measured on the GPU to plan for")
    ap.add_argument("--gpus", default="1,4,8")
    ap.add_argument("--out", default="outputs/bench/cost.json")
    ap.add_argument("--markdown", default=None, help="also write the table as markdown")
    args = ap.parse_args(argv)
    bench = json.loads(Path(args.bench).read_text())
    ref_name, ref = max(bench["models"].items(), key=lambda kv: gflops_per_image(kv[0])[0])
    ref_gflops = gflops_per_image(ref_name)[0]
    rate_gflops = ref["forward_images_per_s"] * ref_gflops
    decode = ref["decode_only_images_per_s"]
    gpus = [int(g) for g in args.gpus.split(",")]
    result = {"bench": args.bench, "device": bench.get("device_name"), "reference_model": ref_name,
              "effective_tflops": round(rate_gflops / 1e3, 1), "decode_images_per_s": decode,
              "num_workers": bench.get("num_workers"), "sweeps": {}}
    for sweep, n_images in SWEEPS.items():
        rows = []
        for name in panel(sweep):
            g, how = gflops_per_image(name)
            forward_h = n_images * g / rate_gflops / 3600
            rows.append({"encoder": name, "gflops": round(g, 1), "gflops_source": how,
                         "forward_hours": round(forward_h, 2), "decode_hours": round(n_images / decode / 3600, 2),
                         "hours": round(max(forward_h, n_images / decode / 3600), 2)})
        hours = [r["hours"] for r in rows]
        result["sweeps"][sweep] = {"images_per_encoder": n_images, "encoders": rows,
                                   "gpu_hours": round(sum(hours), 1),
                                   "wall_hours": {str(g): round(schedule(hours, g), 1) for g in gpus}}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    table = ["| sweep | encoders | images each | GPU-hours | " + " | ".join(f"wall on {g} GPU" for g in gpus) + " |",
             "|---|---|---|---|" + "---|" * len(gpus)]
    for sweep, r in result["sweeps"].items():
        table.append(f"| {sweep} | {len(r['encoders'])} | {r['images_per_encoder']:,} | {r['gpu_hours']} | "
                     + " | ".join(f"{r['wall_hours'][str(g)]} h" for g in gpus) + " |")
    text = "\n".join(table) + "\n"
    if args.markdown:
        Path(args.markdown).write_text(text)
    print(text)
    return result


if __name__ == "__main__":
    main()
