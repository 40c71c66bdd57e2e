"""The panel pass's speed work changes where and when the work runs, never a
value: each claim here is an exact equivalence (byte for byte) or a scheduling fact.

* ``_ToMode`` hands an image already in the encoder's mode through (no copy) and the transform's
  tensor is the one ``convert`` gave, byte for byte.
* The decode worker ships each geometry's uint8 output once (shared by encoders with the same
  geometry, whatever their normalisation); the tail (``ToDtype``, ``Normalize``) runs on the batch
  in the main process and equals the stacked per-image transform byte for byte, a failed row's
  slot zero as in ``_RowsDataset.collate``.
* ``malloc_trim`` runs once per decode chunk, not once per forward.
* On CPU the panel's workers default to every core and run at a lower priority.
"""
from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

# the engine filling a manifest-keyed entry: these tests are about the engine and the entry format
from feature_fixtures import engine_extract as extract
from feature_fixtures import engine_extract_panel as extract_panel
from feature_fixtures import tiny_encoder
from PIL import Image
from torchvision.transforms.v2.functional import pil_to_tensor

from robustbench_fm.encoders.base import _ToMode, build_transform
from robustbench_fm.features.engine import panel as panel_mod
from robustbench_fm.features.engine.panel import (
    _HostPlan,
    _pack,
    _PanelDataset,
    _standard_steps,
    default_panel_workers,
)
from robustbench_fm.features.engine.rows import _RowsDataset, default_num_workers, default_reader


def _films(root: Path, n: int = 12) -> pd.DataFrame:
    """Grey and RGB films of two sizes (odd sizes: the resize and the crop both do work)."""
    rng = np.random.default_rng(11)
    (root / "img").mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(n):
        h, w = (61, 83) if i % 2 else (90, 70)
        arr = rng.integers(0, 256, (h, w) if i % 3 else (h, w, 3), dtype=np.uint8)
        Image.fromarray(arr).save(root / "img" / f"{i}.png")
        rows.append({"sample_id": f"s{i:03d}", "path": f"img/{i}.png"})
    return pd.DataFrame(rows)


def _encoders():
    """Two RGB encoders with the same geometry but different normalisation, a grey one with it
    too, and two other geometries (squash bilinear, longest-side pad)."""
    return [tiny_encoder(weights_id="a", name="rgb_a", input_size=24, interpolation="bicubic",
                         mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)),
            tiny_encoder(weights_id="b", name="rgb_b", input_size=24, interpolation="bicubic"),
            tiny_encoder(weights_id="g", name="grey", input_size=24, interpolation="bicubic", channels=1,
                         mean=(0.4,), std=(0.3,), forward=lambda m, x: m(x.expand(-1, 3, -1, -1))),
            tiny_encoder(weights_id="s", name="squash", input_size=20, resize="squash", interpolation="bilinear"),
            tiny_encoder(weights_id="p", name="pad", input_size=28, resize="longest_pad", interpolation="bilinear")]


@pytest.mark.parametrize("src,mode", [("L", "L"), ("RGB", "RGB"), ("L", "RGB"), ("RGB", "L")])
def test_to_mode_hands_an_image_in_its_mode_through_and_the_tensor_is_convert_s(src, mode):
    rng = np.random.default_rng(0)
    im = Image.fromarray(rng.integers(0, 256, (33, 47) if src == "L" else (33, 47, 3), dtype=np.uint8))
    out = _ToMode(mode)(im)
    assert (out is im) == (src == mode)  # before: convert() copied an image already in its mode
    spec = _encoders()[0 if mode == "RGB" else 2].spec
    reference = torch.from_numpy(np.array(im.convert(mode))).reshape(33, 47, -1).permute(2, 0, 1)
    steps = build_transform(spec).transforms
    got = steps[1](steps[0](im))  # _ToMode then PILToTensor
    assert got.dtype == torch.uint8 and torch.equal(got, reference)


def test_worker_ships_each_geometry_once_as_uint8_and_the_batched_tail_is_the_transform(tmp_path):
    manifest = _films(tmp_path)
    encs = _encoders()
    plans = [_HostPlan(*_standard_steps(e.transform)) for e in encs]
    ds = _PanelDataset(manifest.to_dict("records"), tmp_path, [e.transform for e in encs], plans,
                       [None] * len(encs), default_reader)
    items = [ds[(i, tuple(range(len(encs))))] for i in range(len(manifest))]
    for _, out in items:
        xs = [out[j][0] for j in range(len(encs))]
        assert all(x.dtype == torch.uint8 for x in xs)  # before: each job's normalised float32 tensor
        assert xs[0] is xs[1]  # one resize, one tensor for the two RGB encoders of the same geometry
    stores, rows = _pack(items)
    # per film: the shared bicubic 24 px tensor (rgb_a, rgb_b and, for a grey film, the grey
    # encoder: 'L' resized once), the grey encoder's own for an RGB film, squash, pad
    assert sum(len(v) for v in stores.values()) == sum(3 if i % 3 else 4 for i in range(len(manifest)))

    bad = [2, 5]
    for j, (enc, plan) in enumerate(zip(encs, plans)):
        got = plan.finish(torch.stack([plan.expand(stores[r[j][0][0]][r[j][0][1]]) for _, r in rows]), bad)
        ds_ref = _RowsDataset(manifest.to_dict("records"), tmp_path, enc.transform, default_reader)
        ref = [ds_ref[i] for i in range(len(manifest))]
        ref = torch.stack([torch.zeros_like(x) if i in bad else x for i, x, _ in ref])
        assert got.dtype == torch.float32 and got.shape == ref.shape
        assert got.numpy().tobytes() == ref.numpy().tobytes(), enc.spec.name


def test_panel_entries_stay_byte_identical_and_trim_runs_once_a_chunk(tmp_path, monkeypatch):
    manifest = _films(tmp_path, 20)
    calls = []
    monkeypatch.setattr(panel_mod, "_malloc_trim", lambda: lambda: calls.append(1))
    encs, sizes = _encoders(), [4, 5, 3, 4, 6]
    got = extract_panel(encs, manifest, tmp_path, tmp_path / "panel", batch_size=sizes, shard_size=8,
                        num_workers=0, progress=False)
    # shards of 8, 8, 4 rows: 5 + 5 + 8 + 5 + 5 forwards; chunks of max(batch sizes) = 6 rows:
    # 4 chunks, each completing some batch; before: one trim per forward (28)
    assert len(calls) == 4 and sum(fs.n_forward for fs in got) == 28
    for enc, bs, fs in zip(encs, sizes, got):
        ref = extract(enc, manifest, tmp_path, tmp_path / "single", batch_size=bs, shard_size=8, progress=False)
        assert {p.name: p.read_bytes() for p in sorted(fs.path.iterdir())} == \
            {p.name: p.read_bytes() for p in sorted(ref.path.iterdir())}


def test_panel_workers_default_to_every_core_on_cpu(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1}, raising=False)
    assert default_panel_workers("cpu") == 2 and default_num_workers("cpu") == 1  # before: 1, as one encoder
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0}, raising=False)
    assert default_panel_workers("cpu") == 0
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(32)), raising=False)
    assert default_panel_workers("cuda") == default_num_workers("cuda") == 16


class _NiceReader:
    """Records the niceness of the process that decodes each row and whether it ignores SIGINT."""

    def __init__(self, out: Path):
        self.out = out

    def __call__(self, image_root, row):
        with open(self.out, "a") as fh:
            ignored = int(signal.getsignal(signal.SIGINT) == signal.SIG_IGN)
            fh.write(f"{os.getpid()} {os.nice(0)} {ignored}\n")
        return default_reader(image_root, row)


def test_cpu_decode_workers_run_below_the_main_process_and_leave_ctrl_c_to_it(tmp_path):
    """Niced (the forward's threads keep the cores) and SIGINT ignored: Ctrl-C reaches the whole
    process group, and only the main process may act on it (save shards, one line, exit 130)."""
    manifest = _films(tmp_path, 6)
    log = tmp_path / "nice.txt"
    # the main process starts with Python's Ctrl-C handler whatever the suite inherited (a shell's
    # background job starts with SIGINT ignored), so the worker ignores it only if it says so itself
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        extract_panel(_encoders()[:2], manifest, tmp_path, tmp_path / "c", batch_size=3, num_workers=1,
                      progress=False, reader=_NiceReader(log))
        main_handler = signal.getsignal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, before)
    seen = {tuple(map(int, line.split())) for line in log.read_text().splitlines()}
    assert len(seen) == 1
    pid, nice, ignored = seen.pop()
    assert pid != os.getpid() and nice == min(19, os.nice(0) + panel_mod.WORKER_NICE)  # before: os.nice(0)
    assert ignored == 1 and main_handler is signal.default_int_handler  # the main process keeps Ctrl-C


@pytest.mark.parametrize("interp", ["bicubic", "bilinear"])
@pytest.mark.parametrize("resize", ["shorter_center_crop", "squash", "longest_pad"])
def test_grey_films_resized_together_equal_each_film_s_own_geometry(interp, resize):
    """_packed_geometry: up to 4 grey films of one size in one channels-last call; each channel
    is byte-identical to the film's own 1-channel geometry (down- and up-scaling, odd sizes)."""
    rng = np.random.default_rng(abs(hash((interp, resize))) % 2**32)
    for h, w, size in [(301, 257, 64), (90, 140, 37), (33, 29, 48), (512, 512, 224)]:
        spec = _encoders()[2].spec.replace(input_size=size, resize=resize, interpolation=interp)
        plan = _HostPlan(*_standard_steps(build_transform(spec)))
        for n in (2, 3, 4):
            films = [Image.fromarray(rng.integers(0, 256, (h, w), dtype=np.uint8)) for _ in range(n)]
            x = panel_mod._interleave(films)
            assert x.shape == (4, h, w) and x.stride() == (1, 4 * w, 4)  # interleaved: channels last
            got = panel_mod._packed_geometry(plan.geometry, x, n)
            for k, im in enumerate(films):
                own = plan.geometry(pil_to_tensor(im))  # the encoder's own transform's geometry
                assert got[k:k + 1].shape == own.shape and got[k:k + 1].contiguous().numpy().tobytes() == \
                    own.contiguous().numpy().tobytes(), (h, w, size, n, k)


def test_the_worker_resizes_grey_films_four_to_a_call(tmp_path, monkeypatch):
    """A chunk's grey films of one size go through each geometry 4 at a time (3 geometries: rgb_a,
    rgb_b and grey share one); the entries stay those of each encoder alone."""
    rng = np.random.default_rng(3)
    (tmp_path / "img").mkdir()
    for i in range(10):
        Image.fromarray(rng.integers(0, 256, (50, 66), dtype=np.uint8)).save(tmp_path / "img" / f"{i}.png")
    manifest = pd.DataFrame({"sample_id": [f"s{i}" for i in range(10)], "path": [f"img/{i}.png" for i in range(10)]})
    calls = []
    real = panel_mod._packed_geometry
    monkeypatch.setattr(panel_mod, "_packed_geometry", lambda g, x, n: calls.append(n) or real(g, x, n))
    encs = _encoders()[:3] + _encoders()[3:]
    sizes = [5, 5, 2, 5, 10]
    got = extract_panel(encs, manifest, tmp_path, tmp_path / "panel", batch_size=sizes, shard_size=10, num_workers=0,
                        progress=False)
    # one chunk of 10 rows (the largest batch): slices of 4, 4, 2 films, 3 geometries each; before: no packing
    assert sorted(calls) == sorted([4, 4, 2] * 3)
    for enc, bs, fs in zip(encs, sizes, got):
        ref = extract(enc, manifest, tmp_path, tmp_path / "single", batch_size=bs, shard_size=10, progress=False)
        assert {p.name: p.read_bytes() for p in sorted(fs.path.iterdir())} == \
            {p.name: p.read_bytes() for p in sorted(ref.path.iterdir())}
