"""Inter-process file locks that survive crashed holders, on an O_EXCL lock file and ``filelock``.

Protocol. The lock is a file: whoever creates ``path`` with ``O_CREAT|O_EXCL`` holds it and writes
``{"pid", "host", "created", "token"}`` into it (fsynced). Exclusive create is atomic on local file
systems and on NFSv3+, so this works between Slurm jobs on different hosts that share a folder.
Waiters poll. The file's mtime is the holder's heartbeat (``refresh()`` touches it). A lock is
*stale* when its holder is on this host and its pid is gone, or (any host) its heartbeat is older
than ``stale_after`` seconds, or the file is still empty/unreadable after ``grace`` seconds (the
holder died between create and write). A stale lock is broken by one waiter at a time (under the
``<path>.break`` mutex, a ``filelock.SoftFileLock``): it re-reads the lock, renames it to a unique
tombstone (``os.rename`` is atomic), checks the tombstone is the file it judged stale (token and
inode; if not, it puts it back), logs a warning naming the old holder, and retries the exclusive
create. Release deletes the file only if it still carries our token; so does ``refresh()`` check it.

Which ``filelock`` class, and for what:

* ``filelock.FileLock`` (``flock``, released by the kernel when its process dies) is not used: on a
  shared folder it only excludes across hosts where the mount forwards locks (NFS without
  ``nolock``/``local_lock``, Lustre with ``-o flock``; BeeGFS keeps them node-local by default),
  silently per host elsewhere, and a kernel lock leaves no record of who holds it.
* ``filelock.SoftFileLock`` (exclusive create, like ours) is the ``<path>.break`` mutex: breakers on
  any host take turns, and filelock recovers a mutex its holder left behind: a dead pid on this host
  (checked against the process start time, so a reused pid is not taken for the holder) at once; a
  malformed one, such as the JSON ``.break`` of an older version of this module, once a waiter has
  seen it unchanged for 2 s; any one, empty included, whose mtime is older than ``_MUTEX_LIFETIME``
  (a breaker that died on another host, or between creating and writing the file).
* It is not the lock file itself. A ``SoftFileLock`` writes its own record (pid, host, start time)
  into its file, with no creation time or token, and takes over a file whose content it cannot parse
  once a waiter has seen it unchanged for 2 s (filelock 4.3.1 took a live holder's JSON lock after
  2.0 s). It would neither see at once that the JSON lock a killed run left is dead (a ``timeout=0``
  run would fail) nor leave alone one a live older version holds. So the lock file keeps our record
  and our rules, which the pieces below need.

What filelock lacks, kept here: the JSON holder record (``LockHolder``, ``read_holder``) that
timeout messages, the extraction's "waiting for pid N on <host>" line and the sweep's ``collect``
use to name a holder, and that lock files already on disk (older versions, killed runs) carry; the
stale-holder check (``FileLock._stale_reason``, ``abandoned``) that tells a waiter, and ``collect``
(a ``running`` job whose lock is abandoned is reported ``interrupted``), a crashed holder from a
live one by the record's pid and host (``psutil`` for the pid) and the file's mtime, at once for a
2-hour-old heartbeat (filelock's ``SoftFileLease`` makes each waiter watch a lease for its whole
duration first); the mtime heartbeat with ``refresh()`` raising ``LockLost``; and the tombstone
break that never deletes a successor's lock.

Guarantees: at most one live holder, as long as a live holder refreshes its heartbeat more often
than ``stale_after`` (default one hour; no refresh needed for shorter holds) and hosts' clocks
roughly agree with the file server's. Limits: ``stale_after`` is the only way to tell that a holder
on *another* host died (a dead pid is only recognised on the same host, and a reused pid looks
alive until the heartbeat expires); a holder that stalls longer than ``stale_after`` without
refreshing can lose its lock (``refresh()`` then raises ``LockLost``); NFSv2 has no atomic O_EXCL.
Not re-entrant; two ``FileLock`` objects on one path in one process exclude each other too.
"""
from __future__ import annotations

import json
import logging
import os
import random
import socket
import time
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import filelock
import psutil

from .errors import UserError

__all__ = ["FileLock", "LockHolder", "LockLost", "LockTimeout", "abandoned", "acquire_waiting", "read_holder",
           "who_holds"]

log = logging.getLogger("robustbench_fm.core.locking")

HOST = socket.gethostname()
# A breaker holds the ``.break`` mutex for a few syscalls; a mutex file older than this was left by a crash.
_MUTEX_LIFETIME = 30.0


class LockTimeout(UserError, TimeoutError):
    """The lock stayed held by another live process for longer than ``timeout``; ``holder`` is
    what the lock file said about that process when we gave up."""

    def __init__(self, message: str, holder: LockHolder | None = None) -> None:
        super().__init__(message)
        self.holder = holder


class LockLost(RuntimeError):
    """Our lock file was broken (judged stale) or replaced by someone else while we held it."""


@dataclass(frozen=True)
class LockHolder:
    """What a lock file says about its holder. ``token`` is None for an empty/unreadable file."""

    path: Path
    pid: int | None
    host: str | None
    created: float | None
    token: str | None
    mtime: float  # the heartbeat
    dev: int
    ino: int
    size: int
    mtime_ns: int

    @property
    def identity(self) -> tuple[Any, ...]:
        """Tells this lock file from a later one at the same path (inode numbers get reused, so
        the token is part of it; an unwritten file has none, so its mtime and size stand in)."""
        if self.token is not None:
            return (self.dev, self.ino, self.token)
        return (self.dev, self.ino, self.mtime_ns, self.size)

    def describe(self, now: float | None = None) -> str:
        now = time.time() if now is None else now
        beat = _fmt_age(now - self.mtime)
        if self.token is None:
            return (f"an unknown process (the lock file is empty or unreadable, "
                    f"last written {beat} ago)")
        age = _fmt_age(now - self.created) if self.created is not None else "unknown"
        return f"pid {self.pid}@{self.host} (age {age}, last heartbeat {beat} ago)"


def _fmt_age(seconds: float) -> str:
    s = max(0.0, seconds)
    if s < 60:
        return f"{s:.1f}s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"


def read_holder(path: str | os.PathLike[str]) -> LockHolder | None:
    """The holder recorded in lock file ``path``; None if there is no such file."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        raw = b""
        while chunk := os.read(fd, 65536):
            raw += chunk
    finally:
        os.close(fd)
    pid = host = created = token = None
    try:
        data = json.loads(raw.decode())
        if isinstance(data, dict) and isinstance(data.get("token"), str):
            token = data["token"]
            pid = int(data["pid"]) if data.get("pid") is not None else None
            host = str(data.get("host")) if data.get("host") is not None else None
            created = float(data["created"]) if data.get("created") is not None else None
    except (ValueError, TypeError, UnicodeDecodeError):
        pid = host = created = token = None
    return LockHolder(path, pid, host, created, token, st.st_mtime, st.st_dev, st.st_ino,
                      st.st_size, st.st_mtime_ns)


def abandoned(path: str | os.PathLike[str], stale_after: float | None = None,
              grace: float = 5.0) -> str | None:
    """Why the lock file ``path`` counts as abandoned by its holder (the rules of
    :class:`FileLock`: a dead pid on this host, an old heartbeat with ``stale_after``, an
    unwritten file after ``grace``), or None: no such file, or its holder may still be alive."""
    holder = read_holder(path)
    if holder is None:
        return None
    return FileLock(path, stale_after=stale_after, grace=grace)._stale_reason(holder, time.time())


def _pid_alive(pid: int) -> bool:
    """Whether process ``pid`` on this host exists (a zombie, killed but not yet reaped by its
    parent, counts as gone). Unsure means alive."""
    if pid <= 0:
        return True  # not a single process
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except (psutil.Error, OSError, ValueError):  # e.g. AccessDenied: it exists, owned by another user
        return True


def _create_exclusive(path: Path, token: str) -> bool:
    """Create ``path`` if absent (atomically) and write our holder record into it, fsynced."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    try:
        record = {"pid": os.getpid(), "host": HOST, "created": time.time(), "token": token}
        data = json.dumps(record).encode()
        while data:
            data = data[os.write(fd, data):]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        try:
            os.unlink(path)
        except OSError:
            pass
        raise
    os.close(fd)
    return True


class FileLock:
    """An exclusive lock on ``path`` (the lock file itself, e.g. ``<entry>.lock``) between
    processes, possibly on different hosts sharing the file system; see the module docstring.

    ``timeout``: None waits forever, a number of seconds raises ``LockTimeout`` (0: try once).
    ``poll``: seconds between tries (jittered). ``stale_after``: a heartbeat (mtime) older than
    this marks the lock as abandoned, whoever holds it (None: never by age); long holders call
    ``refresh()`` more often than that. ``grace``: how long an empty/unreadable lock file is
    assumed to be mid-creation before it counts as abandoned.

    Use as ``with FileLock(p, timeout=60): ...``, or ``acquire()``/``release()``.
    """

    def __init__(self, path: str | os.PathLike[str], timeout: float | None = None,
                 poll: float = 0.2, stale_after: float | None = 3600.0, *,
                 grace: float = 5.0) -> None:
        if timeout is not None and timeout < 0:
            raise ValueError(f"FileLock timeout must be None or >= 0, got {timeout!r}")
        if not poll > 0:
            raise ValueError(f"FileLock poll must be > 0 seconds, got {poll!r}")
        if stale_after is not None and not stale_after > 0:
            raise ValueError(
                f"FileLock stale_after must be None or > 0 seconds, got {stale_after!r}")
        if not grace >= 0:
            raise ValueError(f"FileLock grace must be >= 0 seconds, got {grace!r}")
        self.path = Path(path)
        self.timeout = timeout
        self.poll = poll
        self.stale_after = stale_after
        self.grace = grace
        self._token: str | None = None
        self._owner_pid: int | None = None
        self._mutex: filelock.SoftFileLock | None = None
        self._mutex_pid: int | None = None

    def __repr__(self) -> str:
        state = "held" if self.held else "not held"
        return f"FileLock({str(self.path)!r}, {state})"

    @property
    def held(self) -> bool:
        """Whether this object acquired the lock and has not released it (it does not check the
        file; ``refresh()`` does)."""
        return self._token is not None and self._owner_pid == os.getpid()

    def _break_mutex(self) -> filelock.SoftFileLock:
        """The ``<path>.break`` mutex, one per object and process: a filelock object must not be
        used across fork, and it must persist between tries, since filelock counts how long a
        waiter has seen a malformed mutex file unchanged before it takes it over."""
        if self._mutex is None or self._mutex_pid != os.getpid():
            with warnings.catch_warnings():  # the age-based expiry it warns about is wanted here
                warnings.simplefilter("ignore", filelock.SoftFileLockLifetimeWarning)
                self._mutex = filelock.SoftFileLock(self.path.with_name(self.path.name + ".break"),
                                                    thread_local=False, blocking=False,
                                                    lifetime=_MUTEX_LIFETIME)
            self._mutex_pid = os.getpid()
        return self._mutex

    def _tomb_path(self, path: Path) -> Path:
        return path.with_name(f"{path.name}.stale-{uuid.uuid4().hex}")

    # -- acquire -----------------------------------------------------------------------------
    def acquire(self) -> FileLock:
        if self._token is not None:
            raise RuntimeError(
                f"{self!r} is already held by this object; FileLock is not re-entrant "
                "(release it first, or use one `with` block)")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        deadline = None if self.timeout is None else start + self.timeout
        while True:
            token = uuid.uuid4().hex
            if _create_exclusive(self.path, token):
                mine = read_holder(self.path)
                if mine is not None and mine.token == token:
                    self._token, self._owner_pid = token, os.getpid()
                    return self
                # Our file was broken as 'unreadable' before we finished writing it (a stall longer
                # than `grace`): whoever broke it may hold the lock now, so we don't; try again.
                log.warning("lock %s was taken over while being created; retrying", self.path)
                continue
            holder = read_holder(self.path)
            if holder is None:
                continue  # released just now: try again at once
            reason = self._stale_reason(holder, time.time())
            if reason is not None and self._break_stale():
                continue
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise LockTimeout(self._timeout_message(holder), holder)
            pause = self.poll * random.uniform(0.5, 1.5)
            if deadline is not None:
                pause = min(pause, max(0.0, deadline - now))
            time.sleep(pause)

    def _timeout_message(self, holder: LockHolder) -> str:
        gone = f"if that process is gone, delete {self.path} and retry"
        if not self.timeout:  # timeout=0: the caller does not wait (a run folder, a cache entry in use)
            return f"lock {self.path} is held by {holder.describe()}; wait for that run to finish, or, {gone}"
        return (f"Timed out after {self.timeout:g}s waiting for lock {self.path}: it is held by "
                f"{holder.describe()}; wait for that run to finish (FileLock(timeout=<seconds>) waits longer), "
                f"or, {gone}")

    def _stale_reason(self, h: LockHolder, now: float) -> str | None:
        """Why the lock file ``h`` is abandoned, or None if its holder may still be working."""
        beat = now - h.mtime
        if h.token is None:
            if beat > self.grace:
                return f"its lock file is empty or unreadable and {_fmt_age(beat)} old"
            return None
        if h.host == HOST and h.pid is not None and not _pid_alive(h.pid):
            return f"process {h.pid} no longer exists on this host"
        if self.stale_after is not None and beat > self.stale_after:
            return f"no heartbeat for {_fmt_age(beat)} (stale_after={self.stale_after:g}s)"
        return None

    def _break_stale(self) -> bool:
        """Break the lock if it is (still) stale, one breaker at a time. True: try to create
        again now (broken, or already gone); False: wait."""
        mutex = self._break_mutex()
        try:
            mutex.acquire()
        except filelock.Timeout:  # another waiter is breaking it
            return False
        try:
            # Under the mutex no other breaker can touch the lock file, and nobody can create one
            # while it exists, so the file we read now is the file we rename (checked anyway).
            h = read_holder(self.path)
            if h is None:
                return True
            now = time.time()
            reason = self._stale_reason(h, now)
            if reason is None:
                return False
            if not self._rename_away(self.path, h, None):
                return True  # vanished or changed under us: look again at once
            log.warning("Broke stale lock %s held by %s: %s", self.path, h.describe(now), reason)
            return True
        finally:
            mutex.release()

    def _rename_away(self, path: Path, expected: LockHolder, what: str | None) -> bool:
        """Move ``path`` to a unique tombstone and delete it, if it is the file ``expected``
        describes; if it turns out to be another (newer) file, put that one back.
        True if removed."""
        tomb = self._tomb_path(path)
        try:
            os.rename(path, tomb)
        except FileNotFoundError:
            return False
        got = read_holder(tomb)
        if got is None or got.identity != expected.identity:
            self._put_back(tomb, path)
            return False
        if what is not None:
            log.warning("Removed %s %s left by %s", what, path, expected.describe())
        try:
            os.unlink(tomb)
        except OSError:
            pass
        return True

    @staticmethod
    def _put_back(tomb: Path, path: Path) -> None:
        try:
            os.link(tomb, path)  # atomic, and never replaces a file created meanwhile
        except FileExistsError:
            log.error("Lock %s changed while a stale copy was being removed; the holder of the "
                      "moved copy will find its lock lost on refresh/release", path)
        except OSError:  # no hard links on this file system
            if not path.exists():
                try:
                    os.rename(tomb, path)
                    return
                except OSError:
                    pass
        try:
            os.unlink(tomb)
        except OSError:
            pass

    # -- hold / release ------------------------------------------------------------------------
    def refresh(self) -> None:
        """Heartbeat: touch the lock file's mtime so waiters don't take it as abandoned. Raises
        ``LockLost`` if the file is gone or no longer ours."""
        if not self.held:
            raise RuntimeError(f"{self!r}: refresh() needs the lock to be held")
        h = read_holder(self.path)
        if h is None or h.token != self._token:
            who = "gone" if h is None else f"now held by {h.describe()}"
            raise LockLost(f"Lost lock {self.path}: the file is {who} (it was judged stale: "
                           f"refresh() more often than stale_after={self.stale_after}s)")
        os.utime(self.path)

    def release(self) -> None:
        """Delete the lock file if it is still ours; a no-op if this object does not hold it."""
        token, owner = self._token, self._owner_pid
        self._token = self._owner_pid = None
        if token is None:
            return
        if owner != os.getpid():  # a forked child must not release its parent's lock
            return
        h = read_holder(self.path)
        if h is None:
            log.warning("Lock %s was already gone at release (broken as stale while held?)",
                        self.path)
        elif h.token != token:
            log.warning("Lock %s is now held by %s; leaving it in place", self.path, h.describe())
        else:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass

    def __enter__(self) -> FileLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def who_holds(busy: LockTimeout) -> str:
    """``pid N on HOST`` of the holder a :class:`LockTimeout` names, else ``another process``."""
    holder = busy.holder
    return f"pid {holder.pid} on {holder.host}" if holder is not None and holder.pid is not None \
        else "another process"


def acquire_waiting(path: str | os.PathLike[str], doing: str, logger: logging.Logger = log) -> FileLock:
    """The lock at ``path``, acquired at once or, while another process holds it, after logging
    ``waiting for <holder> to finish <doing> ...`` and waiting for it (a cache entry, a store)."""
    try:
        return FileLock(path, timeout=0).acquire()
    except LockTimeout as busy:
        logger.info("waiting for %s to finish %s ...", who_holds(busy), doing)
        return FileLock(path, timeout=None).acquire()
