"""Local and random weights shared by the loaders: ``random:seed=<s>`` draws (:func:`seeded`),
``file:sha256:<hex16>`` ids, checkpoint picking in a folder and strict state-dict loading."""
from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path
from typing import Iterable

import torch

from ...core.errors import InvalidSetting, MissingInput, UserError
from ..spec import EncoderSpec


class CheckpointMismatch(UserError, RuntimeError):
    """A checkpoint (``encoder.weights``, or the file an entry downloads) does not fit the entry's
    architecture: one line naming the file, the first keys or tensors that disagree and the fix."""

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pth", ".pt", ".ckpt")


@contextlib.contextmanager
def seeded(seed: int):
    """Draw random weights from ``seed`` without touching the caller's global RNG state.

    The draw runs under ``torch.random.fork_rng()`` + ``torch.manual_seed(seed)`` on the CPU, so
    the same seed gives bit-identical weights on any machine.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        yield


def _weight_files(folder: Path) -> list[Path]:
    return sorted((p for p in folder.iterdir() if p.is_file() and p.suffix in WEIGHT_SUFFIXES),
                  key=lambda p: p.name)


def _stream(h, path: Path, chunk: int = 1 << 20) -> None:
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)


def file_weights_id(weights: str | Path) -> str:
    """``file:sha256:<hex16>`` of a checkpoint file, or of a folder's weight files.

    A folder hashes its weight files sorted by name, each preceded by its name.
    """
    p = Path(weights)
    h = hashlib.sha256()
    if p.is_dir():
        files = _weight_files(p)
        if not files:
            raise MissingInput(f"weights folder '{p}' holds no weight file ({', '.join(WEIGHT_SUFFIXES)})")
        for f in files:
            h.update(f.name.encode() + b"\0")
            _stream(h, f)
    else:
        _stream(h, p)
    return f"file:sha256:{h.hexdigest()[:16]}"


def pick_checkpoint(folder: Path, preferred: Iterable[str]) -> Path:
    """The checkpoint in ``folder``: the first ``preferred`` name present, else its only weight file."""
    files = _weight_files(folder)
    by_name = {f.name: f for f in files}
    for name in preferred:
        if name in by_name:
            return by_name[name]
    if len(files) == 1:
        return files[0]
    if not files:
        raise MissingInput(f"weights folder '{folder}' holds no weight file ({', '.join(WEIGHT_SUFFIXES)})")
    raise InvalidSetting(f"weights folder '{folder}' holds several weight files "
                         f"({', '.join(f.name for f in files)}); pass the checkpoint file itself")


def load_strict(spec: EncoderSpec, module: torch.nn.Module, sd: dict, source: Path) -> None:
    """Load ``sd`` into ``module``, failing when any key is missing or unexpected."""
    missing, unexpected = module.load_state_dict(sd, strict=False)
    if missing or unexpected:
        raise CheckpointMismatch(
            f"encoder '{spec.name}': checkpoint '{source}' does not fit the architecture "
            f"'{spec.hub_id}': {len(missing)} missing keys (e.g. {missing[:3]}), "
            f"{len(unexpected)} unexpected keys (e.g. {unexpected[:3]}); point encoder.weights at a checkpoint "
            "of that architecture")
