"""Download-free fixtures for tests of extraction and the feature cache.

``tiny_encoder()`` is a seeded 2-layer conv net on 32 px inputs (8-d features) that embeds a few
dozen images in well under a second on one CPU core; ``write_images(root, n)`` writes ``n`` small
random PNGs and returns their manifest. Importable from every test module (tests/ is on sys.path through its
conftest.py).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch
from PIL import Image

from robustbench_fm.encoders.base import Encoder
from robustbench_fm.encoders.spec import EncoderSpec


def tiny_encoder(weights_id: str = "test", forward=None, **spec_changes) -> Encoder:
    """A seeded random conv encoder named ``tiny`` (``spec_changes`` go to ``EncoderSpec.replace``).

    ``forward(model, x)``, when given, replaces the model call (e.g. to inject NaN outputs).
    """
    spec = EncoderSpec(name="tiny", library="timm", hub_id="test", input_size=32, mean=(0.5,) * 3,
                       std=(0.5,) * 3, embedding="pooled", embed_dim=8, params_m=0.0, pretrained=False,
                       seed=0).replace(**spec_changes)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2), torch.nn.ReLU(),
                                    torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 8))
    call = model if forward is None else (lambda x: forward(model, x))
    return Encoder(spec=spec, model=model, forward=call, weights_id=weights_id, device=torch.device("cpu"))


def write_images(root: str | Path, n: int = 40, seed: int = 0) -> pd.DataFrame:
    """``n`` random RGB PNGs (two sizes) under ``root/img``; manifest with sample_id, path, a label."""
    root = Path(root)
    rng = np.random.default_rng(seed)
    (root / "img").mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(n):
        h, w = (40, 48) if i % 2 else (36, 36)
        arr = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
        Image.fromarray(arr).save(root / "img" / f"{i:03d}.png")
        rows.append({"sample_id": f"s{i:03d}", "path": f"img/{i:03d}.png", "pneumothorax": float(i % 2)})
    return pd.DataFrame(rows)


def shard_bytes(entry: str | Path) -> dict[str, bytes]:
    """``{file name: bytes}`` of the shard files of a cache entry folder."""
    return {p.name: p.read_bytes() for p in sorted(Path(entry).glob("shard-*.parquet"))}
