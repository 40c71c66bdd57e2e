"""Panel extraction: one pass over the images for every encoder of a panel.

A paper experiment embeds the same images with every encoder of its panel (CANDOR: 22 encoders
x 605,443 chest films; CRoMa: 21 x 150,000 tiles). :func:`extract_panel` decodes each image once
for the whole panel: a decode worker reads the row's image, fills its occlusion rectangle, applies
every encoder's own transform to it and drops the decoded image; the main process collects each
encoder's rows into that encoder's own batches and runs its forward pass. It is the one
extraction engine: :func:`robustbench_fm.features.engine.extract` is this function with one
encoder (issue 31 item 4).

Each encoder's cache entry (the one the feature store hands it, ``entries``) gets what it would
get alone: the same shards, and the same batches (each encoder's batches start at each of its missing shards'
first row with its own batch size, and never straddle a shard), written by the same code
(``_ShardWriter``), so the shard files, ``meta.json`` and ``skipped.csv`` do not depend on which
other encoders shared the pass. Each encoder is resumable on its own: a settled entry is read and
skipped, a partly filled one continues from its own missing shards (and from the partial file of
the shard a killed pass was computing); the pass decodes the union of the rows some encoder still
needs, and an encoder sees only its own rows. Each encoder's entry lock is held for the pass; an
encoder whose entry another process is filling is left out of the pass and then waits for that
process (a pass of its own that waits for the lock).

Scaled JPEG decoding (``decode="scaled"``, the default, with the default reader; issue 44): each
encoder's JPEGs are decoded at the DCT scale its own resize needs
(:func:`robustbench_fm.data.images.draft_scale`), so its pixels never depend on which encoders
share the pass; the worker decodes an image once per distinct scale among the encoders that need
it (:func:`robustbench_fm.data.images.scale_groups`: one decode when they agree, as 224-256 px
encoders do on a 2,048 px film).

Memory is bounded as for one encoder: a decoded image lives only while the worker transforms it
(with at most :data:`LANES` - 1 others, the films resized together); in flight are the workers'
prefetched chunks (bounded by :data:`PREFETCH_BYTES`) and at most one batch per encoder.

``device_transform=True`` (for GPU machines): where an encoder's transform is the one
:func:`robustbench_fm.encoders.base.build_transform` builds (mode -> uint8 tensor -> resize/crop
-> scale -> normalise), workers ship the decoded uint8 tensor once per colour mode and the
resize/normalise runs on the encoder's device (:func:`split_transform`). Its features differ
from the host transform's by interpolation rounding (float resize on the device vs torchvision's
uint8 kernel; within cosine 0.9999, tested), so such an entry is keyed apart
(``"transform": "device"`` in its key fields).

On the host, a panel shares what its encoders' transforms have in common (:class:`_HostPlan`): the
resize of a full-size film is computed once per geometry (size, rule, interpolation) and colour
mode, and a grey film bound for an RGB encoder is resized before its channel is repeated; the
worker ships each resized image once, as uint8, and the tail (scale, normalise) runs on each
encoder's batch in the main process; the tensors are those of each encoder's own transform, byte
for byte. On CPU a panel's decode workers default to one per core (:func:`default_panel_workers`)
at a lower priority than the main process's forward (:data:`WORKER_NICE`).

Where the time goes on CPU (``benchmarks/cpu2/panel.json``, 2,048 px grey JPEG films, 5 small
encoders, ms a film, one thread): the worker's decode (~21) and the panel's three resizes
(torchvision's uint8 kernels, which each encoder's published preprocessing defines: ~10-13 ms
each for one film alone, ~13-16 ms for all three with grey films resized four to a call,
:func:`_packed_geometry`); the main process's forwards (~15 for the five, contended) and
collate + tail (~5). The exact transforms' work is part of the panel's floor on CPU, which is
decode + resizes + forwards spread over the cores, not decode + forwards.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import v2 as T

from ...core.devices import usable_cores
from ...core.errors import InvalidSetting
from ...core.locking import FileLock, LockTimeout, acquire_waiting, who_holds
from ...data.images import DEFAULT_DECODE, check_decode, need_of, scale_groups
from ...encoders.base import _LongestSidePad, _ToMode
from ..cache import FeatureCache
from ..occlusion import occlude_row
from ..options import DEFAULTS, ExtractOptions
from .rows import (
    FLUSH_SECONDS,
    PREFETCH_BYTES,
    ExtractionInterrupted,
    FeatureSet,
    ImageReadError,
    Reader,
    _batches,
    _check_inputs,
    _interrupted,
    _log_start,
    _malloc_trim,
    _one_thread,
    _prepare,
    _result,
    _RowsDataset,
    _settle,
    _settled_hit,
    _ShardWriter,
    _unwritable_error,
    default_num_workers,
    embed_full_batch,
    load_partials,
    lock_path,
    partial_tag,
)

log = logging.getLogger("robustbench_fm.features")

#: torchvision modules a device-side transform may hold after the host's mode + PILToTensor
_DEVICE_SAFE = (T.Resize, T.CenterCrop, _LongestSidePad, T.ToDtype, T.Normalize)


class DeviceTransform(torch.nn.Module):
    """The part of a :func:`build_transform` pipeline after ``PILToTensor``, run on the device
    on a uint8 [C, H, W] (or [B, C, H, W]) tensor: geometry in float32, then clamped and rounded
    to the uint8 range as torchvision does for uint8 input on CUDA, scaled to [0, 1]
    (``ToDtype(scale=True)``) and normalised."""

    def __init__(self, steps: Sequence[torch.nn.Module], channels: int = 3):
        super().__init__()
        self.steps, self.channels = list(steps), int(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(torch.float32)
        scaled = False
        for step in self.steps:
            if isinstance(step, T.ToDtype):
                x = x.clamp_(0, 255).round_().div_(255.0)
                if x.shape[-3] == 1 and self.channels == 3:  # a grey film for an RGB encoder
                    x = x.expand(*x.shape[:-3], 3, *x.shape[-2:]).contiguous()
                scaled = True
            else:
                x = step(x)
        if not scaled:
            raise ValueError("device transform: the pipeline has no ToDtype(scale=True) step")
        return x


def _standard_steps(transform) -> tuple[str, list, list] | None:
    """``(mode, geometry steps, tail steps)`` of a :func:`build_transform` pipeline
    (``_ToMode(mode)``, ``PILToTensor``, resize / crop / pad, then ``ToDtype`` and ``Normalize``);
    None for any other transform (open_clip's, a custom one)."""
    steps = getattr(transform, "transforms", None)
    if not isinstance(transform, T.Compose) or not steps or len(steps) < 3:
        return None
    if not isinstance(steps[0], _ToMode) or not isinstance(steps[1], T.PILToTensor):
        return None
    rest = list(steps[2:])
    if not all(isinstance(s, _DEVICE_SAFE) for s in rest) or sum(isinstance(s, T.ToDtype) for s in rest) != 1:
        return None
    cut = next(k for k, s in enumerate(rest) if isinstance(s, T.ToDtype))
    if not all(isinstance(s, (T.ToDtype, T.Normalize)) for s in rest[cut:]):
        return None
    return steps[0].mode, rest[:cut], rest[cut:]


def split_transform(transform) -> tuple[str, DeviceTransform] | None:
    """``(mode, device part)`` when ``transform`` is a :func:`build_transform` pipeline; None for
    any other transform, which then runs on the host."""
    plan = _standard_steps(transform)
    return None if plan is None else (plan[0], DeviceTransform(plan[1] + plan[2], 3 if plan[0] == "RGB" else 1))


def _geometry_key(steps: list) -> tuple:
    """Equal for two geometry pipelines that compute the same thing (the modules' settings)."""
    return tuple((type(s).__name__, repr(s), str(getattr(s, "size", None)), str(getattr(s, "interp", None)))
                 for s in steps)


class _HostPlan:
    """A :func:`build_transform` pipeline run so that encoders of a panel share work: the
    geometry (the costly resize of a full-size film) runs in the decode worker, once per (source
    mode, geometry) for every encoder with the same settings, and ships as uint8; an 'L' image
    bound for an 'RGB' encoder is resized in 'L' and its channel repeated after (PIL's L -> RGB
    conversion repeats the channel and the resize works per channel, so the tensor is the same,
    byte for byte); the tail (``ToDtype(scale=True)``, ``Normalize``: elementwise, exactly rounded
    IEEE operations, so a batch gets each row's values bit for bit) runs on the encoder's batch in
    the main process. Tested against each encoder's own transform through the panel's entries."""

    def __init__(self, mode: str, geometry: list, tail: list):
        self.mode, self.key = mode, _geometry_key(geometry)
        self.geometry, self.tail = T.Compose(geometry), T.Compose(tail)

    def __call__(self, im, shared: dict) -> torch.Tensor:
        """The geometry's uint8 output [1 or C, h, w] (one channel for a grey film: :meth:`expand`)."""
        src = "L" if im.mode == "L" and self.mode == "RGB" else self.mode
        if (src, self.key) not in shared:
            if ("image", src) not in shared:
                shared[("image", src)] = _host_tensor(im, src)
            shared[(src, self.key)] = self.geometry(shared[("image", src)])
        return shared[(src, self.key)]

    def expand(self, x: torch.Tensor) -> torch.Tensor:
        """A grey film's one channel repeated for an RGB encoder (a view; the batch's stack copies it)."""
        return x.expand(3, -1, -1) if self.mode == "RGB" and x.shape[-3] == 1 else x

    def finish(self, batch: torch.Tensor, bad: list[int]) -> torch.Tensor:
        """The tail on a uint8 batch; a failed row's slot is zeros of the normalised batch, as in
        :meth:`_RowsDataset.collate` on the host transform's tensors."""
        x = self.tail(batch)
        if bad:
            x[bad] = 0
        return x


#: grey films resized together, one per channel of a 4-channel image (:func:`_packed_geometry`)
LANES = 4


def _interleave(films: list) -> torch.Tensor:
    """Up to :data:`LANES` grey films of one size as one uint8 [LANES, H, W] channels-last
    tensor, film k in channel k (the last film repeats to fill the lanes): PIL's ``merge``
    interleaves them, one copy into a tensor (``pil_to_tensor`` would copy twice more)."""
    if not 1 <= len(films) <= LANES:
        raise ValueError(f"_interleave: {len(films)} films; 1 to {LANES}")
    w, h = films[0].size
    bands = list(films) + [films[-1]] * (LANES - len(films))
    raw = torch.frombuffer(bytearray(Image.merge("RGBA", bands).tobytes()), dtype=torch.uint8)
    return raw.view(h, w, LANES).permute(2, 0, 1)


def _packed_geometry(geometry, x: torch.Tensor, n: int) -> torch.Tensor:
    """``geometry`` of the ``n`` films interleaved in ``x`` (:func:`_interleave`) in one call ->
    uint8 [n, h, w], channel k film k's output, byte for byte.

    torchvision resizes a uint8 image with torch's AVX2 antialiased kernel, which works on
    4-byte pixels: a channels-last image of 4 channels costs about what a 1-channel image costs
    (measured on 2,048 px films, one thread: bicubic to 224 px 4.6 ms for 4 films against 10.9
    for one; bilinear to 384 px 3.4 against 9.7). Its fixed-point arithmetic is the same in
    every lane and lanes never mix, and crop and pad are indexing, so each channel equals the
    film's own 1-channel result (tested byte for byte against :func:`build_transform`'s geometry
    on random films and sizes, every resize rule, both interpolations)."""
    return geometry(x)[:n]


def _host_tensor(im, mode: str) -> torch.Tensor:
    return T.functional.pil_to_tensor(im if im.mode == mode else im.convert(mode))


def _pack(items):
    """Collate a decode chunk in the worker: every tensor of the chunk (each job's rows; a tensor
    several jobs share once) stacked into one tensor per (shape, dtype), so a chunk crosses to
    the main process as a few shared-memory blocks, not one per row and encoder. -> (stores,
    rows): ``rows`` is ``[(row, {job: ((store, index) or None, error)})]``."""
    groups: dict[tuple, list] = {}
    where: dict[int, tuple] = {}
    rows = []
    for row, per_job in items:
        refs = {}
        for j, (x, err) in per_job.items():
            if x is None:
                refs[j] = (None, err)
                continue
            if id(x) not in where:
                key = (tuple(x.shape), str(x.dtype))
                groups.setdefault(key, []).append(x)
                where[id(x)] = (key, len(groups[key]) - 1)
            refs[j] = (where[id(x)], None)
        rows.append((row, refs))
    return {key: torch.stack(xs) for key, xs in groups.items()}, rows


class _PanelDataset(Dataset):
    """``(row, jobs)`` -> ``(row, {job: (tensor or None, error or None)})``: the row's image read
    once; for each job its transform's output, or (``plans[job]`` set) its geometry's uint8
    output (:class:`_HostPlan`), or (``modes[job]`` set) the uint8 tensor of the image in that
    colour mode; a tensor several jobs share is computed once. Errors are those of
    :class:`_RowsDataset` (same messages, so ``skipped.csv`` is the same)."""

    def __init__(self, records: list[dict], image_root, transforms: list, plans: list, modes: list[str | None],
                 reader: Reader, needs: list | None = None):
        self.rows = _RowsDataset(records, image_root, None, reader)
        self.transforms, self.plans, self.modes = transforms, plans, modes
        self.needs = needs  # per job: the decode its resize needs (scaled decoding), None: one plain read

    def __len__(self):
        return len(self.rows)

    def _split(self, i: int, jobs: tuple) -> list[tuple[tuple, object]]:
        """[(jobs, need)]: the row's jobs grouped by the decode they need (one group without needs)."""
        if self.needs is None or len(jobs) < 2:
            return [(tuple(jobs), None if self.needs is None or not jobs else self.needs[jobs[0]])]
        groups = scale_groups(self.rows.image_root, self.rows.records[i], [self.needs[j] for j in jobs])
        return [(tuple(jobs[k] for k in ks), need) for need, ks in groups]

    def __getitem__(self, item):
        i, jobs = item
        out = {}
        for sub, need in self._split(i, jobs):
            im, err = self._decode(i, need)
            out.update({j: (None, err) for j in sub} if im is None else self._transform(i, sub, im, {})[1])
        return i, out

    def __getitems__(self, items: list) -> list:
        """A decode chunk (DataLoader's batched fetch): its decodes (a row's, or one per distinct
        scale its jobs need) :data:`LANES` at a time, grey films of one size resized together
        (:func:`_packed_geometry`); memory holds at most :data:`LANES` decoded films."""
        merged: dict[int, dict] = {i: {} for i, _ in items}
        flat = [(i, sub, need) for i, jobs in items for sub, need in self._split(i, jobs)]
        for a in range(0, len(flat), LANES):
            part = flat[a:a + LANES]
            decoded = [self._decode(i, need) for i, _, need in part]
            shared: list[dict] = [{} for _ in part]
            self._pack_lanes([(i, sub) for i, sub, _ in part], decoded, shared)
            for (i, sub, _), (im, err), sh in zip(part, decoded, shared):
                merged[i].update({j: (None, err) for j in sub} if im is None else self._transform(i, sub, im, sh)[1])
            del decoded, shared
        return [(i, merged[i]) for i, _ in items]

    def _decode(self, i: int, need=None):
        """-> (image, None) or (None, error); ``need``: read at the DCT scale it gives (scaled decoding)."""
        rows = self.rows
        record = rows.records[i]
        try:
            im = rows.reader(rows.image_root, record) if need is None else rows.reader(rows.image_root, record,
                                                                                       need=need)
            return occlude_row(im, record), None
        except MemoryError:
            raise
        except Exception as exc:  # noqa: BLE001  (reported in the main process, one line)
            msg = " ".join(str(exc).split()) or type(exc).__name__
            return None, rows._error(i, f"{type(exc).__name__}: {msg}")

    def _pack_lanes(self, part: list, decoded: list, shared: list[dict]) -> None:
        """Fill ``shared[k][("L", geometry)]`` for the grey films of ``part`` that share a size:
        the films interleaved once (:func:`_interleave`), then every geometry their jobs need
        computed for all of them in one call (:func:`_packed_geometry`); any failure leaves the
        rows to :meth:`_transform` (which then reports each row's own error)."""
        groups: dict[tuple, list[int]] = {}
        for k, ((_, jobs), (im, _)) in enumerate(zip(part, decoded)):
            if im is not None and im.mode == "L" and any(self._packable(j) for j in jobs):
                groups.setdefault(im.size, []).append(k)
        for ks in groups.values():
            if len(ks) < 2:
                continue
            plans = {self.plans[j].key: self.plans[j] for k in ks for j in part[k][1] if self._packable(j)}
            try:
                x = _interleave([decoded[k][0] for k in ks])
                for key, plan in plans.items():
                    lanes = _packed_geometry(plan.geometry, x, len(ks))
                    for c, k in enumerate(ks):
                        shared[k][("L", key)] = lanes[c:c + 1]
            except MemoryError:
                raise
            except Exception:  # noqa: BLE001  (each row's own transform reports it)
                for k in ks:
                    shared[k].clear()

    def _packable(self, j: int) -> bool:
        return self.modes[j] is None and self.plans[j] is not None

    def _transform(self, i: int, jobs, im, shared: dict):
        rows = self.rows
        out = {}
        for j in jobs:
            try:
                mode = self.modes[j]
                if mode is not None:  # device transform: a grey film travels as one channel
                    src = "L" if im.mode == "L" and mode == "RGB" else mode
                    if ("image", src) not in shared:
                        shared[("image", src)] = _host_tensor(im, src)
                    x = shared[("image", src)]
                elif self.plans[j] is not None:
                    x = self.plans[j](im, shared)
                else:
                    x = self.transforms[j](im)
                if not isinstance(x, torch.Tensor):
                    raise TypeError(f"transform returned {type(x).__name__}, expected a tensor")
                out[j] = (x, None)
            except MemoryError:
                raise
            except Exception as exc:  # noqa: BLE001
                msg = " ".join(str(exc).split()) or type(exc).__name__
                out[j] = (None, rows._error(i, f"{type(exc).__name__}: {msg}"))
        del im, shared  # the decoded image goes once every encoder has transformed it
        return i, out


class _Chunks:
    """Decode chunks: the rows some job needs, in manifest order, ``size`` at a time, each row
    with the jobs that need it (``need``: bool [jobs, rows]). ``batches``: a single job's own
    batches as the chunks, so decoding never runs ahead of the batch being embedded and a shard is
    written before the next shard's first image is read (as one encoder's extraction always did)."""

    def __init__(self, need: np.ndarray, size: int, batches: list[list[int]] | None = None):
        self.need = need
        self.rows = np.flatnonzero(need.any(axis=0))
        self.parts = [np.asarray(b) for b in batches] if batches is not None else \
            [self.rows[a:a + size] for a in range(0, len(self.rows), size)]

    def __len__(self):
        return len(self.parts)

    def __iter__(self):
        for rows in self.parts:
            block = self.need[:, rows]
            yield [(int(r), tuple(np.flatnonzero(block[:, k]).tolist())) for k, r in enumerate(rows)]


@dataclass
class _Job:
    """One encoder's share of a pass."""

    encoder: object
    batch_size: int
    fields: dict
    cache: FeatureCache
    mine: set
    device_tf: DeviceTransform | None = None
    plan: _HostPlan | None = None  # a build_transform pipeline: geometry in the worker, tail here
    mode: str | None = None
    lock: object = None
    missing: list = field(default_factory=list)
    batches: deque = field(default_factory=deque)
    pending: list = field(default_factory=list)
    writer: _ShardWriter | None = None
    collate: object = None
    n_forward: int = 0
    n_images: int = 0
    skipped: dict | None = None
    waiting: bool = False  # another process holds the entry's lock


def _panel_prefetch(jobs: list[_Job], chunk: int, num_workers: int) -> int | None:
    """Chunks each worker prepares ahead (1-4), at most :data:`PREFETCH_BYTES` in flight; a job
    shipping uint8 images of unknown size counts 4 MB a row (a 2,048 px grey film), one shipping
    its geometry's uint8 output (:class:`_HostPlan`) a byte per value, any other 4."""
    if num_workers == 0:
        return None
    row = sum((4 << 20) if j.mode else
              j.encoder.spec.channels * j.encoder.spec.input_size ** 2 * (1 if j.plan is not None else 4) for j in jobs)
    return max(1, min(4, PREFETCH_BYTES // max(1, num_workers * chunk * row)))


#: niceness of a panel's decode workers on CPU (:func:`_init_worker`); 0 leaves them at the main process's
WORKER_NICE = 10


def _init_worker(_worker_id: int, nice: int = 0) -> None:
    """DataLoader ``worker_init_fn`` of a panel pass. Ctrl-C is the main process's: a decode
    worker ignores SIGINT (the terminal sends it to the whole process group), so the main process
    saves the finished shards, prints its one line and shuts the workers down; a worker that took
    the signal itself could die mid-handoff and print a traceback from its file-descriptor
    sharing thread. On CPU (``nice`` > 0) the worker also yields the cores to the main process's
    forward: the forward's intra-op threads meet at barriers, so a worker holding a core stalls
    all of them (on a busy 2-core machine a batch's forward took ~4x longer with the workers at
    the same priority); at a lower priority the worker takes the time the forward leaves. Only
    the scheduling changes, never a value."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if nice:
        with contextlib.suppress(OSError):
            os.nice(nice)


def default_panel_workers(device: torch.device | str) -> int:
    """Decode workers for a panel pass: :func:`default_num_workers` on CUDA; on CPU every core
    this process may use (0 on one core).

    A single encoder on CPU is forward-bound (one worker keeps it fed); a panel is not: its
    worker decodes each image and runs every geometry of the panel (on 2,048 px grey films
    ~20 ms decode + ~13 ms per resize, against ~2-4 ms of forward per encoder for small nets),
    so with one worker the main process idles while one core does the panel's image work.
    With a worker per core that work runs on every core; a worker whose prefetch is full
    sleeps, so a forward-bound panel loses nothing. Measured on the loaded 2-core machine (200
    films, runs alternating 1, 2, 1, 2 workers): 8.3, 6.8, 7.8, 7.2 s; the benchmark's extra
    1-worker runs, each after its 2-worker run, came out faster (``panel_by_workers`` in
    ``benchmarks/cpu2/panel.json``: 77.0 vs 92.4 s; 11.9 vs 15.0 s at 300 films): the load
    of the machine's other jobs moves more than the worker count does.
    """
    if torch.device(device).type == "cuda":
        return default_num_workers(device)
    n = usable_cores()
    return n if n >= 2 else 0


def extract_panel(encoders: Sequence, manifest: pd.DataFrame, image_root: str | Path | None,
                  cache_root: str | Path, options: ExtractOptions = DEFAULTS, *,
                  batch_sizes: Sequence[int] | None = None, entries: Sequence[tuple[Path, dict]] | None = None,
                  decode: str = DEFAULT_DECODE, progress: bool = True, reader: Reader | None = None,
                  read: bool = True, flush_seconds: float | None = FLUSH_SECONDS, device_transform: bool = False,
                  _wait: bool = False, _stats: dict | None = None, _workers: int | None = None) -> list[FeatureSet]:
    """Embed every manifest row with every encoder of ``encoders`` in one decode pass; one
    :class:`FeatureSet` per encoder, in order (see the module docstring).

    The arguments are :func:`~robustbench_fm.features.engine.extract`'s, but ``num_workers="auto"`` is
    :func:`default_panel_workers`;
    ``batch_sizes``: one per encoder (default: ``options.batch_size`` for all).
    ``_workers``: the decode workers already resolved (the one-encoder call, :func:`extract`).
    ``device_transform``: resize/normalise on the encoder's device where its transform allows
    (:func:`split_transform`; the entry is keyed apart). ``_wait``: wait for busy entry locks
    (the call that finishes an encoder left out of a pass). ``_stats``: filled with the main
    process's seconds (waiting for decode chunks, collate + tail, forwards, shard writes).
    ``entries`` (required): per encoder the entry to fill, as the feature store hands it (a chunk of the
    per-image store, :mod:`..store`: its own :class:`~..cache.FeatureCache`, written through) or
    (folder, key fields) (:meth:`~..cache.FeatureCache.to_fill`); with ``device_transform`` an
    encoder whose transform runs on the device needs ``"transform": "device"`` in its key fields.
    ``decode``: ``"scaled"`` (default reader only): each encoder's JPEGs decoded at the DCT scale
    its own resize needs, once per distinct scale (module docstring), keyed (``"decode"`` in its
    key fields).
    """
    t0 = time.perf_counter()
    check_decode(decode)
    own_reader = reader is None
    encoders = list(encoders)
    if not encoders:
        return []
    sizes = [options.batch_size] * len(encoders) if batch_sizes is None else [int(b) for b in batch_sizes]
    if len(sizes) != len(encoders):
        raise InvalidSetting(f"batch_size: {len(sizes)} values for {len(encoders)} encoders; give one per encoder")
    num_workers = options.num_workers if _workers is None else _workers
    if num_workers == "auto":
        num_workers = default_panel_workers(encoders[0].device)
    shard_size, on_bad_image, num_shards, shard = (options.shard_size, options.on_bad_image, options.num_shards,
                                                   options.shard)
    names = [e.spec.name for e in encoders]
    if len(set(names)) != len(names):
        raise InvalidSetting(f"extract_panel: encoder names repeat ({', '.join(names)}); one entry per encoder")
    manifest, ids, image_root, reader, num_workers = _check_inputs(manifest, image_root, reader, sizes,
                                                                   num_workers, encoders[0].device)
    if entries is None or len(entries) != len(encoders):
        raise InvalidSetting("extract_panel: give entries=[(folder, key fields)] per encoder, the entries the feature "
                             "store hands its backend; to embed a manifest call robustbench_fm.features.extract_panel")
    jobs = []
    for j, (enc, bs) in enumerate(zip(encoders, sizes)):
        # the store's own entry object (its writes land where the store reads), or (folder, key fields)
        cache = FeatureCache.to_fill(cache_root, entries[j], shard_size=shard_size, n_rows=len(manifest))
        split = split_transform(enc.transform) if device_transform else None
        if split is not None and cache.fields.get("transform") != "device":
            raise InvalidSetting(f"extract_panel: '{enc.spec.name}' with device_transform=True fills an entry keyed "
                                 "apart; add \"transform\": \"device\" to its key fields")
        job = _Job(enc, bs, cache.fields, cache, set(cache.part_shards(num_shards, shard)))
        if split is not None:
            job.mode, job.device_tf = split
        job.skipped = _settled_hit(cache, manifest, on_bad_image)
        jobs.append(job)

    # an entry another process is filling is left out of the pass, which waits for it after
    with contextlib.ExitStack() as stack:
        active = []
        for job in jobs:
            if job.skipped is not None:
                continue
            try:
                if _wait:  # logs "waiting for <holder> ..." while another process fills the entry
                    job.lock = acquire_waiting(lock_path(job.cache, num_shards, shard), str(job.cache.path), log)
                    stack.callback(job.lock.release)
                else:
                    job.lock = stack.enter_context(FileLock(lock_path(job.cache, num_shards, shard), timeout=0))
            except LockTimeout as busy:
                log.info("%s: %s is filling %s; waiting for it after this pass", job.encoder.spec.name,
                         who_holds(busy), job.cache.path)
                job.waiting = True
                continue
            except OSError as exc:  # a read-only cache: the entry cannot even be locked
                err = _unwritable_error(exc, job.cache, job.encoder.spec.name)
                if err is exc:
                    raise
                raise err from None
            try:
                job.missing, records = _prepare(job.encoder, manifest, image_root, job.cache, job.mine, ids,
                                                reader, on_bad_image)
            except OSError as exc:
                err = _unwritable_error(exc, job.cache, job.encoder.spec.name)
                if err is exc:
                    raise
                raise err from None
            if job.missing:
                active.append(job)
            else:
                log.info("cache hit: %d rows, 0 forward passes (%s)", len(ids), job.cache.path)
        try:
            if active:
                _pass(active, manifest, ids, image_root, reader, num_workers, progress, on_bad_image, flush_seconds,
                      _stats if _stats is not None else {}, scaled=own_reader and decode == "scaled")
        except KeyboardInterrupt as exc:
            if isinstance(exc, ExtractionInterrupted):
                raise
            raise ExtractionInterrupted("; ".join(str(_interrupted(j.cache, j.encoder.spec.name, exc))
                                                  for j in active)) from exc
        except OSError as exc:
            for job in active:
                err = _unwritable_error(exc, job.cache, job.encoder.spec.name)
                if err is not exc:
                    raise err from None
            raise
        for job in jobs:
            if job.lock is not None:
                job.skipped = _settle(job.cache)
    out = []
    for j, job in enumerate(jobs):
        if job.waiting:
            out.append(extract_panel([job.encoder], manifest, image_root, cache_root, options,
                                     batch_sizes=[job.batch_size], entries=[entries[j]], decode=decode,
                                     progress=progress, reader=reader, read=read, flush_seconds=flush_seconds,
                                     device_transform=device_transform, _wait=True, _workers=num_workers)[0])
            continue
        out.append(_result(job.encoder, manifest, job.cache, job.fields, ids, job.skipped, job.n_forward,
                           job.n_images, t0, read, num_shards, shard))
    return out


def _needs(jobs: list[_Job]) -> list:
    """Each job's decode need (:func:`robustbench_fm.data.images.need_of` of its encoder's preprocessing)."""
    out = []
    for job in jobs:
        p = job.encoder.spec.preprocessing()
        out.append(need_of(p["resize"], p["input_size"], p["resize_size"]))
    return out


def _pass(jobs: list[_Job], manifest: pd.DataFrame, ids: np.ndarray, image_root, reader, num_workers: int,
          progress: bool, on_bad_image: str, flush_seconds: float | None, stats: dict, scaled: bool = False) -> None:
    """One decode pass filling every job's missing shards; ``stats`` gets the main process's
    seconds: ``wait`` (for the workers' next chunk), ``collate`` (batch + tail), ``forward``,
    ``write`` (shard writer)."""
    records = manifest.to_dict("records")
    paths = manifest["path"].astype(str).to_numpy() if "path" in manifest.columns else None
    need = np.zeros((len(jobs), len(ids)), dtype=bool)
    heartbeat_all = _heartbeat(jobs)
    for j, job in enumerate(jobs):
        tag = partial_tag(job.encoder, job.batch_size)
        partials = load_partials(job.cache, job.missing, tag, ids, on_bad_image)
        _log_start(job.cache, job.encoder, job.missing, job.mine, partials, len(ids))
        job.batches = deque(_batches(job.cache, job.missing, job.batch_size,
                                     {s: len(e) for s, (e, _) in partials.items()}))
        for b in job.batches:
            need[j, b[0]:b[-1] + 1] = True
        job.writer = _ShardWriter(job.cache, ids, paths, tag, partials, flush_seconds, heartbeat_all)
        job.collate = _RowsDataset(records, image_root, job.encoder.transform, reader).collate
        steps = _standard_steps(job.encoder.transform) if job.device_tf is None else None
        job.plan = None if steps is None else _HostPlan(*steps)
    chunk = max(job.batch_size for job in jobs)
    dataset = _PanelDataset(records, image_root, [j.encoder.transform for j in jobs], [j.plan for j in jobs],
                            [j.mode for j in jobs], reader, _needs(jobs) if scaled else None)
    chunks = _Chunks(need, chunk, list(jobs[0].batches) if len(jobs) == 1 else None)
    cpu = all(job.encoder.device.type == "cpu" for job in jobs)
    loader = DataLoader(dataset, batch_sampler=chunks, num_workers=num_workers, collate_fn=_pack,
                        prefetch_factor=_panel_prefetch(jobs, chunk, num_workers), persistent_workers=False,
                        worker_init_fn=functools.partial(_init_worker, nice=WORKER_NICE if cpu else 0)
                        if num_workers else None)
    bar = None
    if progress:
        from tqdm.auto import tqdm
        desc = f"extract {jobs[0].encoder.spec.name}" if len(jobs) == 1 else f"extract panel of {len(jobs)}"
        bar = tqdm(total=len(chunks.rows), unit="img", desc=desc, dynamic_ncols=True, smoothing=0.1)
    if len(jobs) > 1:
        log.info("panel pass: %d images decoded once for %d encoders (%s)", len(chunks.rows), len(jobs),
                 ", ".join(j.encoder.spec.name for j in jobs))
    trim = _malloc_trim()
    forwards = 0
    for k in ("wait", "collate", "forward", "write"):
        stats.setdefault(k, 0.0)
    it = iter(loader)
    try:
        while True:
            t = time.perf_counter()
            with _one_thread(num_workers == 0):
                items = next(it, None)
            stats["wait"] += time.perf_counter() - t
            if items is None:
                break
            stores, items = items
            n_rows = len(items)
            on_device: dict[tuple, torch.Tensor] = {}
            for row, per_job in items:
                for j, (ref, err) in per_job.items():
                    job = jobs[j]
                    x = None
                    if ref is not None:
                        key, k = ref
                        if job.device_tf is not None:  # the chunk's block goes to the device once
                            dkey = (key, str(job.encoder.device))
                            if dkey not in on_device:
                                on_device[dkey] = stores[key].to(job.encoder.device, non_blocking=True)
                            x = on_device[dkey][k]
                        else:
                            x = stores[key][k] if job.plan is None else job.plan.expand(stores[key][k])
                    job.pending.append((row, x, err))
                    if len(job.pending) == len(job.batches[0]):
                        forwards += _forward(job, on_bad_image, stats)
            del items, stores, on_device
            if forwards:  # once a chunk: malloc_trim costs milliseconds, and a chunk holds a batch per encoder
                trim()
                forwards = 0
            if bar is not None:
                bar.update(n_rows)
    finally:
        if bar is not None:
            bar.close()
        shutdown = getattr(it, "_shutdown_workers", None)
        if callable(shutdown):
            shutdown()
        del it
    for job in jobs:
        if job.batches or job.pending:  # cannot happen: every batch's rows are decoded
            raise RuntimeError(f"panel pass: {job.encoder.spec.name} has {len(job.batches)} batches left")


def _heartbeat(jobs: list[_Job]):
    """Refresh every job's entry lock (any job's shard write or flush): an encoder whose own
    shards come late in the pass keeps its lock fresh."""
    def beat():
        for job in jobs:
            if job.lock is not None:
                job.lock.refresh()
    return beat


def _forward(job: _Job, on_bad_image: str, stats: dict) -> int:
    """Embed the job's next batch and hand it to its shard writer; -> the forward passes run (0 or 1)."""
    want = job.batches.popleft()
    items, job.pending = job.pending, []
    if [r for r, _, _ in items] != want:  # cannot happen: rows come in manifest order
        raise RuntimeError(f"panel pass: {job.encoder.spec.name} got rows {items[0][0]}.. for batch {want[0]}..")
    t0 = time.perf_counter()
    if job.device_tf is not None:
        items = _on_device(job, items)
    with _one_thread(job.encoder.device.type == "cpu"):  # a memcpy: the thread pool only slows it down
        rows, x, errors = job.collate(items)
        if x is not None and job.plan is not None:
            x = job.plan.finish(x, [pos for pos, _, _ in errors])
    del items
    if errors and on_bad_image == "error":
        raise ImageReadError(errors[0][2][0])
    ran = 0
    t1 = time.perf_counter()
    if x is not None:
        emb = np.array(embed_full_batch(job.encoder, x, job.batch_size).cpu().numpy(), dtype=np.float32)
        job.n_forward += 1
        ran = 1
        del x
    else:
        emb = np.empty((len(rows), job.cache.embed_dim), dtype=np.float32)
    t2 = time.perf_counter()
    job.writer.add(rows, emb, errors)
    job.n_images += len(rows) - len(errors)
    t3 = time.perf_counter()
    stats["collate"] += t1 - t0
    stats["forward"] += t2 - t1
    stats["write"] += t3 - t2
    return ran


def _on_device(job: _Job, items: list) -> list:
    """The device part of the transform, images of one size resized together."""
    out = list(items)
    by_shape: dict[tuple, list[int]] = {}
    for k, (_, x, _) in enumerate(items):
        if x is not None:
            by_shape.setdefault(tuple(x.shape), []).append(k)
    for ks in by_shape.values():
        try:
            y = job.device_tf(torch.stack([items[k][1] for k in ks]))
        except MemoryError:
            raise
        except Exception as exc:  # noqa: BLE001  (each row's error, as a host transform would give)
            msg = " ".join(str(exc).split()) or type(exc).__name__
            for k in ks:
                r = items[k][0]
                out[k] = (r, None, (f"row {r}: cannot transform image: {type(exc).__name__}: {msg}",
                                    f"{type(exc).__name__}: {msg}"))
            continue
        for n, k in enumerate(ks):
            out[k] = (items[k][0], y[n], None)
    return out


def extract(encoder, manifest: pd.DataFrame, image_root: str | Path | None, cache_root: str | Path,
            options: ExtractOptions = DEFAULTS, *, entry: tuple[Path, dict] | None = None,
            batch_size: int | None = None, decode: str = DEFAULT_DECODE, progress: bool = True,
            reader: Reader | None = None, read: bool = True,
            flush_seconds: float | None = FLUSH_SECONDS) -> FeatureSet:
    """Embed every manifest row with ``encoder`` into the cache entry ``entry`` (reusing and filling it).
    The feature store hands the entry (a chunk of the per-image store, :mod:`..store`); to embed a
    manifest call :func:`robustbench_fm.features.extract`, which goes through the store.

    ``options`` (:class:`~robustbench_fm.features.options.ExtractOptions`, checked where they were
    made) are read, never checked again: ``batch_size`` (``batch_size`` here: this encoder's own),
    ``num_workers`` (``"auto"``: :func:`default_num_workers` for the encoder's device),
    ``shard_size`` (only for a new cache entry; an existing one keeps its layout), ``on_bad_image``
    (``"error"`` or ``"skip"``, see the module docstring: skipped rows come back as NaN rows of
    ``embeddings`` and are named in :attr:`FeatureSet.skipped`) and ``num_shards``/``shard``: compute
    only part ``shard`` of ``num_shards`` of the entry (:meth:`FeatureCache.part_shards`), e.g. one
    Slurm job per part; the parts fill the same content-keyed entry, which is complete when all
    parts are. Each part holds its own lock, so parts run concurrently. ``embeddings`` is None
    while the entry is incomplete, and with ``read=False`` (callers that read the entry later,
    keeping memory flat).

    ``reader(image_root, row)`` returns a PIL image for a manifest row (default: open
    ``image_root / row['path']``); a row with occlusion columns has that rectangle filled
    (:func:`robustbench_fm.features.occlusion.occlude_row`), then the encoder's own ``transform`` is applied.
    ``decode``: how the entry's recipe decodes JPEGs (the store hands it with the entry).

    ``flush_seconds``: the shard in progress is flushed to a partial file this often (None:
    never), so a killed run loses seconds of work instead of up to a shard; the resume continues
    from it and writes the same bytes (:mod:`.cache`, "Partial shards").

    ``entry``: (folder, key fields) of the entry to fill (required; folder None: the default folder
    of those key fields under ``cache_root``).

    This is the panel engine with one encoder (:func:`extract_panel`, waiting for the entry's lock
    when another process holds it): one engine writes every entry.
    """
    if entry is None:
        raise InvalidSetting("engine extract: give entry=(folder, key fields), the entry the feature store hands its "
                             "backend; to embed a manifest call robustbench_fm.features.extract")
    workers = options.num_workers
    if workers == "auto":
        workers = default_num_workers(encoder.device)
    return extract_panel([encoder], manifest, image_root, cache_root, options,
                         batch_sizes=None if batch_size is None else [batch_size], entries=[entry], decode=decode,
                         progress=progress, reader=reader, read=read, flush_seconds=flush_seconds, _wait=True,
                         _workers=workers)[0]


def backend(cache_root: str | Path, options: ExtractOptions = DEFAULTS, batch_size_of=None, progress: bool = True,
            reader: Reader | None = None, flush_seconds: float | None = FLUSH_SECONDS):
    """The engine as the feature store calls it (:data:`robustbench_fm.features.store.Backend`):
    ``run(encoders, rows, root, entries, decode)`` fills each encoder's entry ``(folder, key fields)``
    with ``rows`` (one encoder: :func:`extract`, which waits for a lock another process holds;
    several: one :func:`extract_panel` pass) under the run's ``options``, reading JPEGs as the
    store's recipe says (``decode``: scaled or exact). ``batch_size_of(name)``: an encoder's batch
    size (default: ``options.batch_size``); ``reader``: a custom row reader (called as given),
    ``flush_seconds``: as :func:`extract`'s."""
    size = batch_size_of if batch_size_of is not None else (lambda _name: options.batch_size)
    given = dict(progress=progress, read=False, reader=reader, flush_seconds=flush_seconds)

    def run(encs: list, rows: pd.DataFrame, root: Path, entries: list, decode: str = DEFAULT_DECODE
            ) -> list[FeatureSet]:
        if len(encs) == 1:
            return [extract(encs[0], rows, root, cache_root, options, batch_size=size(encs[0].spec.name),
                            entry=entries[0], decode=decode, **given)]
        return extract_panel(encs, rows, root, cache_root, options, batch_sizes=[size(e.spec.name) for e in encs],
                             entries=entries, decode=decode, **given)
    return run
