"""The decision regime's scheduler (nnunet_dro.lab.regime): a seed's arms wait for its ERM run, no
run starts after the deadline, a failed ERM run leaves its seed's arms unstarted, and the command
lines pair every arm with ERM under the regime's settings; two of its processes on one seed score
the shared baseline once. The benchmark runs it schedules are tested end to end in
test_wf_benchmark_robustness.py."""
from __future__ import annotations

import multiprocessing
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from nnunet_dro.lab.arm_runs import ArmRuns
from nnunet_dro.lab.cohort_folder import Cohort, CohortFolder
from nnunet_dro.lab.regime import REGIME, Job, Scheduler, benchmark_command, report_arms, report_command
from script_modules import load_script


class Recorder:
    """A ``run_job`` that marks its job done after a short sleep, recording the order of starts."""

    def __init__(self, fail: set[Job] = frozenset()):
        self.done: set[Job] = set()
        self.started: list[tuple[Job, int]] = []
        self.fail = fail
        self.lock = threading.Lock()

    def __call__(self, job: Job, core: int) -> int:
        with self.lock:
            self.started.append((job, core))
        time.sleep(0.02)
        if job in self.fail:
            return 1
        with self.lock:
            self.done.add(job)
        return 0


def jobs(seeds, arms=("ERM", "DROAdaptive", "JTT")):
    return [Job(s, a) for s in seeds for a in arms]


def test_every_arm_starts_after_its_seeds_erm_finished():
    recorder = Recorder()
    finish_times = {}

    def done(job):
        return job in recorder.done

    def run_job(job, core):
        code = recorder(job, core)
        finish_times[job] = time.monotonic()
        return code

    starts = {}

    def timed(job, core):
        starts[job] = time.monotonic()
        return run_job(job, core)

    scheduler = Scheduler(jobs([1, 2, 3]), done, timed, cores=2, poll=0.005)
    scheduler.run()
    assert not scheduler.failed and not scheduler.skipped
    assert recorder.done == set(jobs([1, 2, 3]))
    for job, start in starts.items():
        if job.arm != "ERM":
            assert start >= finish_times[Job(job.seed, "ERM")]
    assert {core for _, core in recorder.started} == {0, 1}


def test_finished_jobs_are_not_run_again():
    recorder = Recorder()
    recorder.done.update(jobs([1]))
    scheduler = Scheduler(jobs([1, 2]), lambda j: j in recorder.done, recorder, cores=2, poll=0.005)
    scheduler.run()
    assert {job.seed for job, _ in recorder.started} == {2}


def test_a_failed_erm_run_skips_its_seed_and_the_others_go_on():
    recorder = Recorder(fail={Job(1, "ERM")})
    scheduler = Scheduler(jobs([1, 2]), lambda j: j in recorder.done, recorder, cores=2, poll=0.005)
    scheduler.run()
    assert scheduler.failed == [Job(1, "ERM")]
    assert set(scheduler.skipped) == {Job(1, "DROAdaptive"), Job(1, "JTT")}
    assert set(jobs([2])) <= recorder.done


def test_no_job_starts_after_the_deadline():
    recorder = Recorder()
    scheduler = Scheduler(jobs([1, 2]), lambda j: j in recorder.done, recorder, cores=2,
                          deadline=time.monotonic() - 1, poll=0.005)
    scheduler.run()
    assert recorder.started == [] and set(scheduler.skipped) == set(jobs([1, 2]))


def test_commands_pair_each_arm_with_erm_under_the_regime(tmp_path: Path):
    command = benchmark_command(Job(30, "JTT"), tmp_path / "out", tmp_path / "rec", python="py")
    assert command[:2] == ["py", command[1]] and command[1].endswith("benchmark_robustness.py")
    assert command[command.index("--arms") + 1] == "ERM,JTT"
    assert command[command.index("--seeds") + 1] == "30,"
    assert command[command.index("--export-record") + 1] == str(tmp_path / "rec")
    for flag, value in REGIME.items():
        assert command[command.index(flag) + 1] == str(value)
    assert benchmark_command(Job(30, "ERM"), tmp_path, None)[4:6] == ["--arms", "ERM"]
    report = report_command([30, 31], ["ERM", "JTT"], tmp_path, python="py")
    assert "--report-only" in report and report[report.index("--seeds") + 1] == "30,31,"


class SlowScoring(ArmRuns):
    """Arm runs whose scoring (prediction and evaluation) only logs its start and end around a
    pause: what two processes scoring the same network at once would interleave."""

    def _predict_and_score(self, arm, trainer, images, labels, groups, target, device, checkpoint="checkpoint_final.pth",
                           metrics=("dice",)):
        with open(self.cohort_folder.folder / "scorings.log", "a") as log:
            log.write("start\n")
        time.sleep(1.0)
        with open(self.cohort_folder.folder / "scorings.log", "a") as log:
            log.write("end\n")
        return pd.DataFrame({"case": "fetal_001", "metric": list(metrics), "value": 0.9})


def _score_erm(folder: str) -> None:
    arms = SlowScoring(CohortFolder(folder, 991, "SyntheticFetalBenchmark", Cohort(8, 2, 16, 35),
                                    echo=lambda text: None))
    arms.score_further("ERM", "nnUNetTrainer", "shifted_test", 993)


def test_two_processes_on_one_seed_score_the_shared_erm_network_once(tmp_path: Path):
    """Seed 35 of the regime, December 5: ``--arms ERM,A`` and ``--arms ERM,B`` started together
    both scored ERM at the new centre into one folder, and one renamed the other's predictions away.
    Scoring an arm now holds that arm's lock: the second process waits, then loads the first's result."""
    arms = SlowScoring(CohortFolder(tmp_path, 991, "SyntheticFetalBenchmark", Cohort(8, 2, 16, 35),
                                    echo=lambda text: None))
    checkpoint = arms.fold_folder("nnUNetTrainer") / "checkpoint_final.pth"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(b"")  # only its presence is checked before scoring
    context = multiprocessing.get_context("fork")
    processes = [context.Process(target=_score_erm, args=(str(tmp_path),)) for _ in range(2)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(60)
    assert [p.exitcode for p in processes] == [0, 0]
    assert (tmp_path / "scorings.log").read_text().split() == ["start", "end"]
    assert pd.read_csv(arms.arm_folder("ERM") / "per_case_shifted_test.csv")["value"].tolist() == [0.9]


def test_the_report_covers_every_recorded_arm_not_only_the_batchs(tmp_path: Path):
    """A batch of one later arm re-makes the record's tables over every arm the record holds (the
    batch of December 6 replaced them with its own three until this was fixed)."""
    for seed, arm in ((30, "ERM"), (30, "JTT"), (31, "ERM"), (31, "DROLS"), (31, "Custom_b"), (31, "Custom_a")):
        folder = tmp_path / "runs" / f"seed_{seed}" / "arms" / arm
        folder.mkdir(parents=True)
        (folder / "result.json").write_text("{}")
    (tmp_path / "runs" / "seed_31" / "arms" / "Unfinished").mkdir()  # no result: not a recorded run
    assert report_arms(tmp_path, ["ERM", "DROLS_ceAscent"]) == ["ERM", "JTT", "DROLS", "DROLS_ceAscent",
                                                                 "Custom_a", "Custom_b"]
    assert report_arms(tmp_path / "empty", ["ERM"]) == ["ERM"]


def test_the_error_set_trainers_are_arms_the_regime_can_name():
    """Issue 79's trainers need no list: their CPU-budget twins exist and the regime's command
    line names them as arms the benchmark accepts (the lead schedules the runs)."""
    from nnunet_dro.lab import budget
    from nnunet_dro.lab.arm_runs import ARM_TRAINERS
    from nnunet_dro.lab.benchmark_analysis import parse_arms

    for arm in ("DROAdaptive_errorSet", "DROAdaptive_errorSet_refresh70"):
        twin = f"nnUNetTrainer{arm}_CPUBudget"
        assert ARM_TRAINERS[arm] == twin and hasattr(budget, twin)
        command = benchmark_command(Job(40, arm), Path("out"), None)
        arms = command[command.index("--arms") + 1]
        assert arms == f"ERM,{arm}" and parse_arms(arms) == ["ERM", arm]


def test_the_converged_regimes_command_lines():
    """Issue 78's regime as the journal fixes it: the 2D plane cohort, fold 0, kept networks scored on
    the training cases, the larger and new-centre test sets; the epochs are the calibration's."""
    from nnunet_dro.lab.regime import CONVERGED, CONVERGED_ARMS, regime_flags

    command = benchmark_command(Job(50, "DROAdaptive_errorSet"), Path("/out"), None, {**CONVERGED, "--epochs": 800})
    text = " ".join(command)
    assert "--arms ERM,DROAdaptive_errorSet" in text and "--seeds 50," in text
    for flags in ("--n-train 125", "--size 64", "--plane 0.11", "--validation-fold --keep-checkpoints",
                  "--keep-checkpoints 50,75 --training-fit", "--large-test 100",
                  "--shifted-test 100", "--epochs 800"):
        assert flags in text, flags
    assert regime_flags({"--validation-fold": None}) == ["--validation-fold"]
    assert CONVERGED_ARMS[:2] == ("ERM", "ERM_repeat") and "JTT" in CONVERGED_ARMS


def test_decision_regime_script_needs_the_converged_budget(capsys):
    module = load_script("decision_regime")
    for argv, message in ((["--regime", "converged", "--seeds", "40"], "give --epochs"),
                          (["--seeds", "30", "--epochs", "400"], "fixed (200 epochs)"),
                          (["--regime", "dose", "--seeds", "30", "--epochs", "600"], "give --epochs 400")):
        with pytest.raises(SystemExit) as exit_:
            module.main(argv)
        assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_the_dose_response_runs_are_the_decision_regime_at_2x_with_networks_every_50_epochs():
    """Issue 78's item 1 as the journal fixes it: the decision regime's cohort and arms ERM, the
    default and JTT, at 400 (or 800) epochs, every arm's network kept every 50 epochs and scored on
    its own training cases."""
    from nnunet_dro.lab.regime import DOSE_ARMS, REGIME, dose_settings

    settings = dose_settings(400)
    assert {k: v for k, v in settings.items() if k not in ("--epochs", "--keep-checkpoints", "--training-fit")} \
        == {k: v for k, v in REGIME.items() if k != "--epochs"}
    kept = [float(p) * 400 / 100 for p in settings["--keep-checkpoints"].split(",")]
    assert kept == [50.0 * k for k in range(1, 8)]
    assert [float(p) * 8 for p in dose_settings(800)["--keep-checkpoints"].split(",")] == [50.0 * k for k in range(1, 16)]
    text = " ".join(benchmark_command(Job(30, "JTT"), Path("/out"), None, settings))
    assert "--epochs 400" in text and "--training-fit" in text and "--arms ERM,JTT" in text
    assert DOSE_ARMS == ("ERM", "DROAdaptive", "JTT")
    with pytest.raises(ValueError, match="multiple of 50"):
        dose_settings(420)
