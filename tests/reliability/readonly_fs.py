"""A read-only file system under one folder, for tests that run as root (``chmod`` does not stop
root from writing): every call that would create, change or remove something there fails as on a
read-only mount, with ``OSError(EROFS)`` naming the path; reads go through untouched.

In-process: ``install(folder, monkeypatch.setattr)`` (undone after the test). For a CLI run:
``python -c "...; readonly_fs.install(folder); runpy.run_module('robustbench_fm', ...)"``
(:func:`cli_command`)."""
from __future__ import annotations

import builtins
import errno
import io
import os
import sys
from pathlib import Path

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def install(folder, patch=setattr) -> None:
    root = os.path.realpath(folder)

    def inside(path) -> bool:
        if isinstance(path, int):
            return False
        p = os.path.realpath(os.fsdecode(path))
        return p == root or p.startswith(root + os.sep)

    def deny(path):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fsdecode(path))

    real = {name: getattr(os, name) for name in ("open", "mkdir", "rmdir", "unlink", "remove", "rename", "replace",
                                                  "utime", "chmod", "link", "symlink")}
    real_open = builtins.open

    def os_open(path, flags, mode=0o777, *, dir_fd=None):
        if flags & _WRITE_FLAGS and inside(path):
            deny(path)
        return real["open"](path, flags, mode, dir_fd=dir_fd)

    def mkdir(path, mode=0o777, *, dir_fd=None):
        if inside(path):
            if os.path.lexists(path):  # the kernel's order of checks: exists, parent missing, read-only
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), os.fsdecode(path))
            if not os.path.isdir(os.path.dirname(os.path.abspath(os.fsdecode(path)))):
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), os.fsdecode(path))
            deny(path)
        return real["mkdir"](path, mode, dir_fd=dir_fd)

    def one_path(name):
        def call(path, *args, **kwargs):
            if inside(path):
                deny(path)
            return real[name](path, *args, **kwargs)
        return call

    def two_paths(name):
        def call(src, dst, *args, **kwargs):
            for path in (src, dst):
                if inside(path):
                    deny(path)
            return real[name](src, dst, *args, **kwargs)
        return call

    def file_open(file, mode="r", *args, **kwargs):
        if any(c in mode for c in "wax+") and inside(file):
            deny(file)
        return real_open(file, mode, *args, **kwargs)

    patch(os, "open", os_open)
    patch(os, "mkdir", mkdir)
    for name in ("rmdir", "unlink", "remove", "utime", "chmod"):
        patch(os, name, one_path(name))
    for name in ("rename", "replace", "link", "symlink"):
        patch(os, name, two_paths(name))
    patch(builtins, "open", file_open)
    patch(io, "open", file_open)


def cli_command(folder, *args: str) -> list[str]:
    """``python -m robustbench_fm *args`` with ``folder`` read-only (a subprocess argv)."""
    here = str(Path(__file__).resolve().parent)
    code = (f"import sys, runpy; sys.path.insert(0, {here!r}); import readonly_fs; "
            f"readonly_fs.install({str(folder)!r}); sys.argv = ['robustbench_fm', *{list(args)!r}]; "
            "runpy.run_module('robustbench_fm', run_name='__main__', alter_sys=True)")
    return [sys.executable, "-c", code]
