"""Atomic file writes: a reader sees the old file or the whole new one, never half of one."""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable, Iterator


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: str | Path, write: Callable[[BinaryIO], object]) -> Path:
    """Call ``write(fileobj)`` on a temp file beside ``path`` (``.<name>.tmp-<pid>-*``), fsync
    it, ``os.replace`` it onto ``path`` and fsync the folder. On any error the temp file goes."""
    with replace_atomic(path) as tmp:
        with open(tmp, "wb") as f:
            write(f)
    return Path(path)


def write_text_atomic(path: str | Path, text: str) -> Path:
    return write_atomic(path, lambda f: f.write(text.encode()))


@contextlib.contextmanager
def replace_atomic(path: str | Path, suffix: str = "") -> Iterator[Path]:
    """A temp file path beside ``path`` (``.<name>.tmp-<pid>-*<suffix>``) for a writer that needs a
    name (a memory map); when the block ends it is fsynced and ``os.replace``d onto ``path`` and
    the folder fsynced. On any error the temp file goes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-{os.getpid()}-", suffix=suffix, dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(path.parent)
