"""Watching a real CLI process from a test: its process tree, its semaphores, its stderr.

Everything comes from /proc (Linux), so the tests see what the operating system sees: no hook
inside the code under test.
"""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

from eval_testdata import PYTHON

SHM = Path("/dev/shm")


def _stat_after_comm(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after "pid (comm)" (state, ppid, pgrp, session, ...), or None
    if it is gone; comm may hold spaces and parentheses, hence the split at the last ")"."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def parent_of(pid: int) -> int | None:
    fields = _stat_after_comm(pid)
    return None if fields is None else int(fields[1])


def state_of(pid: int) -> str | None:
    """The process state letter (R, S, Z, ...) or None if it is gone."""
    fields = _stat_after_comm(pid)
    return None if fields is None else fields[0]


def resident_mb(pid: int) -> float:
    """The resident memory of ``pid`` in MB (VmRSS of /proc/PID/status; 0 if it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0  # a zombie has no VmRSS line


def children_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and parent_of(int(entry)) == pid:
            found.append(int(entry))
    return found


def descendants_of(pid: int) -> dict[int, int]:
    """Every living descendant of ``pid`` -> its depth (1: child, 2: grandchild, ...)."""
    found, frontier, depth = {}, [pid], 0
    while frontier:
        depth += 1
        frontier = [c for p in frontier for c in children_of(p) if c not in found]
        found.update({c: depth for c in frontier})
    return found


def ignores_signal(pid: int, signum: int) -> bool:
    """Whether ``pid`` ignores ``signum`` (the SigIgn mask of /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    raise AssertionError(f"no SigIgn line for {pid}")


def semaphores_of(pid: int) -> set[int]:
    """The inodes of the POSIX named semaphores (``/dev/shm/sem.*``) mapped by ``pid``.

    Inodes, not names: glibc makes a named semaphore as a temporary ``sem.XXXXXX`` file, links it
    to its name (``sem.mp-...``) and unlinks the temporary one, so /proc/PID/maps shows the
    temporary name, "(deleted)", for a semaphore that is still there under its real name.
    """
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return set()
    return {int(line.split()[4]) for line in maps.splitlines() if "/dev/shm/sem." in line}


def semaphores_left(inodes: set[int]) -> set[str]:
    """The names in /dev/shm of those of ``inodes`` that still exist."""
    left = set()
    for path in SHM.glob("sem.*"):
        try:
            if path.stat().st_ino in inodes:
                left.add(path.name)
        except OSError:  # unlinked meanwhile
            pass
    return left


def session_of(pid: int) -> int | None:
    """The session id of ``pid``, or None if it is gone."""
    fields = _stat_after_comm(pid)
    return None if fields is None else int(fields[3])


class SemaphoreWatch:
    """The inode of every ``/dev/shm/sem.*`` mapped by any process of one session, sampled until
    ``stop()``.

    The CLI runs in a session of its own, so this sees its forkserver, workers and resource
    tracker, and nothing of the other tests running beside it on a shared machine (their
    semaphores, leaked or not, are not ours to judge).
    """

    def __init__(self, session: int, poll: float = 0.02):
        self.session, self.poll, self.seen = session, poll, set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _members(self) -> list[int]:
        return [int(e) for e in os.listdir("/proc") if e.isdigit() and session_of(int(e)) == self.session]

    def _watch(self) -> None:
        while not self._stop.is_set():
            for pid in self._members():
                self.seen |= semaphores_of(pid)
            time.sleep(self.poll)

    def stop(self) -> set[int]:
        """Stop watching; the inodes seen, of which none may still exist once the session is gone
        (``semaphores_left``)."""
        self._stop.set()
        self._thread.join(5)
        return set(self.seen)


def wait_until_gone(pids, timeout: float = 10.0) -> list[int]:
    """Wait for ``pids`` to exit (a zombie counts as gone); return those still alive."""
    deadline = time.monotonic() + timeout
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if state_of(p) not in (None, "Z")]
        time.sleep(0.05)
    return alive


def _as_a_foreground_job() -> None:
    # a shell starts background jobs (`cmd &`, e.g. a CI runner's) with SIGINT ignored, and Python
    # keeps an ignored SIGINT; a command typed in a terminal gets the default disposition
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class RunningCli:
    """``python -m nnunet_dro ARGS`` in its own session, as a terminal would start it (SIGINT at
    its default), stderr collected while it runs."""

    def __init__(self, *args, env=None):
        self.process = subprocess.Popen(
            [str(PYTHON), "-m", "nnunet_dro", *map(str, args)], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, env=env, start_new_session=True, preexec_fn=_as_a_foreground_job)
        self._stderr = bytearray()
        self._stdout = bytearray()
        self._threads = [threading.Thread(target=self._collect, args=(stream, buffer), daemon=True)
                         for stream, buffer in ((self.process.stderr, self._stderr),
                                                (self.process.stdout, self._stdout))]
        for thread in self._threads:
            thread.start()

    @staticmethod
    def _collect(stream, buffer: bytearray) -> None:
        for chunk in iter(lambda: stream.read1(4096), b""):
            buffer.extend(chunk)

    @property
    def stderr(self) -> str:
        return self._stderr.decode(errors="replace")

    @property
    def stdout(self) -> str:
        return self._stdout.decode(errors="replace")

    def wait_for(self, predicate, timeout: float = 60.0, poll: float = 0.02):
        """Poll ``predicate(self)`` until it returns something truthy; fail if the CLI exits first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate(self)
            if value:
                return value
            if self.process.poll() is not None:
                raise AssertionError(f"the CLI exited ({self.process.returncode}) first:\n{self.stderr}")
            time.sleep(poll)
        raise AssertionError(f"timed out waiting; stderr so far:\n{self.stderr}")

    def finish(self, timeout: float = 60.0) -> int:
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
            raise AssertionError(f"the CLI did not exit within {timeout} s:\n{self.stderr}")
        for thread in self._threads:
            thread.join(5)
        return code
