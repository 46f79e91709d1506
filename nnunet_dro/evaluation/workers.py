"""Reading cases in worker processes: one future per case, and a dead worker is an error.

``concurrent.futures.ProcessPoolExecutor`` notices a worker that dies (out-of-memory kill,
segfault, ``kill -9``) and fails every pending future with ``BrokenProcessPool``, where
``multiprocessing.Pool`` would replace the worker, lose its case and wait forever. Here:

- every case is one future; the first error (a corrupt file, a dead worker) cancels the cases
  not yet started and ends the evaluation with a UserError naming the case(s);
- each task records in shared memory which worker process reads which case, so a dead worker's
  error names the cases that were being read when it died;
- workers ignore SIGINT: Ctrl-C in a terminal signals the whole process group, and only the
  parent should handle it (once), not every worker with a traceback of its own;
- in the parent, Ctrl-C only sets a flag that the waiting loop checks, and KeyboardInterrupt is
  raised there after the pool is shut down. Raised asynchronously, it can land inside
  ``concurrent.futures`` while that holds a future's lock (``wait()`` takes the locks of all
  pending futures); the executor's manager thread then blocks on that lock for ever and
  ``shutdown()`` with it.

Workers start from a ``forkserver`` (``spawn`` where it does not exist), never by plain fork:
the parent may run threads (tqdm, ITK's thread pool) that make fork unsafe. The forkserver has
imported this module (and the metrics) once, so a worker starts in milliseconds.
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from typing import Callable, Iterator, Sequence

from nnunet_dro.errors import UserError
from nnunet_dro.evaluation.metrics import CaseResult, CaseTask, evaluate_case

_reading = None  # the shared array, in a worker: task index -> pid of the worker reading it
_POLL_SECONDS = 0.1  # how soon the waiting loop notices Ctrl-C


def _init_worker(reading) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    global _reading
    _reading = reading


def _run(index: int, task: CaseTask) -> CaseResult:
    _reading[index] = os.getpid()
    result = evaluate_case(task)
    _reading[index] = -os.getpid()  # done (the result may still be on its way to the parent)
    return result


def process_context():
    """``forkserver`` with this module preloaded, else ``spawn``."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload([__name__])
        return context
    return multiprocessing.get_context("spawn")


def read_cases_in_pool(tasks: Sequence[CaseTask], workers: int,
                       on_result: Callable[[CaseResult], None] = lambda result: None
                       ) -> dict[str, CaseResult]:
    """Run :func:`evaluate_case` for every task in ``workers`` processes; results by case.

    A UserError of any case (raised in a worker) is re-raised here after the cases not yet
    started are cancelled. A worker that dies is a UserError naming the cases it may have been
    reading. Nothing is left running when this returns or raises.
    """
    context = process_context()
    reading = context.RawArray("i", len(tasks))  # anonymous shared memory, nothing in /dev/shm
    results: dict[str, CaseResult] = {}
    with _sigint_as_flag() as interrupted:
        executor = ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker,
                                       initargs=(reading,))
        try:
            pending = {executor.submit(_run, index, task): task.case for index, task in enumerate(tasks)}
            while pending and not interrupted:
                done, _ = wait(pending, timeout=_POLL_SECONDS, return_when=FIRST_COMPLETED)
                for future in done:
                    pending.pop(future)
                    result = future.result()  # raises the worker's error, or BrokenProcessPool
                    results[result.case] = result
                    on_result(result)
        except BrokenProcessPool:
            raise UserError(_dead_worker_message(tasks, reading, results)) from None
        finally:
            executor.shutdown(wait=True, cancel_futures=True)
    if interrupted:
        raise KeyboardInterrupt  # here, with the pool gone and no lock held
    return results


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


def _dead_worker_message(tasks: Sequence[CaseTask], reading, results: dict) -> str:
    """The one-line error for a dead worker, naming the cases being read when it died.

    ``reading[i]`` is 0 for a case not started, +pid while a worker reads it, -pid once read.
    No case in flight means the worker died while idle: before any case was started, or
    between two cases (waiting for its next task, or sending a finished result).
    """
    in_flight = [task.case for index, task in enumerate(tasks)
                 if reading[index] > 0 and task.case not in results]
    started = any(reading[index] != 0 for index in range(len(tasks)))
    where = (f"while reading case {in_flight[0]}" if len(in_flight) == 1 else
             f"while the cases {', '.join(in_flight)} were being read" if in_flight else
             "between two cases" if started else
             "before it read a case")
    return (f"a worker process died {where} (killed by a signal, e.g. out of memory?); no report "
            f"was written. Run again, with fewer processes (-np) if memory is short")
