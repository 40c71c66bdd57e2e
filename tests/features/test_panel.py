"""Panel extraction: one decode per image for a whole panel, each encoder's
cache entry byte-identical to the entry ``extract`` writes for it alone, resumable per encoder.

The panel has three encoders that differ in everything a batch depends on: input size, resize
rule, interpolation, batch size (3, 4, 5 over shards of 8 rows: no batch size divides a shard,
and the encoders' batches end on different rows) and weights.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

# the engine filling a manifest-keyed entry: these tests are about the engine and the entry format
from feature_fixtures import engine_extract as extract
from feature_fixtures import engine_extract_panel as extract_panel
from feature_fixtures import tiny_encoder, write_images
from PIL import Image

from robustbench_fm.features import FeatureCache, ImageReadError, verify_entry
from robustbench_fm.features.engine.panel import split_transform
from robustbench_fm.features.engine.rows import default_reader

N, SHARD = 40, 8
BATCHES = (3, 4, 5)
BAD_ROWS = {3: "img/garbage.png", 18: "img/missing.png"}


def _panel():
    """Three encoders: (name, input size, resize, interpolation, output scale)."""
    out = []
    for name, size, resize, interp, scale in (("tiny_a", 32, "shorter_center_crop", "bicubic", 1.0),
                                              ("tiny_b", 40, "squash", "bilinear", 2.0),
                                              ("tiny_c", 24, "longest_pad", "bilinear", -1.0)):
        out.append(tiny_encoder(weights_id=f"w-{name}", name=name, input_size=size, resize=resize,
                                interpolation=interp, forward=lambda m, x, s=scale: s * m(x) + x.mean()))
    return out


def _entry_files(entry: Path) -> dict[str, bytes]:
    """Every file of an entry folder (shards, meta.json, skipped.csv; no partial may be left)."""
    return {p.name: p.read_bytes() for p in sorted(Path(entry).iterdir())}


class Counter:
    """A reader that counts its calls per row (and can stop the run at a row, like a kill)."""

    def __init__(self, stop_at: int | None = None):
        self.calls: list[int] = []
        self.stop_at = stop_at

    def __call__(self, image_root, row):
        i = int(row["sample_id"][1:])
        if i == self.stop_at:
            raise _Kill(f"killed at row {i}")
        self.calls.append(i)
        return default_reader(image_root, row)  # the default reader's errors: skipped.csv compares


class _Kill(BaseException):
    """Not an Exception: nothing in extraction catches it, as nothing survives a SIGKILL."""


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    manifest = write_images(root, N)
    (root / "img" / "garbage.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4)
    bad = manifest.copy()
    for row, path in BAD_ROWS.items():
        bad.loc[row, "path"] = path
    return root, {"error": manifest, "skip": bad}


@pytest.fixture(scope="module")
def singles(data, tmp_path_factory):
    """Each encoder extracted alone (one decode per encoder), per policy."""
    root, manifests = data
    out = {}
    for policy in ("error", "skip"):
        cache = tmp_path_factory.mktemp(f"single-{policy}")
        out[policy] = [extract(enc, manifests[policy], root, cache, batch_size=bs, shard_size=SHARD,
                               progress=False, on_bad_image=policy) for enc, bs in zip(_panel(), BATCHES)]
    return out


@pytest.mark.parametrize("policy,workers", [("error", 0), ("skip", 0), ("skip", 1)])
def test_panel_entries_are_byte_identical_to_single_encoder_entries(policy, workers, data, singles, tmp_path):
    root, manifests = data
    reader = Counter() if workers == 0 else None
    got = extract_panel(_panel(), manifests[policy], root, tmp_path, batch_size=BATCHES, shard_size=SHARD,
                        num_workers=workers, progress=False, reader=reader, on_bad_image=policy)
    for fs, ref in zip(got, singles[policy]):
        assert fs.key == ref.key and fs.path.name == ref.path.name
        files = _entry_files(fs.path)
        assert files == _entry_files(ref.path)
        assert sum(n.startswith("shard-") for n in files) == N // SHARD
        assert ("skipped.csv" in files) == (policy == "skip")
        assert fs.skipped == ref.skipped
        np.testing.assert_array_equal(fs.embeddings, ref.embeddings)
        assert fs.n_forward == ref.n_forward  # the same batches: 3 encoders x their own batch count
        assert verify_entry(fs.path, manifests[policy]).ok
    if reader is not None:  # every image decoded once for the three encoders
        assert sorted(reader.calls) == list(range(N))
    assert [fs.n_forward for fs in got] == [sum(-(-SHARD // bs) for _ in range(N // SHARD)) for bs in BATCHES]


def test_error_policy_names_the_file_like_extract(data, tmp_path):
    root, manifests = data
    with pytest.raises(ImageReadError) as panel_err:
        extract_panel(_panel(), manifests["skip"], root, tmp_path / "p", batch_size=BATCHES, shard_size=SHARD,
                      progress=False)
    with pytest.raises(ImageReadError) as single_err:
        extract(_panel()[0], manifests["skip"], root, tmp_path / "s", batch_size=BATCHES[0], shard_size=SHARD,
                progress=False)
    assert str(panel_err.value) == str(single_err.value)
    assert "img/garbage.png" in str(panel_err.value) and "manifest row 3" in str(panel_err.value)


def test_resume_per_encoder_after_a_kill(data, singles, tmp_path):
    """tiny_a complete, tiny_b missing shards 1 and 2, tiny_c empty; the pass is killed while
    reading row 20 (shard 2), then resumed: each encoder continues from its own state."""
    root, manifests = data
    manifest, refs = manifests["error"], singles["error"]
    panel = _panel()
    a = extract(panel[0], manifest, root, tmp_path, batch_size=BATCHES[0], shard_size=SHARD, progress=False)
    b = extract(panel[1], manifest, root, tmp_path, batch_size=BATCHES[1], shard_size=SHARD, progress=False)
    FeatureCache(tmp_path, b.fields).drop_shards([1, 2])
    a_before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in a.path.iterdir()}

    killed = Counter(stop_at=20)
    with pytest.raises(_Kill):
        extract_panel(panel, manifest, root, tmp_path, batch_size=BATCHES, shard_size=SHARD, progress=False,
                      reader=killed, flush_seconds=0)
    # decode chunks of 5 rows (the largest batch): rows 8-19 were decoded for b (shards 1-2) and c
    assert killed.calls == list(range(0, 20))
    b_dir, c_dir = b.path, tmp_path / "tiny_c" / refs[2].key
    assert sorted(p.name for p in b_dir.glob("shard-*")) == ["shard-00000.parquet", "shard-00001.parquet",
                                                             "shard-00002.partial.npz", "shard-00003.parquet",
                                                             "shard-00004.parquet"]
    # partials hold whole batches from the shard's first row: b (batch 4) rows 16-19; c (batch 5)
    # none, its batch 16-20 was waiting for row 20
    assert sorted(p.name for p in c_dir.glob("shard-*")) == ["shard-00000.parquet", "shard-00001.parquet"]
    with np.load(b_dir / "shard-00002.partial.npz") as z:
        assert z["embedding"].shape == (4, 8)

    resumed = Counter()
    got = extract_panel(panel, manifest, root, tmp_path, batch_size=BATCHES, shard_size=SHARD, progress=False,
                        reader=resumed, flush_seconds=0)
    # a: untouched (no lock, no write); b resumes at row 20 of shard 2; c at row 16 (no whole
    # batch of 5 was flushed) and then shards 3-4; each image read once
    assert resumed.calls == list(range(16, N))
    assert got[0].n_forward == 0 and got[1].n_images_embedded == 4 and got[2].n_images_embedded == 24
    assert {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in a.path.iterdir()} == a_before
    for fs, ref in zip(got, refs):
        assert _entry_files(fs.path) == _entry_files(ref.path)


def test_single_extract_resumes_from_a_flushed_partial_shard(data, singles, tmp_path):
    """A kill in the middle of shard 2 loses only the batch being computed."""
    root, manifests = data
    manifest, ref = manifests["skip"], singles["skip"][1]  # batch 4, row 18 unreadable (shard 2)
    enc = _panel()[1]
    with pytest.raises(_Kill):
        extract(enc, manifest, root, tmp_path, batch_size=4, shard_size=SHARD, progress=False,
                reader=Counter(stop_at=22), on_bad_image="skip", flush_seconds=0)
    entry = tmp_path / "tiny_b" / ref.key
    with np.load(entry / "shard-00002.partial.npz") as z:
        emb = z["embedding"]
    assert emb.shape == (4, 8) and np.isnan(emb[2]).all() and np.isfinite(emb[[0, 1, 3]]).all()  # row 18
    resumed = Counter()
    fs = extract(enc, manifest, root, tmp_path, batch_size=4, shard_size=SHARD, progress=False, reader=resumed,
                 on_bad_image="skip", flush_seconds=0)
    assert resumed.calls == list(range(20, N))  # rows 16-19 came from the partial file
    assert fs.n_images_embedded == N - 20 and fs.skipped == ref.skipped
    assert _entry_files(entry) == _entry_files(ref.path)


@pytest.mark.parametrize("damage", ["other_batch_size", "corrupt", "error_policy"])
def test_a_partial_shard_that_does_not_validate_is_recomputed(damage, data, tmp_path):
    """The kill leaves rows 16-19 of shard 2 in the partial file (row 18 unreadable under
    ``error_policy``); each damage makes the resume discard it and read shard 2 from row 16."""
    root, manifests = data
    manifest = manifests["error"].copy()
    policy = "error"
    if damage == "error_policy":
        manifest.loc[18, "path"] = "img/missing.png"
        policy = "skip"
    enc = _panel()[1]
    with pytest.raises(_Kill):
        extract(enc, manifest, root, tmp_path, batch_size=4, shard_size=SHARD, progress=False,
                reader=Counter(stop_at=22), on_bad_image=policy, flush_seconds=0)
    ref = extract(enc, manifest, root, tmp_path / "ref", batch_size=5 if damage == "other_batch_size" else 4,
                  shard_size=SHARD, progress=False, on_bad_image=policy)
    partial = FeatureCache(tmp_path, ref.fields).partial_path(2)
    assert partial.is_file()
    resumed = Counter()
    if damage == "error_policy":  # the partial lists row 18 as skipped: an error run reads it again
        with pytest.raises(ImageReadError, match="missing.png"):
            extract(enc, manifest, root, tmp_path, batch_size=4, shard_size=SHARD, progress=False,
                    reader=resumed, on_bad_image="error")
        assert not partial.exists() and resumed.calls[0] == 16
        return
    if damage == "corrupt":
        blob = bytearray(partial.read_bytes())
        blob[len(blob) // 2] ^= 0xFF
        partial.write_bytes(bytes(blob))
    # batches of 5 would hold rows 16-20: the file's rows 16-19 (a batch of 4) are not theirs
    fs = extract(enc, manifest, root, tmp_path, batch_size=5 if damage == "other_batch_size" else 4,
                 shard_size=SHARD, progress=False, reader=resumed)
    assert resumed.calls == list(range(16, N)) and not partial.exists()
    new = {n: b for n, b in _entry_files(fs.path).items() if n >= "shard-00002"}
    assert new == {n: b for n, b in _entry_files(ref.path).items() if n >= "shard-00002"}
    assert len(new) == 3


def test_device_transform_within_cosine_of_the_host_transform(tmp_path):
    """Resize/normalise of uint8 tensors on the device (here the CPU, the same
    code) agrees with the host transform to cosine 0.9999; such an entry is keyed apart."""
    from robustbench_fm import encoders

    rng = np.random.default_rng(3)
    (tmp_path / "img").mkdir()
    rows = []
    for i in range(12):  # smooth grey films of two sizes, JPEG like chest films
        h, w = (300, 260) if i % 2 else (256, 256)
        low = Image.fromarray(rng.integers(0, 256, (h // 16, w // 16), dtype=np.uint8))
        low.resize((w, h), Image.BICUBIC).save(tmp_path / "img" / f"{i}.jpg", quality=90)
        rows.append({"sample_id": f"s{i}", "path": f"img/{i}.jpg"})
    import pandas as pd

    manifest = pd.DataFrame(rows)
    enc = encoders.load("random_vit_s", device="cpu")
    mode, device_tf = split_transform(enc.transform)
    assert mode == "RGB"
    with Image.open(tmp_path / "img" / "1.jpg") as im:
        host = enc.transform(im)
        dev = device_tf(torch.as_tensor(np.array(im.convert("RGB"))).permute(2, 0, 1))
    assert host.shape == dev.shape == (3, 224, 224)
    # one uint8 level of the input (1/255 over std ~0.22) bounds the pixel difference
    assert float((host - dev).abs().max()) <= 1.5 / 255 / min(enc.spec.std)
    (a,) = extract_panel([enc], manifest, tmp_path, tmp_path / "c1", batch_size=4, progress=False)
    (b,) = extract_panel([enc], manifest, tmp_path, tmp_path / "c2", batch_size=4, progress=False,
                         device_transform=True)
    assert a.key != b.key and b.fields["transform"] == "device" and "transform" not in a.fields
    cos = (a.embeddings * b.embeddings).sum(1) / np.linalg.norm(a.embeddings, axis=1) \
        / np.linalg.norm(b.embeddings, axis=1)
    assert cos.min() >= 0.9999
    assert not np.array_equal(a.embeddings, b.embeddings)  # a different path, not the same code
    assert split_transform(lambda im: im) is None


def test_embedder_panel_decodes_once_and_fills_the_entries_embed_fills(data, tmp_path, monkeypatch):
    """The app's panel extraction (``pipeline.job.extract_panel`` -> ``Embedder.embed_panel``): one
    decode per image for the encoders that fit together, the same entries as ``Embedder.embed``;
    an encoder larger than the budget gets a pass of its own."""
    import importlib

    from robustbench_fm.features.embed import Embedder, EncoderOptions
    from robustbench_fm.features.options import ExtractOptions

    extract_mod = importlib.import_module("robustbench_fm.features.engine.rows")  # the module, not the function
    root, manifests = data
    manifest = manifests["error"]
    calls = []
    real = extract_mod.default_reader
    monkeypatch.setattr(extract_mod, "default_reader",
                        lambda r, row, need=None: calls.append(row["path"]) or real(r, row, need))
    names = ["planted_blur", "planted_sharp"]
    opts = {"planted_sharp": EncoderOptions(batch_size=7)}
    service = Embedder(tmp_path / "panel", ExtractOptions(device="cpu", batch_size=5, shard_size=SHARD), options=opts)
    got = service.embed_panel(manifest, root, names)
    assert sorted(calls) == sorted(manifest["path"])  # 40 decodes for two encoders
    single = Embedder(tmp_path / "single", ExtractOptions(device="cpu", batch_size=5, shard_size=SHARD), options=opts)
    for name, fs in zip(names, got):
        ref = single.embed(manifest, root, name)
        assert fs.path.parent.name == name and fs.key == ref.key
        assert _entry_files(fs.path) == _entry_files(ref.path)
    assert len(calls) == 3 * N  # + one decode per encoder for the single runs
    # passes by fp32 weight bytes (params_m x 4 MB) within 100 MiB (104.9 MB): random_vit_s 86.8 +
    # planted_blur 0.28 fit; dinov3_s (86.4) would exceed it; so would densenet121_xrv (27.9) after it
    tight = Embedder(tmp_path, ExtractOptions(device="cpu"), panel_memory=100 << 20)
    assert tight.panel_groups(["random_vit_s", "planted_blur", "dinov3_s", "densenet121_xrv"]) == \
        [["random_vit_s", "planted_blur"], ["dinov3_s"], ["densenet121_xrv"]]
    assert Embedder(tmp_path, ExtractOptions(device="cpu"), panel_memory=1).panel_groups(names) == [[n] for n in names]


def test_grey_films_share_the_resize_and_stay_byte_identical(tmp_path):
    """The panel resizes a film once per geometry and colour mode and repeats a grey film's
    channel after the resize (_HostPlan): the entries are still those of each encoder alone.
    Grey and RGB films of two sizes; RGB and grey encoders, two of them with the same geometry."""
    import pandas as pd

    rng = np.random.default_rng(5)
    (tmp_path / "img").mkdir()
    rows = []
    for i in range(18):
        h, w = (70, 90) if i % 3 else (64, 64)
        arr = rng.integers(0, 256, (h, w) if i % 4 else (h, w, 3), dtype=np.uint8)
        Image.fromarray(arr).save(tmp_path / "img" / f"{i}.png")
        rows.append({"sample_id": f"s{i:03d}", "path": f"img/{i}.png"})
    manifest = pd.DataFrame(rows)

    def grey(m, x):
        return m(x.expand(-1, 3, -1, -1)) + x.mean()

    panel = [tiny_encoder(weights_id="rgb1", name="rgb1", input_size=40, interpolation="bicubic",
                          forward=lambda m, x: m(x) + x.mean()),
             tiny_encoder(weights_id="rgb2", name="rgb2", input_size=40, interpolation="bicubic",
                          forward=lambda m, x: 2 * m(x) - x.mean()),
             tiny_encoder(weights_id="g1", name="grey1", input_size=40, interpolation="bicubic", channels=1,
                          mean=(0.4,), std=(0.3,), forward=grey),
             tiny_encoder(weights_id="g2", name="grey2", input_size=36, resize="squash", interpolation="bilinear",
                          channels=1, mean=(0.5,), std=(0.2,), forward=grey)]
    got = extract_panel(panel, manifest, tmp_path, tmp_path / "panel", batch_size=[4, 5, 3, 6], shard_size=8,
                        progress=False)
    for enc, bs, fs in zip(panel, [4, 5, 3, 6], got):
        ref = extract(enc, manifest, tmp_path, tmp_path / "single", batch_size=bs, shard_size=8, progress=False)
        assert _entry_files(fs.path) == _entry_files(ref.path)
        assert np.isfinite(ref.embeddings).all() and len(ref.embeddings) == 18


def test_an_entry_another_process_fills_is_left_out_and_waited_for(data, singles, tmp_path):
    """tiny_b's entry lock is held elsewhere: the pass fills tiny_a and tiny_c, then waits for the
    holder (released after the pass) and fills tiny_b itself, as extract() would."""
    import threading

    from robustbench_fm.core.locking import FileLock
    from robustbench_fm.features.engine.rows import lock_path

    root, manifests = data
    manifest, refs = manifests["error"], singles["error"]
    held = FileLock(lock_path(FeatureCache(tmp_path, refs[1].fields)), timeout=0).acquire()
    reader = Counter()
    release = threading.Timer(0.0, held.release)

    def read(image_root, row):  # the pass has decoded the last row: let the holder go
        out = reader(image_root, row)
        if len(reader.calls) == N:
            release.start()
        return out

    got = extract_panel(_panel(), manifest, root, tmp_path, batch_size=BATCHES, shard_size=SHARD, progress=False,
                        reader=read)
    release.join()
    assert sorted(reader.calls) == sorted(list(range(N)) * 2)  # one pass for a and c, then b alone
    for fs, ref in zip(got, refs):
        assert _entry_files(fs.path) == _entry_files(ref.path)
