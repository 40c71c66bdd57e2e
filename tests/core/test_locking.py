"""FileLock: mutual exclusion between real processes, stale-lock recovery, safe release."""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import filelock
import pytest

from robustbench_fm.core import locking
from robustbench_fm.core.errors import UserError
from robustbench_fm.core.locking import HOST, FileLock, LockLost, LockTimeout, read_holder

REPO = Path(__file__).resolve().parents[2]

# A worker process: `count` does N read-sleep-write increments of a counter file (under the lock
# or not), after a start barrier so that the workers really overlap; inside the lock it also
# O_EXCL-creates an "inside" marker, so any two holders at once are recorded. `hold` takes the
# lock and sleeps until killed.
WORKER = r"""
import os, sys, time
from pathlib import Path
from robustbench_fm.core.locking import FileLock
mode, lock, counter, n, pause, ready, go = sys.argv[1:]
n, pause = int(n), float(pause)
if mode == "hold":
    FileLock(lock, timeout=30).acquire()
    Path(ready).touch()
    time.sleep(600)
    sys.exit(0)
Path(ready).touch()
while not os.path.exists(go):
    time.sleep(0.002)

def bump():
    value = int(Path(counter).read_text())
    time.sleep(pause)
    tmp = f"{counter}.{os.getpid()}.tmp"
    Path(tmp).write_text(str(value + 1))
    os.replace(tmp, counter)

for _ in range(n):
    if mode == "locked":
        with FileLock(lock, timeout=60, poll=0.005):
            inside = counter + ".inside"
            try:
                os.close(os.open(inside, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                with open(counter + ".overlaps", "a") as f:
                    f.write(f"{os.getpid()}\n")
                inside = None
            bump()
            if inside:
                os.unlink(inside)
    else:
        bump()
"""


def _spawn(mode: str, lock: Path, counter: Path, n: int, pause: float, ready: Path, go: Path):
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    args = [sys.executable, "-c", WORKER, mode, str(lock), str(counter), str(n), str(pause),
            str(ready), str(go)]
    return subprocess.Popen(args, cwd=REPO, env=env)


def _wait_for(path: Path, procs, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not path.exists():
        for p in procs:
            assert p.poll() is None, f"worker exited early with {p.returncode}"
        assert time.monotonic() < end, f"worker never wrote {path}"
        time.sleep(0.01)


def _run_counters(tmp: Path, mode: str, workers: int, n: int, pause: float = 0.005) -> Path:
    counter, lock, go = tmp / "counter", tmp / "counter.lock", tmp / "go"
    counter.write_text("0")
    readies = [tmp / f"ready{i}" for i in range(workers)]
    procs = [_spawn(mode, lock, counter, n, pause, r, go) for r in readies]
    try:
        for r in readies:
            _wait_for(r, procs)
        go.touch()  # all workers are past their imports: release them together
        for p in procs:
            assert p.wait(timeout=60) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return counter


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", ""])
    p.wait()  # exited and reaped
    return p.pid


def _write_lock(path: Path, *, pid: int, host: str, token: str, age: float = 0.0) -> None:
    created = time.time() - age
    path.write_text(json.dumps({"pid": pid, "host": host, "created": created, "token": token}))
    os.utime(path, (created, created))


# -- mutual exclusion between processes ----------------------------------------------------------

def test_two_processes_never_lose_an_update_under_the_lock(tmp_path):
    n = 15
    counter = _run_counters(tmp_path, "locked", workers=2, n=n)
    assert int(counter.read_text()) == 2 * n
    assert not (tmp_path / "counter.overlaps").exists()
    assert not (tmp_path / "counter.lock").exists()  # released
    assert not list(tmp_path.glob("counter.lock.*"))  # no tombstone or break-mutex left behind


def test_same_pattern_without_the_lock_loses_updates(tmp_path):
    # Control: two processes looping read-sleep-write side by side always overlap, so some
    # increments are lost; this shows the test above measures the lock and not luck.
    n = 15
    counter = _run_counters(tmp_path, "unlocked", workers=2, n=n, pause=0.01)
    assert int(counter.read_text()) < 2 * n


def test_racing_waiters_break_a_stale_lock_only_once(tmp_path):
    # Smoke test: three processes find the same abandoned lock at once and must still take turns.
    # (The exact bad interleaving is forced deterministically in the next test.)
    _write_lock(tmp_path / "counter.lock", pid=_dead_pid(), host=HOST, token="dead")
    n = 3
    counter = _run_counters(tmp_path, "locked", workers=3, n=n, pause=0.02)
    assert int(counter.read_text()) == 3 * n
    assert not (tmp_path / "counter.overlaps").exists()
    assert not list(tmp_path.glob("counter.lock*"))


def test_a_waiter_that_judged_a_lock_stale_does_not_break_its_successor(tmp_path, monkeypatch):
    # B sees the abandoned lock L1 and judges it stale; before B acts, A breaks L1 and takes the
    # lock (L2). B must now wait for A, not break A's fresh lock and hold it alongside A.
    lock = tmp_path / "entry.lock"
    _write_lock(lock, pid=_dead_pid(), host=HOST, token="dead")
    a = FileLock(lock, timeout=1, poll=0.02)
    b = FileLock(lock, timeout=0.3, poll=0.02)
    judge = FileLock._stale_reason

    def b_is_overtaken(self, holder, now):
        reason = judge(self, holder, now)
        if self is b and reason is not None and not a.held:
            a.acquire()
        return reason

    monkeypatch.setattr(FileLock, "_stale_reason", b_is_overtaken)
    with pytest.raises(LockTimeout):
        b.acquire()
    assert a.held and read_holder(lock).token == a._token
    a.release()
    assert not lock.exists()


def test_breaking_puts_back_a_file_that_is_not_the_one_judged_stale(tmp_path):
    # Defence in depth: if the lock file changed between the look and the rename, the renamed
    # file is put back in place instead of being deleted.
    lock = tmp_path / "entry.lock"
    _write_lock(lock, pid=_dead_pid(), host=HOST, token="dead")
    judged = read_holder(lock)
    lock.unlink()
    _write_lock(lock, pid=os.getpid(), host=HOST, token="fresh")
    assert FileLock(lock)._rename_away(lock, judged, None) is False
    assert read_holder(lock).token == "fresh"
    assert [p.name for p in tmp_path.iterdir()] == ["entry.lock"]  # no tombstone left


# -- stale-lock recovery ---------------------------------------------------------------------------

def test_lock_of_a_sigkilled_holder_is_recovered_with_a_warning(tmp_path, caplog):
    lock, ready = tmp_path / "entry.lock", tmp_path / "ready"
    holder = _spawn("hold", lock, tmp_path / "unused", 0, 0.0, ready, tmp_path / "go")
    try:
        _wait_for(ready, [holder])
        # While it is alive, a waiter times out with a one-line message naming the holder.
        with pytest.raises(LockTimeout) as err:
            FileLock(lock, timeout=0.3, poll=0.02).acquire()
        msg = str(err.value)
        assert "\n" not in msg and str(lock) in msg and f"pid {holder.pid}@{HOST}" in msg
        assert "delete" in msg
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=10)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    assert read_holder(lock).pid == holder.pid  # the killed process left its lock behind
    with caplog.at_level(logging.WARNING, logger="robustbench_fm.core.locking"):
        t0 = time.monotonic()
        with FileLock(lock, timeout=5, poll=0.02) as fl:
            assert read_holder(lock).token == fl._token
        assert time.monotonic() - t0 < 2  # no waiting for stale_after (an hour)
    assert f"pid {holder.pid}@{HOST}" in caplog.text and "no longer exists" in caplog.text
    assert not lock.exists()


def test_old_heartbeat_from_another_host_is_broken(tmp_path, caplog):
    lock = tmp_path / "entry.lock"
    # A live-looking pid on another host: only the heartbeat can tell it is gone.
    _write_lock(lock, pid=os.getpid(), host="node-elsewhere-42", token="theirs", age=7200)
    with caplog.at_level(logging.WARNING, logger="robustbench_fm.core.locking"):
        with FileLock(lock, timeout=2, poll=0.02, stale_after=3600) as fl:
            assert read_holder(lock).token == fl._token
    assert f"pid {os.getpid()}@node-elsewhere-42" in caplog.text
    assert "no heartbeat" in caplog.text


def test_fresh_lock_from_another_host_is_waited_for_until_stale_after(tmp_path, caplog):
    lock = tmp_path / "entry.lock"
    _write_lock(lock, pid=os.getpid(), host="node-elsewhere-42", token="theirs")
    with pytest.raises(LockTimeout) as err:
        FileLock(lock, timeout=0.2, poll=0.02, stale_after=3600).acquire()
    assert isinstance(err.value, UserError) and isinstance(err.value, TimeoutError)
    msg = str(err.value)
    assert "\n" not in msg and f"pid {os.getpid()}@node-elsewhere-42" in msg and str(lock) in msg
    assert read_holder(lock).token == "theirs"  # untouched
    # With a short stale_after the same lock is broken once its heartbeat is that old, not before.
    os.utime(lock)
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="robustbench_fm.core.locking"):
        with FileLock(lock, timeout=5, poll=0.02, stale_after=0.6):
            waited = time.monotonic() - t0
    assert 0.4 < waited < 3
    assert "node-elsewhere-42" in caplog.text


def test_fresh_lock_from_a_live_local_process_is_never_broken(tmp_path):
    lock = tmp_path / "entry.lock"
    _write_lock(lock, pid=os.getpid(), host=HOST, token="theirs", age=10)
    with pytest.raises(LockTimeout, match=f"pid {os.getpid()}@"):
        FileLock(lock, timeout=0.3, poll=0.02, stale_after=3600).acquire()
    assert read_holder(lock).token == "theirs"


def test_empty_lock_file_is_waited_for_within_grace_then_broken(tmp_path, caplog):
    lock = tmp_path / "entry.lock"
    lock.write_bytes(b"")  # a holder that died between create and write, or is still writing
    with pytest.raises(LockTimeout, match="empty or unreadable"):
        FileLock(lock, timeout=0.2, poll=0.02, grace=5).acquire()
    assert lock.exists()
    old = time.time() - 10
    os.utime(lock, (old, old))
    with caplog.at_level(logging.WARNING, logger="robustbench_fm.core.locking"):
        with FileLock(lock, timeout=2, poll=0.02, grace=5) as fl:
            assert read_holder(lock).token == fl._token
    assert "Broke stale lock" in caplog.text


def test_break_mutex_left_by_a_crashed_breaker_does_not_block_recovery(tmp_path):
    lock = tmp_path / "entry.lock"
    _write_lock(lock, pid=_dead_pid(), host=HOST, token="dead")
    _write_lock(tmp_path / "entry.lock.break", pid=_dead_pid(), host=HOST, token="dead-breaker")
    with FileLock(lock, timeout=3, poll=0.02):
        pass
    assert not list(tmp_path.iterdir())



# -- the break mutex (a filelock.SoftFileLock) --------------------------------------------------

def test_a_live_breaker_holding_the_mutex_makes_others_wait(tmp_path):
    # While another breaker holds ``<lock>.break`` (the same filelock class, as any peer would),
    # a waiter must not touch the stale lock: it times out and the dead holder's file is intact.
    lock = tmp_path / "entry.lock"
    _write_lock(lock, pid=_dead_pid(), host=HOST, token="dead")
    peer = filelock.SoftFileLock(tmp_path / "entry.lock.break", thread_local=False)
    peer.acquire(timeout=0)
    try:
        with pytest.raises(LockTimeout, match="no longer exists|pid"):
            FileLock(lock, timeout=0.3, poll=0.02).acquire()
        assert read_holder(lock).token == "dead"
    finally:
        peer.release()
    with FileLock(lock, timeout=1, poll=0.02) as fl:  # the mutex is free: the break goes ahead
        assert read_holder(lock).token == fl._token
    assert not list(tmp_path.iterdir())


def test_mutex_of_a_sigkilled_breaker_is_recovered_at_once(tmp_path):
    # A breaker killed inside the mutex leaves filelock's marker (its pid, host, start time);
    # filelock sees the pid is gone on this host and takes the mutex over without waiting.
    lock, breaker = tmp_path / "entry.lock", tmp_path / "entry.lock.break"
    _write_lock(lock, pid=_dead_pid(), host=HOST, token="dead")
    code = (f"import filelock, time; mutex = filelock.SoftFileLock({str(breaker)!r}); mutex.acquire(); "
            "print('ready', flush=True); time.sleep(600)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
    assert breaker.read_text().split("\n")[0] == str(child.pid)  # left behind, naming the dead pid
    t0 = time.monotonic()
    with FileLock(lock, timeout=1.5, poll=0.02):
        assert time.monotonic() - t0 < 1.0  # not the 2 s a malformed marker waits, nor the lifetime
    assert not list(tmp_path.iterdir())


def test_unwritten_mutex_blocks_until_it_is_older_than_the_mutex_lifetime(tmp_path):
    # An empty ``.break`` (a breaker that died between create and write, maybe on another host):
    # a fresh one is a breaker mid-creation and is respected; one older than the mutex lifetime
    # (30 s by its mtime, whatever its content) is taken over at once.
    lock, breaker = tmp_path / "entry.lock", tmp_path / "entry.lock.break"
    _write_lock(lock, pid=_dead_pid(), host=HOST, token="dead")
    breaker.write_bytes(b"")
    with pytest.raises(LockTimeout):
        FileLock(lock, timeout=0.3, poll=0.02).acquire()
    assert read_holder(lock).token == "dead" and breaker.exists()
    old = time.time() - (locking._MUTEX_LIFETIME + 5)
    os.utime(breaker, (old, old))
    t0 = time.monotonic()
    with FileLock(lock, timeout=1.5, poll=0.02):
        assert time.monotonic() - t0 < 1.0
    assert not list(tmp_path.iterdir())


def test_pid_liveness_counts_a_zombie_as_gone():
    assert locking._pid_alive(os.getpid()) is True
    assert locking._pid_alive(0) is True and locking._pid_alive(-1) is True  # not one process: unsure
    child = subprocess.Popen([sys.executable, "-c", ""])
    try:
        end = time.monotonic() + 30
        while locking.psutil.Process(child.pid).status() != locking.psutil.STATUS_ZOMBIE:
            assert time.monotonic() < end
            time.sleep(0.01)
        assert locking._pid_alive(child.pid) is False  # exited, not yet reaped by us
    finally:
        child.wait()
    assert locking._pid_alive(child.pid) is False  # reaped

# -- holding and releasing -----------------------------------------------------------------------

def test_release_never_deletes_a_lock_that_is_no_longer_ours(tmp_path, caplog):
    lock = tmp_path / "entry.lock"
    fl = FileLock(lock, timeout=1)
    fl.acquire()
    # Another owner took over the path (e.g. broke our lock as stale) with its own token.
    tmp = tmp_path / "other.tmp"
    _write_lock(tmp, pid=os.getpid(), host="node-elsewhere-42", token="someone-else")
    os.replace(tmp, lock)
    with pytest.raises(LockLost):
        fl.refresh()
    with caplog.at_level(logging.WARNING, logger="robustbench_fm.core.locking"):
        fl.release()
    assert read_holder(lock).token == "someone-else"
    assert "leaving it in place" in caplog.text
    assert not fl.held


def test_refresh_updates_the_heartbeat(tmp_path):
    lock = tmp_path / "entry.lock"
    with FileLock(lock, timeout=1) as fl:
        old = time.time() - 1000
        os.utime(lock, (old, old))
        fl.refresh()
        assert abs(os.stat(lock).st_mtime - time.time()) < 5
        assert read_holder(lock).token == fl._token


def test_release_on_exception_and_no_reentry(tmp_path):
    lock = tmp_path / "sub" / "entry.lock"  # parent folder is created
    fl = FileLock(lock, timeout=1)
    with pytest.raises(ValueError, match="boom"), fl:
        assert lock.exists()
        with pytest.raises(RuntimeError, match="not re-entrant"):
            fl.acquire()
        raise ValueError("boom")
    assert not lock.exists() and not fl.held
    with fl:  # usable again after release
        # A second lock object on the same path in the same process is excluded too.
        with pytest.raises(LockTimeout):
            FileLock(lock, timeout=0.1, poll=0.02).acquire()
    assert not lock.exists()


def test_bad_arguments_are_rejected(tmp_path):
    with pytest.raises(ValueError):
        FileLock(tmp_path / "l", poll=0)
    with pytest.raises(ValueError):
        FileLock(tmp_path / "l", timeout=-1)
    with pytest.raises(ValueError):
        FileLock(tmp_path / "l", stale_after=0)
