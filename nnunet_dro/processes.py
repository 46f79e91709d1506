"""One function over many cases in worker processes: one future per case, and a dead worker is an error.

Every command that reads cases in parallel (``evaluate``, ``audit-labels``, ``discover``) runs its
pool through :func:`map_in_processes`, never through ``multiprocessing.Pool``, for three reasons:

- ``concurrent.futures.ProcessPoolExecutor`` notices a worker that dies (out-of-memory kill,
  segfault, ``kill -9``) and fails every pending future with ``BrokenProcessPool``, where
  ``multiprocessing.Pool`` replaces the worker, loses its case and waits for ever; and
  ``Pool.terminate()`` (on the way out after a worker's error) can block on the task queue's lock
  that an idle worker holds while it waits for its next task.
- Workers start from a ``forkserver`` (``spawn`` where it does not exist), never by plain fork:
  the parent may run threads (tqdm, ITK's thread pool) whose locks a forked child inherits held.
  The forkserver has imported this module and the caller's modules once, so a worker starts in
  milliseconds.
- Ctrl-C: workers ignore SIGINT (a terminal signals the whole process group; only the parent
  should handle it, once). In the parent, SIGINT only sets a flag that the waiting loop checks,
  and KeyboardInterrupt is raised after the pool is shut down: raised asynchronously, it can land
  inside ``concurrent.futures`` while that holds a future's lock (``wait()`` takes the locks of
  all pending futures), and the executor's manager thread then blocks on that lock for ever.

The first error of any case (a corrupt file: a UserError raised in a worker) cancels the cases
not yet started and is re-raised in the parent. Each task records in shared memory which worker
reads which case, so a dead worker's error names the cases being read when it died.

>>> map_in_processes(abs, [-1, 2, -3], ["a", "b", "c"], workers=2)
[1, 2, 3]
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

from nnunet_dro.errors import UserError

_reading = None  # the shared array, in a worker: task index -> pid of the worker reading it
_POLL_SECONDS = 0.1  # how soon the waiting loop notices Ctrl-C


def _init_worker(reading) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    global _reading
    _reading = reading


def _run(function: Callable[[Any], Any], index: int, job: Any) -> Any:
    _reading[index] = os.getpid()
    result = function(job)
    _reading[index] = -os.getpid()  # done (the result may still be on its way to the parent)
    return result


def process_context(preload: Sequence[str] = ()):
    """``forkserver`` with this module and the modules ``preload`` imported once, else ``spawn``."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload([__name__, *preload])
        return context
    return multiprocessing.get_context("spawn")


def map_in_processes(function: Callable[[Any], Any], jobs: Sequence[Any], cases: Sequence[str], workers: int,
                     on_result: Callable[[Any], None] = lambda result: None,
                     preload: Sequence[str] = ()) -> list:
    """``function(job)`` for every job in ``workers`` processes; the results in the order of ``jobs``.

    ``function`` is a module-level function (workers import it by name); ``cases[i]`` names
    ``jobs[i]`` in the error of a dead worker; ``on_result`` runs in the parent as each result
    arrives (a progress bar); ``preload``: modules the forkserver imports once. Nothing is left
    running when this returns or raises.
    """
    if len(cases) != len(jobs):
        raise ValueError(f"{len(jobs)} jobs but {len(cases)} case names")
    context = process_context(preload)
    reading = context.RawArray("i", len(jobs))  # anonymous shared memory, nothing in /dev/shm
    results: dict[int, Any] = {}
    with _sigint_as_flag() as interrupted:
        executor = ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker,
                                       initargs=(reading,))
        try:
            pending = {executor.submit(_run, function, index, job): index for index, job in enumerate(jobs)}
            while pending and not interrupted:
                done, _ = wait(pending, timeout=_POLL_SECONDS, return_when=FIRST_COMPLETED)
                for future in done:
                    index = pending.pop(future)
                    results[index] = future.result()  # raises the worker's error, or BrokenProcessPool
                    on_result(results[index])
        except BrokenProcessPool:
            received = {cases[index] for index in results}
            raise UserError(dead_worker_message(cases, reading, received)) from None
        finally:
            executor.shutdown(wait=True, cancel_futures=True)
    if interrupted:
        raise KeyboardInterrupt  # here, with the pool gone and no lock held
    return [results[index] for index in range(len(jobs))]


@contextmanager
def _sigint_as_flag() -> Iterator[list]:
    """While active, SIGINT appends to the yielded list instead of raising KeyboardInterrupt.

    The handler touches no lock (a lock held by the interrupted code would deadlock it). Nothing
    changes where SIGINT is not Python's default handler (ignored in a background job, a custom
    handler) or outside the main thread, where handlers cannot be installed.
    """
    flag: list = []
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield flag
        return
    signal.signal(signal.SIGINT, lambda signum, frame: flag.append(signum))
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def dead_worker_message(cases: Sequence[str], reading, received: set[str] | dict) -> str:
    """The one-line error for a dead worker, naming the cases being read when it died.

    ``reading[i]`` is 0 for a case not started, +pid while a worker reads it, -pid once read;
    ``received``: the cases whose results reached the parent. No case in flight means the worker
    died while idle: before any case was started, or between two cases (waiting for its next
    task, or sending a finished result).
    """
    in_flight = [case for index, case in enumerate(cases) if reading[index] > 0 and case not in received]
    started = any(reading[index] != 0 for index in range(len(cases)))
    where = (f"while reading case {in_flight[0]}" if len(in_flight) == 1 else
             f"while the cases {', '.join(in_flight)} were being read" if in_flight else
             "between two cases" if started else
             "before it read a case")
    return (f"a worker process died {where} (killed by a signal, e.g. out of memory?); nothing was "
            f"written. Run again, with fewer processes (-np) if memory is short")
