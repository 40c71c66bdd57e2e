"""GPU code paths are chosen only when CUDA is there; the CPU suite checks
the choices themselves: device, decode workers, prefetch bound, autocast."""
from __future__ import annotations

import os

import pytest
import torch
from feature_fixtures import tiny_encoder

from robustbench_fm.core.devices import resolve_device
from robustbench_fm.features.engine.panel import _Job, _panel_prefetch
from robustbench_fm.features.engine.rows import PREFETCH_BYTES, default_num_workers


def test_auto_picks_cuda_only_when_available(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda")
    assert resolve_device("cpu") == torch.device("cpu")


@pytest.mark.parametrize("cores, cpu_workers, cuda_workers", [(1, 0, 1), (2, 1, 1), (12, 1, 11), (64, 1, 16)])
def test_decode_workers_follow_the_affinity_mask(monkeypatch, cores, cpu_workers, cuda_workers):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    assert default_num_workers("cpu") == cpu_workers
    assert default_num_workers("cuda") == cuda_workers


def test_prefetch_keeps_decoded_batches_under_the_bound():
    """The one engine's bound (extract is the panel pass with one encoder): float batches of a
    transform run in the worker count 4 bytes a value."""
    jobs = [_Job(tiny_encoder(input_size=224), 256, {}, None, set())]
    batch_bytes = 256 * 3 * 224 * 224 * 4
    assert _panel_prefetch(jobs, 256, 0) is None
    assert _panel_prefetch(jobs, 32, 1) == 4  # CPU default: 1 worker, small batches
    assert _panel_prefetch(jobs, 256, 15) == 1  # an H200 box: 15 workers x 154 MB batches
    for workers in (1, 2, 4, 8, 15):
        depth = _panel_prefetch(jobs, 256, workers)
        assert depth == 1 or depth * workers * batch_bytes <= PREFETCH_BYTES


def test_no_autocast_and_no_pinning_on_cpu():
    enc = tiny_encoder()
    assert enc.device.type == "cpu" and not enc.uses_amp
    with enc.autocast():
        assert not torch.is_autocast_enabled()
    assert enc.embed(torch.zeros(2, 3, 32, 32)).dtype == torch.float32


@pytest.mark.parametrize("device, count, message", [
    ("cuda", 0, "device=cuda: this machine has no usable CUDA device"),
    ("cuda:1", 0, "device=cuda:1: this machine has no usable CUDA device"),
    ("cuda:2", 2, "device=cuda:2: this machine has 2 CUDA devices (cuda:0 to cuda:1); use one of those"),
    ("cud", 0, "device=cud: not a device torch knows; use device=auto"),
])
def test_a_device_this_machine_has_not_got_is_one_user_error(monkeypatch, device, count, message):
    """Issue 41 item 7: device=cuda without CUDA was a torch error deep in the extraction, printed as a bug."""
    from robustbench_fm.core.devices import check_device
    from robustbench_fm.core.errors import InvalidSetting

    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    with pytest.raises(InvalidSetting) as err:
        check_device(device)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert check_device("cuda") == "cuda" and check_device("cuda:0") == "cuda:0" and check_device("auto") == "auto"


def test_torch_threads_sets_and_restores_the_count():
    import torch

    from robustbench_fm.core.devices import torch_threads

    before = torch.get_num_threads()
    with torch_threads(1) as was:
        assert was == before and torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with torch_threads(0) as was:  # 0: unchanged
        assert was == before and torch.get_num_threads() == before
    try:
        with torch_threads(1):
            raise KeyError("x")
    except KeyError:
        pass
    assert torch.get_num_threads() == before
