"""The decision regime: every arm on many paired seeds, two trainings side by side (one core each).

A thin entry point: the scheduler and the regime's settings are :mod:`nnunet_dro.lab.regime`; the
regime, its calibration and the decision rule are in the lab journal, written before the runs (a
seed counts only where ERM learned the majority; seed 33 does not, hence seed 38).

    python scripts/decision_regime.py --seeds 30-38                     # every arm, seeds 30..38
    python scripts/decision_regime.py --seeds 30-33 --stop-after 150    # start no run after 150 min
    python scripts/decision_regime.py --seeds 30-38 --report-only       # tables from the record

The converged regime (issue 78: the 2D plane cohort, fold 0, the training fit on kept networks),
its calibration on seeds 40-43 (never reported) and its decision on fresh seeds:

    python scripts/decision_regime.py --regime converged --epochs 1600 --seeds 40-43 \
        --arms ERM,ERM_repeat,DROAdaptive --record data_docs/benchmark_record/converged2d_calibration_1600
    python scripts/decision_regime.py --regime converged --epochs 1600 --seeds 50-65

The dose-response runs (issue 78, item 1): the decision regime at 2x its budget on seeds 30, 31,
32 and 34 (ERM, the default, Just Train Twice; networks kept every 50 epochs and scored on the
training cases), record ``decision40_24_400``:

    python scripts/decision_regime.py --regime dose --epochs 400 --seeds 30,31,32,34
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from nnunet_dro.lab.regime import (
    BASELINE,
    REGIMES,
    Scheduler,
    dose_settings,
    finished,
    job_list,
    pinned_runner,
    report_arms,
    report_command,
)

RECORDS = Path(__file__).resolve().parents[1] / "data_docs" / "benchmark_record"
#: each regime's record (the converged regime's is named by its budget)
RECORD_NAMES = {"decision": "decision40_24_200", "converged": "converged2d_125_{epochs}",
                "dose": "decision40_24_{epochs}"}


def seeds_from(text: str) -> list[int]:
    """``30-37`` or ``30,31,35``."""
    if "-" in text:
        low, high = map(int, text.split("-"))
        return list(range(low, high + 1))
    return [int(s) for s in text.split(",") if s.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--regime", choices=sorted(REGIMES), default="decision",
                        help="decision: the 40-case 3D regime of December 5; converged: issue 78's 2D regime "
                             "(needs --epochs). Default: decision")
    parser.add_argument("--epochs", type=int, default=None,
                        help="the converged regime's budget (its calibration's: 800 or 1600 epochs); the dose-response runs': 400 or 800")
    parser.add_argument("--seeds", required=True, help="30-37 or 30,31,35")
    parser.add_argument("--arms", default=None, help="Default: the regime's arms")
    parser.add_argument("--later-arms", default=None,
                        help="arms queued after every seed's --arms. Default: the regime's later arms")
    parser.add_argument("-o", dest="output", default=None, help="working folder. Default: results/<record name>")
    parser.add_argument("--record", default=None, help=f"Default: {RECORDS}/<the regime's record name>")
    parser.add_argument("--cores", type=int, default=2, help="trainings side by side, one core each. Default: 2")
    parser.add_argument("--stop-after", type=float, default=None, metavar="MIN",
                        help="start no run after MIN minutes (a batch ends inside its session)")
    parser.add_argument("--report-only", action="store_true", help="re-make the record's tables, train nothing")
    args = parser.parse_args(argv)
    settings, regime_arms, regime_later = REGIMES[args.regime]
    if args.regime == "converged":
        if args.epochs is None:
            parser.error("--regime converged: give --epochs (the calibration's budget: 800 or 1600)")
        settings = {**settings, "--epochs": args.epochs}
    elif args.regime == "dose":
        if args.epochs not in (400, 800):
            parser.error("--regime dose: give --epochs 400 (2x the decision regime's budget) or 800 (4x)")
        settings = dose_settings(args.epochs)
    elif args.epochs is not None:
        parser.error("--epochs: the decision regime's budget is fixed (200 epochs)")
    name = RECORD_NAMES[args.regime].format(epochs=args.epochs)
    seeds = seeds_from(args.seeds)
    arms = [a for a in (args.arms or ",".join(regime_arms)).split(",") if a]
    later = [a for a in (args.later_arms if args.later_arms is not None else ",".join(regime_later)).split(",") if a]
    args.record = args.record or str(RECORDS / name)
    args.output = args.output or f"results/{name}"
    if BASELINE not in arms:
        parser.error(f"--arms {args.arms}: the regime pairs every arm with {BASELINE}")
    record = Path(args.record).resolve()
    if not args.report_only:
        output = Path(args.output).resolve()
        jobs = job_list(seeds, arms, later)
        deadline = time.monotonic() + 60 * args.stop_after if args.stop_after else float("inf")
        scheduler = Scheduler(jobs, lambda job: finished(output, job), pinned_runner(output, record, regime=settings),
                              cores=args.cores, deadline=deadline)
        scheduler.run()
        for label, jobs_ in (("failed", scheduler.failed), ("not started", scheduler.skipped)):
            if jobs_:
                print(f"{label}: " + ", ".join(f"seed {j.seed} {j.arm}" for j in jobs_))
        if scheduler.failed:
            return 1
    # the tables cover every recorded seed and arm, not only this batch's: a batch of later seeds
    # or of a few arms would otherwise replace the record's tables with its own few
    done = sorted({int(p.name.split("_")[1]) for p in (record / "runs").glob("seed_*")}) \
        if (record / "runs").is_dir() else []
    if not done:
        print(f"no recorded seed in {record}")
        return 1
    return subprocess.run(report_command(done, report_arms(record, arms + later), record, settings)).returncode


if __name__ == "__main__":
    sys.exit(main())
