"""Faults during a real ``nnunet_dro evaluate`` run: a worker killed, Ctrl-C.

The CLI runs in its own session; the test finds its worker processes in /proc (children of its
forkserver), kills one while the cases are being read, and checks what a user would see: a
prompt exit with one line, no report, no process and no semaphore left behind.

Each fault lands by construction, never by a race against the machine's speed: a start-up hook
(``hold_hook/sitecustomize.py``, on the CLI's PYTHONPATH) holds the worker that starts HELD_CASE
inside that case until the test kills it (or, for Ctrl-C, releases it after the signal), so the
evaluation cannot finish before the fault arrives.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from eval_testdata import PYTHON, make_cohort
from nnunet_dro.processes import dead_worker_message
from proc_tools import (
    SHM,
    RunningCli,
    SemaphoreWatch,
    descendants_of,
    ignores_signal,
    semaphores_left,
    semaphores_of,
    wait_until_gone,
)

pytestmark = pytest.mark.skipif(not Path("/proc/self/maps").exists() or not SHM.is_dir(),
                                reason="watches processes and semaphores through Linux's /proc and /dev/shm")

N_CASES = 40
# The case whose worker the hook holds: after enough others that reading has visibly started
# (the progress bar counts cases done while it is held) and before the last.
HELD_CASE = "case_020"
HOOK = Path(__file__).resolve().parent / "hold_hook"


@pytest.fixture(scope="module")
def big_cohort(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    ref, preds = make_cohort(root, n_cases=N_CASES, methods=("A",), shape=(32, 32, 32))
    return ref, preds["A"]


_WATCHES: list[SemaphoreWatch] = []


@pytest.fixture(autouse=True)
def _stop_the_watches():
    """A failed test leaves no watch polling /proc for the rest of the session."""
    yield
    while _WATCHES:
        _WATCHES.pop().stop()


def _assert_no_semaphore_left(watch: SemaphoreWatch) -> None:
    """Once the CLI's session is gone: every semaphore any of its processes mapped during the run,
    not only those of the moment the signal came (one made and left behind while shutting down
    counts too), is gone from /dev/shm."""
    seen = watch.stop()
    assert seen, "the watch saw none of the pool's semaphores"
    leaked = semaphores_left(seen)
    print(f"semaphores left in /dev/shm: {len(leaked)} of the {len(seen)} the CLI's processes mapped")
    assert not leaked, leaked


def _env(hold_file: Path | None = None):
    env = dict(os.environ, OMP_NUM_THREADS="1", nnUNet_def_n_proc="2")
    if hold_file is not None:  # the hook holds the worker of HELD_CASE (see the module docstring)
        env.update(PYTHONPATH=os.pathsep.join([str(HOOK)] + [p for p in [env.get("PYTHONPATH")] if p]),
                   NNUNET_DRO_TEST_HOLD_CASE=HELD_CASE, NNUNET_DRO_TEST_HOLD_FILE=str(hold_file))
    return env


def _held_worker(cli: RunningCli, hold_file: Path, timeout: float = 60.0) -> int:
    """The pid of the worker held inside HELD_CASE, once it is there (it stays there: the CLI
    cannot finish before the test kills or releases it, so this waits on no race)."""
    cli.wait_for(lambda c: hold_file.exists(), timeout=timeout)
    pid = int(hold_file.read_text())
    assert pid in _workers(cli), (pid, _workers(cli))
    return pid


def _workers(cli: RunningCli) -> list[int]:
    """The pool's workers: the grandchildren of the CLI (children of its forkserver)."""
    return [pid for pid, depth in descendants_of(cli.process.pid).items() if depth == 2]


def _start(ref, pred, out, hold_file: Path) -> tuple[RunningCli, SemaphoreWatch, dict[int, int]]:
    cli = RunningCli("evaluate", "-ref", ref, "-pred", f"A={pred}", "-o", out, "-np", "2",
                     "--metrics", "dice", "hd95", env=_env(hold_file))
    watch = SemaphoreWatch(cli.process.pid)  # its own session: the session id is its pid
    _WATCHES.append(watch)
    # reading has started once a worker is inside HELD_CASE (the progress bar is no signal: tqdm
    # prints at most every 0.1 s, so the cases before the held one may never show)
    cli.wait_for(lambda c: hold_file.exists())
    cli.wait_for(lambda c: len(_workers(c)) == 2)
    tree = descendants_of(cli.process.pid)
    assert set().union(*(semaphores_of(p) for p in [cli.process.pid, *tree])), \
        "expected the pool's queues to hold named semaphores"
    return cli, watch, tree


def _previous_report(out: Path) -> bytes:
    out.mkdir()
    (out / "summary.csv").write_text("method,group\nprevious,run\n")
    return (out / "summary.csv").read_bytes()


def test_killed_worker_is_a_prompt_one_line_exit_2_naming_the_case(big_cohort, tmp_path):
    ref, pred = big_cohort
    out = tmp_path / "report"
    previous = _previous_report(out)
    hold_file = tmp_path / "held.pid"
    cli, watch, tree = _start(ref, pred, out, hold_file)
    victim = _held_worker(cli, hold_file)
    os.kill(victim, signal.SIGKILL)  # inside HELD_CASE by construction
    killed_at = time.monotonic()
    # the Pool it replaces waited forever; finish() fails if the CLI is not gone within a minute
    # (a bound on hanging, not a speed claim: a busy machine may take seconds)
    code = cli.finish(timeout=60)
    seconds = time.monotonic() - killed_at
    print(f"exit {code} {seconds:.2f} s after SIGKILL of worker {victim}")

    assert code == 2, cli.stderr
    lines = [line for line in re.split(r"[\r\n]", cli.stderr) if line.strip()
             and not line.lstrip().startswith("Reading cases")]
    assert len(lines) == 1, cli.stderr  # one line: no traceback, no resource-tracker warning
    match = re.fullmatch(r"nnunet_dro evaluate: error: a worker process died while (reading case (case_\d{3})|"
                         r"the cases (case_\d{3}(, case_\d{3})+) were being read) \(killed by a signal.*", lines[0])
    assert match, lines[0]
    # the victim's case among those named (the other worker may be in the middle of one too)
    assert HELD_CASE in (match.group(2) or match.group(3)).split(", "), lines[0]
    assert sorted(p.name for p in out.iterdir()) == ["summary.csv"]  # no partial report, old one intact
    assert (out / "summary.csv").read_bytes() == previous
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder
    assert wait_until_gone(tree) == []  # forkserver, workers, resource tracker: all gone
    _assert_no_semaphore_left(watch)


# reading[i]: 0 = case i not started, +pid = being read by worker pid, -pid = read (its result
# may still be on its way to the parent); results: the cases the parent has received.
@pytest.mark.parametrize("reading, received, where", [
    ([0, 0, 0], [], "before it read a case"),
    ([-11, 12, 0], ["case_000"], "while reading case case_001"),
    ([11, 12, 0], [], "while the cases case_000, case_001 were being read"),
    ([-11, -12, 0], ["case_000"], "between two cases"),  # idle, or sending case_001's result
    ([-11, -12, -11], ["case_000", "case_001", "case_002"], "between two cases"),
])
def test_dead_worker_message_names_the_cases_in_flight(reading, received, where):
    cases = [f"case_{i:03d}" for i in range(len(reading))]
    message = dead_worker_message(cases, reading, set(received))
    assert message.startswith(f"a worker process died {where} (killed by a signal"), message
    assert "\n" not in message


def test_ctrl_c_is_handled_once_by_the_parent(big_cohort, tmp_path):
    ref, pred = big_cohort
    out = tmp_path / "report"
    hold_file = tmp_path / "held.pid"
    cli, watch, tree = _start(ref, pred, out, hold_file)
    _held_worker(cli, hold_file)  # the evaluation cannot end before the signal
    # Ctrl-C in a terminal signals the whole process group; only the CLI itself should react.
    cli.wait_for(lambda c: all(ignores_signal(pid, signal.SIGINT) for pid in _workers(c)))
    assert not ignores_signal(cli.process.pid, signal.SIGINT)
    os.killpg(cli.process.pid, signal.SIGINT)
    interrupted_at = time.monotonic()
    # let the held worker finish its case: the pool's shutdown waits for the case in progress
    Path(f"{hold_file}.release").touch()
    code = cli.finish(timeout=60)
    print(f"exit {code} {time.monotonic() - interrupted_at:.2f} s after Ctrl-C")
    assert code == 130, cli.stderr
    assert "Traceback" not in cli.stderr and "KeyboardInterrupt" not in cli.stderr, cli.stderr
    lines = [line for line in re.split(r"[\r\n]", cli.stderr) if line.strip()
             and not line.lstrip().startswith("Reading cases")]
    assert lines == ["nnunet_dro evaluate: interrupted"], cli.stderr
    assert not out.exists()
    assert wait_until_gone(tree) == []
    _assert_no_semaphore_left(watch)


# Ctrl-C can arrive at any bytecode of the parent. The dangerous moment is inside
# concurrent.futures.wait(), which takes the lock of every pending future one after the other: a
# KeyboardInterrupt raised there leaves some of those locks held, the executor's manager thread
# then blocks for ever when it sets that future's result, and shutdown() waits for it for ever.
# The script below makes the signal arrive exactly there, every time.
_CTRL_C_WHILE_FUTURES_ARE_LOCKED = r"""
import os, signal, sys
from concurrent.futures import _base
from pathlib import Path
from nnunet_dro.evaluation.metrics import CaseTask
from nnunet_dro.evaluation.workers import read_cases_in_pool

def main():
    ref, pred = Path(sys.argv[1]), Path(sys.argv[2])
    tasks = [CaseTask(p.name[:-7], str(p), (("A", str(pred / p.name)),)) for p in sorted(ref.iterdir())]
    original_enter, calls = _base._AcquireFutures.__enter__, []

    def enter_then_ctrl_c(self):
        # take the first lock, then the user presses Ctrl-C (on the 20th wait, cases being read:
        # the hook holds one case until the release below, so the 20th wait comes before the end)
        calls.append(1)
        futures = list(self.futures)
        futures[0]._condition.acquire()
        if len(calls) == 20:
            os.kill(os.getpid(), signal.SIGINT)
            open(os.environ["NNUNET_DRO_TEST_HOLD_FILE"] + ".release", "w").close()
        for future in futures[1:]:
            future._condition.acquire()

    _base._AcquireFutures.__enter__ = enter_then_ctrl_c
    try:
        read_cases_in_pool(tasks, 2)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    finally:
        _base._AcquireFutures.__enter__ = original_enter
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, "SIGINT handler not restored"

if __name__ == "__main__":
    main()
"""


def test_ctrl_c_while_the_parent_holds_the_futures_locks_is_no_deadlock(big_cohort, tmp_path):
    ref, pred = big_cohort
    script = tmp_path / "ctrl_c.py"
    script.write_text(_CTRL_C_WHILE_FUTURES_ARE_LOCKED)
    # SIGINT at its default, as in a terminal; its own session, so that a hang leaves nothing behind
    process = subprocess.Popen([str(PYTHON), str(script), str(ref), str(pred)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=_env(tmp_path / "held.pid"),
                               start_new_session=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        stdout, stderr = process.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise AssertionError("deadlock: the pool did not shut down within 120 s of Ctrl-C") from None
    assert process.returncode == 0, stderr
    assert stdout.splitlines() == ["interrupted"], stdout + stderr


_HOLDS_A_NAMED_SEMAPHORE = ("import multiprocessing, sys, time; lock = multiprocessing.get_context('spawn').Lock(); "
                            "print('holding', flush=True); time.sleep(60 if sys.argv[1] == 'wait' else 1)")


@pytest.mark.parametrize("killed", [True, False], ids=["killed: left behind", "exits: removed"])
def test_the_semaphore_watch_sees_a_semaphore_left_behind(killed):
    """The leak checks above can fail: a process group killed with SIGKILL (its resource tracker
    too) leaves its named semaphore in /dev/shm, and the watch finds it under its real name."""
    process = subprocess.Popen([str(PYTHON), "-c", _HOLDS_A_NAMED_SEMAPHORE, "wait" if killed else "exit"],
                               stdout=subprocess.PIPE, text=True, start_new_session=True)
    watch = SemaphoreWatch(process.pid)
    _WATCHES.append(watch)
    assert process.stdout.readline() == "holding\n"
    time.sleep(0.2)  # a few of the watch's polls while it holds the lock
    if killed:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(30)
    process.stdout.close()
    seen = watch.stop()
    # the resource tracker of a clean exit unlinks it on its way out, a moment after its parent
    deadline = time.monotonic() + 10
    while (left := semaphores_left(seen)) and not killed and time.monotonic() < deadline:
        time.sleep(0.05)
    for name in left:
        (SHM / name).unlink()
    assert len(seen) == 1, seen
    assert len(left) == (1 if killed else 0), left
    assert all(name.startswith("sem.mp-") for name in left), left
