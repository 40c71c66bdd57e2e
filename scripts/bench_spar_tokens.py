"""Memory and time of SPAR's full-sequence Transformer heads: for each backbone,
a random-weight instance of the real architecture at its real input size (ResNet-50 224, ViT-B/32
224, RadDINO 518 -> 37 x 37, BiomedCLIP 224 -> 14 x 14, SAM-Med2D 256 -> 16 x 16 when its package
is installed) gives the native token sequence (``methods.spar.models.Backbone``), and we record

* the fp16 token-cache bytes per sample: Levels 1-2 (16 tiles x N tokens x D) and Level 3 (N x D);
* one training step (forward, backward, Adam) of the Transformer head
  (``methods.spar.heads.TransformerHead`` with the params defaults d_model 256, 2 layers) on a
  batch of 16 cached samples at Levels 1-2 and 3: seconds and the step's peak resident memory
  (``VmHWM`` after resetting it, minus the resident memory before the step). Where a batch of 16
  would take minutes on a CPU (sequences over ``--max-tokens-full-batch`` tokens, e.g. RadDINO's
  16 x 1,370 = 21,920-token tile sequences) the step runs
  on ``--small-batch`` samples and its time is scaled linearly to 16 (``measured_batch`` says so;
  attention cost is linear in the batch); a tile sequence over ``--max-sequence`` tokens is
  measured on fewer tiles and its time scaled by the squared length ratio (attention's cost, an
  upper bound; ``measured_sequence``); memory is reported as measured, for what was measured,
  beside the size of the attention weights if they were materialised (8 heads x L^2 x 4 B x 16);
* the epoch time extrapolated to WORD's training split: ``--word-tile-sets`` tile sets (Levels
  1-2) and ``--word-questions`` questions (Level 3) per epoch at batch 16 (our estimate for WORD's
  100 training volumes, not a number the paper gives).

    python scripts/bench_spar_tokens.py --out benchmarks/cpu2/spar_tokens.json
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from pathlib import Path

import torch

from robustbench_fm import encoders
from robustbench_fm.methods.spar.heads import TransformerHead
from robustbench_fm.methods.spar.models import Backbone
from robustbench_fm.methods.spar.params import SparParams

BACKBONES = ("resnet50_in1k", "vit_b32_in1k", "rad_dino", "biomedclip", "sam_med2d")


def _status(field: str) -> int:
    """kB of ``field`` in /proc/self/status (VmRSS, VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current VmRSS (Linux >= 4.0)


def head_step(dim: int, n_tokens: int, tiles: int, batch: int) -> dict:
    """Seconds and peak extra resident memory (MiB) of one Transformer-head training step on
    ``tiles`` tiles of ``n_tokens`` tokens (0: one Level 3 slice)."""
    p = SparParams()
    gen = torch.Generator().manual_seed(0)
    head = TransformerHead(dim, 2, n_tokens, n_tiles=tiles, cond_dim=0 if tiles else 84,
                           d_model=p.d_model, layers=p.head_layers)
    opt = torch.optim.Adam(head.parameters(), lr=p.lr)
    shape = (batch, tiles, n_tokens, dim) if tiles else (batch, n_tokens, dim)
    x = torch.randn(shape, generator=gen).half()  # the cached fp16 tokens
    q = None if tiles else torch.zeros(batch, 84)
    _reset_peak()
    before = _status("VmRSS")
    start = time.perf_counter()
    out = head(x.float(), q)
    out.float().square().mean().backward()
    opt.step()
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "peak_mib": (_status("VmHWM") - before) / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(BACKBONES))
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--small-batch", type=int, default=1)
    ap.add_argument("--max-tokens-full-batch", type=int, default=1024,
                    help="sequences longer than this run at --small-batch and are scaled to --batch")
    ap.add_argument("--max-sequence", type=int, default=4096,
                    help="longer tile sequences are measured on fewer tiles, time scaled quadratically")
    ap.add_argument("--word-tile-sets", type=int, default=6000)
    ap.add_argument("--word-questions", type=int, default=20000)
    ap.add_argument("--out", default="benchmarks/cpu2/spar_tokens.json")
    args = ap.parse_args()
    torch.manual_seed(0)
    rows = []
    for name in [m for m in args.models.split(",") if m]:
        spec = encoders.get(name).replace(pretrained=False, seed=0)
        try:
            enc = encoders.load(spec, device="cpu")
        except (ImportError, ModuleNotFoundError, OSError) as err:
            rows.append({"backbone": name, "skipped": f"{type(err).__name__}: {err}"})
            print(name, "skipped:", err)
            continue
        backbone = Backbone(enc).eval()
        with torch.inference_mode():
            start = time.perf_counter()
            tok = backbone(torch.zeros(1, 224, 224, dtype=torch.uint8))
            fwd = time.perf_counter() - start
        n_tokens, dim = tok.shape[1:]
        row = {"backbone": name, "input_size": spec.input_size, "tokens": n_tokens, "dim": dim,
               "has_cls": backbone.has_cls, "backbone_forward_s_per_image": fwd,
               "cache_bytes_per_sample_l12": 16 * n_tokens * dim * 2, "cache_bytes_per_sample_l3": n_tokens * dim * 2}
        del enc, backbone
        for level, tiles, n_epoch in (("l12", 16, args.word_tile_sets), ("l3", 0, args.word_questions)):
            seq = n_tokens * max(tiles, 1)
            batch, used = args.batch, tiles
            if seq > args.max_tokens_full_batch:  # a smaller batch, and at most --max-sequence tokens
                batch = args.small_batch
                if tiles and seq > args.max_sequence:
                    used = max(1, args.max_sequence // n_tokens)
            measured_seq = n_tokens * max(used, 1)
            step = head_step(dim, n_tokens, used, batch)
            # linear in the batch; attention is quadratic in the sequence: an upper bound where cut
            step_s = step["seconds"] * args.batch / batch * (seq / measured_seq) ** 2
            row |= {f"{level}_sequence": seq, f"{level}_measured_batch": batch, f"{level}_measured_sequence":
                    measured_seq, f"{level}_step_s_batch{args.batch}": step_s,
                    f"{level}_step_peak_mib_measured": step["peak_mib"],
                    f"{level}_attention_gib_if_materialised_batch{args.batch}":
                        args.batch * 8 * seq ** 2 * 4 / 2 ** 30,
                    f"{level}_epoch_s_word": step_s * math.ceil(n_epoch / args.batch)}
        rows.append(row)
        print(json.dumps(row))
    out = {"script": "scripts/bench_spar_tokens.py", "machine": platform.processor() or platform.machine(),
           "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
           "word_tile_sets_per_epoch": args.word_tile_sets, "word_questions_per_epoch": args.word_questions,
           "head": {"d_model": SparParams.d_model, "layers": SparParams.head_layers}, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
