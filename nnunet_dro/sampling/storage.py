"""Where the sampler's state lives: private memory, or a shared-memory block other processes map.

The block holds a small header and three arrays of ``n`` 8-byte values each, so the state is
24 bytes per volume whatever ``n`` is:

* ``losses``  float64  the stale loss of every volume (the sampler's state proper)
* ``tree``    float64  internal nodes of the sum tree over ``exp(beta * (loss - centre))``
* ``counts``  int64    how many fresh losses each volume has received (times drawn and used)

Why shared memory: nnU-Net draws training cases inside data-augmentation worker processes that
each hold a *copy* of the data loader. Only state that the workers map (not copy) lets their
draws follow the losses the main process writes. A forked worker inherits the mapping; a spawned
one re-attaches by name when the sampler is unpickled.

Only the process that created the block (the owner) unlinks it: in :meth:`SamplerStorage.close`,
or, if training dies first, in a finaliser at interpreter exit, and Python's resource tracker
removes it when the owner alone is killed. Blocks are named ``nnunet_dro_<owner pid>_<random>``
(see :data:`SEGMENT_PREFIX`), so that when the owner *and* its resource tracker die together
(a process-group kill, a cgroup out-of-memory kill, a scheduler's cancel) the orphan can still be
recognised: :func:`remove_orphan_segments` deletes every block whose owner process is gone. It runs
whenever a shared sampler is created, and as ``nnunet_dro cleanup-shm``.
"""
from __future__ import annotations

import os
import re
import secrets
import weakref
from multiprocessing import shared_memory
from pathlib import Path
from typing import List

import numpy as np

# Header slots (int64 view and float64 view of the same 8-byte cells).
SEQUENCE = 0      # seqlock counter: odd while the owner writes
CENTRE = 1        # float64: reference c of the exponent exp(beta * (L - c))
NUM_SKIPPED = 2   # int64: non-finite losses refused so far
NUM_UPDATES = 3   # int64: update() calls applied
WARMUP = 4        # int64: 1 while the uniform warm-up pass is filling the stale losses
BETA = 5          # float64: the inverse temperature in force (adaptive schemes change it)
CEILING = 6       # float64: losses above it count as it in p (inf: none; capped schemes set it)
TRIM_ABOVE = 7    # float64: losses above it count as TRIM_TO in p (inf: none; outlier-trimming schemes set it)
TRIM_TO = 8       # float64: the loss a trimmed case counts as (its weight is then the uniform one)
HEADER_SLOTS = 10

#: Every shared block of ours is named ``nnunet_dro_<owner pid>_<8 hex digits>``.
SEGMENT_PREFIX = "nnunet_dro_"
_SEGMENT_NAME = re.compile(rf"^{SEGMENT_PREFIX}(\d+)_[0-9a-f]{{8}}$")
#: Where POSIX shared memory appears as files (Linux); elsewhere orphans cannot be listed.
SHM_DIR = Path("/dev/shm")


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by another user
        return True
    return True


def orphan_segments(shm_dir: Path = SHM_DIR) -> List[Path]:
    """Our shared blocks whose owner process no longer exists (empty where ``shm_dir`` is absent).

    A block whose owner's pid has since been reused by another process is kept until that
    process ends too (pids cannot tell the two apart).
    """
    if not shm_dir.is_dir():
        return []
    orphans = []
    for path in shm_dir.glob(f"{SEGMENT_PREFIX}*"):
        match = _SEGMENT_NAME.match(path.name)
        if match and not _process_exists(int(match.group(1))):
            orphans.append(path)
    return sorted(orphans)


def remove_orphan_segments(shm_dir: Path = SHM_DIR) -> List[Path]:
    """Delete our shared blocks whose owner process is gone; returns what was removed."""
    removed = []
    for path in orphan_segments(shm_dir):
        try:
            path.unlink()
            removed.append(path)
        except FileNotFoundError:  # removed concurrently
            pass
    return removed


class _SharedMemory(shared_memory.SharedMemory):
    """``SharedMemory`` that stays quiet when collected while numpy views of it are alive.

    The standard class calls ``close()`` in ``__del__``; at interpreter exit the sampler's views
    may still exist, and ``close()`` then raises ``BufferError`` ("cannot close exported pointers
    exist"), which Python prints as an ignored exception. The mapping dies with the process anyway.
    """

    def __del__(self):
        try:
            self.close()
        except BufferError:
            pass


def _release(shm: shared_memory.SharedMemory, owner_pid: int) -> None:
    """Finaliser: unmap, and unlink if this is the owner process (forked copies never unlink)."""
    try:
        shm.close()
    except BufferError:  # numpy views still alive at interpreter exit; the mapping dies anyway
        pass
    if os.getpid() == owner_pid:
        try:
            shm.unlink()
        except FileNotFoundError:
            pass


def _create_segment(nbytes: int) -> _SharedMemory:
    for _ in range(8):
        try:
            return _SharedMemory(name=f"{SEGMENT_PREFIX}{os.getpid()}_{secrets.token_hex(4)}", create=True,
                                 size=nbytes)
        except FileExistsError:  # 32 random bits collided: draw another name
            continue
    raise FileExistsError("could not find a free shared-memory name for the sampler state")


class SamplerStorage:
    """Header + ``losses`` + ``tree`` + ``counts`` in one buffer, private or shared.

    >>> s = SamplerStorage(4, shared=True)
    >>> s.losses[:] = 1.0
    >>> t = SamplerStorage.attach(s.name, 4)   # what a spawned worker does
    >>> float(t.losses[0])
    1.0
    >>> t.close(); s.close()
    """

    def __init__(self, num_cases: int, shared: bool = False, *, _attach_name: str | None = None):
        self.num_cases = int(num_cases)
        nbytes = 8 * (HEADER_SLOTS + 3 * self.num_cases)
        self._shm: shared_memory.SharedMemory | None = None
        self._finalizer = None
        if _attach_name is not None:
            self._shm = _SharedMemory(name=_attach_name)
            buffer = self._shm.buf
            self.owner = False
        elif shared:
            remove_orphan_segments()  # blocks left by owners that were killed with their resource tracker
            self._shm = _create_segment(nbytes)
            buffer = self._shm.buf
            self.owner = True
            self._finalizer = weakref.finalize(self, _release, self._shm, os.getpid())
        else:
            buffer = bytearray(nbytes)
            self.owner = True
        self._owner_pid = os.getpid()
        self._map(buffer)

    @classmethod
    def attach(cls, name: str, num_cases: int) -> "SamplerStorage":
        """Map an existing shared block (in a worker process); never unlinks it."""
        return cls(num_cases, _attach_name=name)

    def _map(self, buffer) -> None:
        n = self.num_cases
        self._buffer = buffer
        self.header_int = np.ndarray((HEADER_SLOTS,), np.int64, buffer, 0)
        self.header_float = np.ndarray((HEADER_SLOTS,), np.float64, buffer, 0)
        off = 8 * HEADER_SLOTS
        self.losses = np.ndarray((n,), np.float64, buffer, off)
        self.tree = np.ndarray((n,), np.float64, buffer, off + 8 * n)
        self.counts = np.ndarray((n,), np.int64, buffer, off + 16 * n)
        # memoryviews index ~5x faster than numpy scalars: they carry the O(log n) hot loops
        raw = memoryview(buffer)
        self.mv_header = raw[: 8 * HEADER_SLOTS].cast("q")
        self.mv_centre_view = raw[: 8 * HEADER_SLOTS].cast("d")
        self.mv_losses = raw[off: off + 8 * n].cast("d")
        self.mv_tree = raw[off + 8 * n: off + 16 * n].cast("d")
        self.mv_counts = raw[off + 16 * n: off + 24 * n].cast("q")

    @property
    def shared(self) -> bool:
        return self._shm is not None

    @property
    def name(self) -> str | None:
        return self._shm.name if self._shm is not None else None

    @property
    def is_owner_process(self) -> bool:
        return self.owner and os.getpid() == self._owner_pid

    @property
    def nbytes(self) -> int:
        """Bytes of state (header included)."""
        return 8 * (HEADER_SLOTS + 3 * self.num_cases)

    def close(self) -> None:
        """Unmap; the owner process also unlinks a shared block. Idempotent."""
        for attr in ("mv_header", "mv_centre_view", "mv_losses", "mv_tree", "mv_counts"):
            view = getattr(self, attr, None)
            if view is not None:
                view.release()
        self.header_int = self.header_float = self.losses = self.tree = self.counts = None
        self.mv_header = self.mv_centre_view = self.mv_losses = self.mv_tree = self.mv_counts = None
        if self._shm is None:
            return
        if self._finalizer is not None and os.getpid() == self._owner_pid:
            self._finalizer()  # close + unlink, once
        else:
            try:
                self._shm.close()
            except BufferError:
                pass
        self._shm = None

    @property
    def closed(self) -> bool:
        return self.losses is None
