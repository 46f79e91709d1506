"""The decision regime: many paired seeds of every arm on a cohort one training of which costs a few
minutes of one core, scheduled over the machine's cores (``scripts/decision_regime.py``).

A seed fixes the cohort draw and every arm's initial weights. Each (seed, arm) is one run of
``scripts/benchmark_robustness.py`` pinned to one core (``taskset -c``) with one torch thread, so
two trainings share a 2-core machine without oversubscribing it. A seed's ERM run goes first: the
other arms of that seed are paired with it (``--arms ERM,<arm>``), and Just Train Twice's error set
is read from its network. Every finished run is copied to the record (``--export-record``), so the
regime can be built over several sessions, one batch of seeds at a time, and every table is
re-made from the record alone (:func:`report_command`).

The regime's settings, its calibration and the decision rule are in the lab journal, written
before the runs (data_docs/benchmark_record/journal.md, "the decision regime").
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

#: the regime (the journal's calibration): 40 training cases (5 spina bifida, 3 "other"), 24^3
#: voxels, 200 epochs x 25 iterations of the CPU budget, 30 test and 100 further test cases per group,
#: and those 100 again acquired at a new centre (site_C; added after seeds 30-33 had trained: it
#: scores the same networks and changes no training)
REGIME = {"--n-train": 40, "--n-test": 30, "--size": 24, "--epochs": 200, "--large-test": 100, "--shifted-test": 100}
#: the arms compared, ERM twice (``ERM_repeat``: the noise floor)
ARMS = ("ERM", "ERM_repeat", "DROAdaptive", "DROAdaptive_fromStart", "JTT", "DiceTopK10",
        "DROAdaptive_f25_ermPhase")
#: GI-LS (feature-map DRO with label smoothing) alone, with the default's sampling and with the
#: ascent on the CE alone: queued after every seed's :data:`ARMS`, so that a batch cut short by its
#: deadline has whole seeds of those
LATER_ARMS = ("DROLS", "DROLS_DRO", "DROLS_ceAscent")
BASELINE = "ERM"
#: the converged regime (issue 78; the journal's pre-registration of December 6, 2026, and its
#: amendment "the converged regime's cohort is 2D"): 125 training-pool cases cut at the plane x =
#: 0.11, 64^2, fold 0 of a split stratified by condition (nnU-Net's validation kept), networks kept
#: at 50 % and 75 % of the epochs and scored on the training cases with the final one (the
#: plateau test (i); every 12.5 % cost 5 more scorings of 125 cases per training, about 5 minutes,
#: journal of December 7); the epochs are the calibration's (``--epochs``: 800 or 1600)
CONVERGED = {"--n-train": 125, "--n-test": 30, "--size": 64, "--plane": 0.11, "--validation-fold": None,
             "--keep-checkpoints": "50,75", "--training-fit": None,
             "--large-test": 100, "--shifted-test": 100}
#: its arms (ERM twice: the noise floor; Holm's family: the four single-training arms and JTT)
CONVERGED_ARMS = ("ERM", "ERM_repeat", "DROAdaptive", "DROAdaptive_f25_ermPhase", "JTT", "DROAdaptive_errorSet",
                  "DROAdaptive_errorSet_refresh70")
#: the calibration's arms on seeds 40-43 (never reported): ERM twice and the default
CALIBRATION_ARMS = ("ERM", "ERM_repeat", "DROAdaptive")
#: the dose-response runs (issue 78, item 1; journal, December 6, written before them): the decision
#: regime at 2x (400 epochs) or 4x (800) its budget, each arm's network kept every
#: :data:`DOSE_STEP` epochs and scored on its own training cases
DOSE = {**REGIME, "--training-fit": None}
DOSE_ARMS = ("ERM", "DROAdaptive", "JTT")
DOSE_STEP = 50


def dose_settings(epochs: int) -> dict:
    """The dose-response regime at ``epochs`` (400 or 800): networks kept every 50 epochs.

    >>> dose_settings(400)["--keep-checkpoints"]
    '12.5,25,37.5,50,62.5,75,87.5'
    """
    if epochs % DOSE_STEP or epochs <= DOSE_STEP:
        raise ValueError(f"dose response: {epochs} epochs is not a multiple of {DOSE_STEP} above it")
    return {**DOSE, "--epochs": epochs,
            "--keep-checkpoints": ",".join(f"{100 * e / epochs:g}" for e in range(DOSE_STEP, epochs, DOSE_STEP))}


#: the regimes by name (``scripts/decision_regime.py --regime``): settings, arms, later arms
REGIMES = {"decision": (REGIME, ARMS, LATER_ARMS), "converged": (CONVERGED, CONVERGED_ARMS, ()),
           "dose": (DOSE, DOSE_ARMS, ())}
BENCHMARK = Path(__file__).resolve().parents[2] / "scripts" / "benchmark_robustness.py"


@dataclass(frozen=True)
class Job:
    """One (seed, arm) run of the benchmark."""

    seed: int
    arm: str

    def arms(self) -> str:
        return BASELINE if self.arm == BASELINE else f"{BASELINE},{self.arm}"


def job_list(seeds: Sequence[int], arms: Sequence[str], later_arms: Sequence[str] = ()) -> list[Job]:
    """Every seed's ``arms`` in seed order, then every seed's ``later_arms``.

    >>> [(j.seed, j.arm) for j in job_list([1, 2], ["ERM", "A"], ["B"])]
    [(1, 'ERM'), (1, 'A'), (2, 'ERM'), (2, 'A'), (1, 'B'), (2, 'B')]
    """
    return [Job(s, a) for s in seeds for a in arms] + [Job(s, a) for s in seeds for a in later_arms if a not in arms]


def regime_flags(regime: dict = REGIME) -> list[str]:
    """The regime as the benchmark's flags (a value of None: a flag without a value).

    >>> regime_flags({"--size": 24, "--epochs": 200, "--validation-fold": None})
    ['--size', '24', '--epochs', '200', '--validation-fold']
    """
    return [text for flag, value in regime.items() for text in ((flag,) if value is None else (flag, str(value)))]


def benchmark_command(job: Job, output: Path, record: Path | None, regime: dict = REGIME,
                      python: str = sys.executable) -> list[str]:
    """The benchmark's command line of one job (without the ``taskset`` prefix)."""
    command = [python, str(BENCHMARK), "--seeds", f"{job.seed},", "--arms", job.arms(), "--torch-threads", "1",
               "-o", str(output), *regime_flags(regime)]
    if record is not None:
        command += ["--export-record", str(record)]
    return command


def report_arms(record: Path, batch_arms: Sequence[str]) -> list[str]:
    """The arms the record's tables cover: every arm with a recorded run on some seed, and the
    batch's, in the regime's order (:data:`ARMS`, :data:`LATER_ARMS`, then the others by name): a
    batch of a few arms would otherwise replace the record's tables with its own few."""
    held = {path.parent.name for path in Path(record).glob("runs/seed_*/arms/*/result.json")}
    wanted = held | set(batch_arms)
    order = [*ARMS, *LATER_ARMS]
    return [arm for arm in order if arm in wanted] + sorted(wanted - set(order))


def report_command(seeds: Sequence[int], arms: Sequence[str], record: Path, regime: dict = REGIME,
                   python: str = sys.executable) -> list[str]:
    """Re-make the regime's tables from the record alone (trains nothing)."""
    return [python, str(BENCHMARK), "--report-only", "--seeds", ",".join(map(str, seeds)) + ",",
            "--arms", ",".join(arms), "-o", str(record), *regime_flags(regime)]


def finished(output: Path, job: Job) -> bool:
    """Whether the job's arm has its stored result in the working folder."""
    return (output / "runs" / f"seed_{job.seed}" / "arms" / job.arm / "result.json").is_file()


@dataclass
class Scheduler:
    """Two (or ``cores``) workers pull jobs in seed order; a seed's arms wait for its ERM run.

    ``run_job(job, core)`` runs one job and returns its exit code; no job starts after
    ``deadline`` (seconds of ``time.monotonic``), so a batch ends inside the session that started it.
    """

    jobs: list[Job]
    done: Callable[[Job], bool]
    run_job: Callable[[Job, int], int]
    cores: int = 2
    deadline: float = float("inf")
    poll: float = 5.0
    failed: list[Job] = field(default_factory=list)
    skipped: list[Job] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._pending = [j for j in self.jobs if not self.done(j)]
        self._running: set[Job] = set()

    def _ready(self, job: Job) -> bool:
        if job.arm == BASELINE:
            return True
        baseline = Job(job.seed, BASELINE)
        return self.done(baseline) and baseline not in self._running

    def _next(self) -> Job | None:
        """The first ready job; None when nothing is left. Waits while only blocked jobs remain."""
        while True:
            with self._lock:
                if time.monotonic() > self.deadline:
                    self.skipped.extend(self._pending)
                    self._pending.clear()
                if not self._pending:
                    return None
                blocked_seeds = {j.seed for j in self.failed if j.arm == BASELINE}
                for job in list(self._pending):
                    if job.seed in blocked_seeds:  # its ERM failed: nothing of the seed can be paired
                        self._pending.remove(job)
                        self.skipped.append(job)
                for job in self._pending:
                    if self._ready(job):
                        self._pending.remove(job)
                        self._running.add(job)
                        return job
            time.sleep(self.poll)

    def _worker(self, core: int) -> None:
        while (job := self._next()) is not None:
            code = self.run_job(job, core)
            with self._lock:
                self._running.discard(job)
                if code != 0 or not self.done(job):
                    self.failed.append(job)

    def run(self) -> None:
        threads = [threading.Thread(target=self._worker, args=(core,), daemon=True) for core in range(self.cores)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()


def pinned_runner(output: Path, record: Path | None, echo: Callable[[str], None] = print,
                  regime: dict = REGIME) -> Callable[[Job, int], int]:
    """A ``run_job`` that runs the benchmark under ``taskset -c <core>``, its output in
    ``output/logs/seed_<s>_<arm>.log``."""
    logs = output / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    def run_job(job: Job, core: int) -> int:
        command = ["taskset", "-c", str(core), *benchmark_command(job, output, record, regime)]
        tic = time.monotonic()
        echo(f"[{(tic - started) / 60:6.1f} min] core {core}: seed {job.seed} {job.arm}")
        with open(logs / f"seed_{job.seed}_{job.arm}.log", "w") as log:
            code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT,
                                  env={**os.environ, "PYTHONUNBUFFERED": "1"}).returncode
        echo(f"[{(time.monotonic() - started) / 60:6.1f} min] core {core}: seed {job.seed} {job.arm} "
             f"{'done' if code == 0 else f'FAILED (exit {code})'} in {(time.monotonic() - tic) / 60:.1f} min")
        return code

    return run_job
