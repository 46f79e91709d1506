"""``scripts/benchmark_robustness.py``, the robustness benchmark: ERM vs DRO arms on the synthetic fetal-brain-like cohort, several seeds.

The claim under test: distributionally robust training raises the low percentiles of the Dice of
the minority groups (spina bifida, other abnormality) on their hardest structure, while the
majority group (controls) keeps its Dice.

Each seed ``s`` is one repetition in ``OUT/runs/seed_<s>/`` (its own nnUNet_raw / _preprocessed /
_results, :mod:`nnunet_dro.lab.pipeline`):

1. a synthetic cohort drawn with seed ``s``: by default 177 training cases, the size of the
   paper's fetal training set (minorities rare, 80/12/8 %, as the paper's 79/16/6 %), and 60 test
   cases (a third each), planned and preprocessed by nnU-Net. With 40 training cases (5 spina
   bifida, 3 "other") the minorities were too few for re-sampling to help much: even label-aware
   balanced sampling lifted one group only; docs/evidence.md has both regimes;
2. every arm trained with ``nnUNetv2_train ... all -tr <arm>_CPUBudget`` (a quarter of nnU-Net's
   features per stage, 120 epochs x 25 iterations) from the same initial weights
   (``nnUNet_dro_seed=s``), then ``nnUNetv2_predict`` of the test images and ``nnunet_dro
   evaluate`` by condition with the FeTA regions (white matter, intra-axial CSF, cerebellum).

Each (seed, arm) result is stored as soon as it is finished and skipped when the script runs
again, so the evidence can be built in pieces (``--arms ERM,DROAdaptive_f50 --seeds 0,1,2`` now,
the other arms later) and the tables re-made from stored results (``--report-only``).

Reported (terminal and OUT/): per arm, group and region: mean, p10, p5, IQR (mean ± sd over seeds);
every arm minus ERM, paired by seed, with the sign in each seed; each run's convergence (controls'
mean Dice) and stability (epochs after epoch 10 with a structure's pseudo-Dice below 0.05); the
targets check; per seed, each arm's p10 difference on each minority's hardest structure with a
bootstrap interval over the test cases (``p10_intervals.csv``: is that seed's difference more than
the draw of test cases?); with ``--large-test N`` the headline again on N further test cases per
group scored by the same networks, and with ``--shifted-test N`` on the same anatomies acquired at a
new centre (site_C: thick slices, more noise, flatter contrast); with ``--training-fit`` each minority's hardest structure on the
training cases beside the test cases; with ``--also-against ARM[,ARM]`` those p10 intervals
against other arms trained under the same conditions (``ERM_repeat``, ``DROAdaptive_repeat``);
``robustness_tradeoff.png`` (minority p10 on its hardest structure against the controls' mean
Dice, one point per arm and seed).

    python scripts/benchmark_robustness.py                                  # 3 seeds x 5 arms
    python scripts/benchmark_robustness.py --arms ERM,DROAdaptive_f50 --seeds 0,1,2
    python scripts/benchmark_robustness.py --report-only                    # tables from stored runs
    python scripts/benchmark_robustness.py --seeds 1 --arms ERM,DROAdaptive_f50 --epochs 1 --iterations 2 \\
        --n-train 10 --n-test 6 -o /tmp/smoke                                # a smoke run
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Sequence

import pandas as pd

from nnunet_dro.atomic import atomic_path, write_text_atomic
from nnunet_dro.data.subgroups import SUBGROUPS_FILENAME
from nnunet_dro.errors import UserError
from nnunet_dro.lab.arm_runs import (
    ARM_TRAINERS,
    CALIBRATION_CHECK,
    FURTHER_RESULTS,
    HD95_RESULTS,
    JTT_ARM,
    JTT_SETTINGS,
    Budget,
    arm_run,
    folder_lock,
    progress_filter,
)
from nnunet_dro.lab.benchmark_analysis import (
    BASELINE,
    DEFAULT_ARMS,
    against_section,
    further_test_section,
    hardest_regions,
    hd95_worst_tenth,
    label_noise_section,
    learning_time_section,
    markdown_report,
    p10_interval_section,
    p10_intervals,
    paired_comparison,
    parse_arms,
    parse_seeds,
    plot_tradeoff,
    summary_by_seed,
    summary_over_seeds,
    targets_check,
    terminal_report,
    training_fit,
    training_fit_curve,
    training_fit_section,
)
from nnunet_dro.lab.budget import CPUBudget
from nnunet_dro.lab.calibration import calibration_row, plateau_rows
from nnunet_dro.lab.cohort_folder import AUDIT_EXCLUDED_RECORD, PLANS, Cohort
from nnunet_dro.lab.label_noise import RECORD as LABEL_NOISE_RECORD
from nnunet_dro.lab.pipeline import Workspace
from nnunet_dro.lab.run_summary import convergence_line
from nnunet_dro.lab.splits import SPLITS_FILENAME
from nnunet_dro.training.case_tables import CASE_WEIGHTS_FILENAME

DATASET_ID = 991
DATASET_NAME = "SyntheticFetalBenchmark"
LARGE_TEST_DATASET_ID = 992  # --large-test: further test cases, scored with the same trained networks
SHIFTED_TEST_DATASET_ID = 993  # --shifted-test: those cases' anatomies at a new centre
FURTHER_TEST_IDS = {"large_test": LARGE_TEST_DATASET_ID, "shifted_test": SHIFTED_TEST_DATASET_ID}


# ---------------------------------------------------------------------------------------- record
def record_files(ws: Workspace, arm: str, trainer: str, plans: str = PLANS) -> list[Path]:
    """The files of a finished (seed, arm) trained by ``trainer`` that ``--report-only`` reads: the
    cohort settings, the subgroup table, the arm's result and per-case Dice, its hardness report if
    it has one, its case-weight table if it trained with one (the JTT arm's error set), its Dice on
    the larger test set, at the new centre and on its training cases if they were scored
    (``--large-test``, ``--shifted-test``, ``--training-fit``), which training cases had their labels corrupted (``--label-noise``:
    without it the record could not say how often the noisy cases were drawn) and which the audit
    took out (``--exclude-flagged``)."""
    folder, arm_folder = ws.cohort_folder.folder, ws.arms.arm_folder(arm)
    files = [folder / "cohort.json", folder / LABEL_NOISE_RECORD, folder / AUDIT_EXCLUDED_RECORD,
             ws.cohort_folder.raw / SUBGROUPS_FILENAME,
             ws.cohort_folder.preprocessed / SPLITS_FILENAME,  # fold 0's cases: --report-only reads them
             arm_folder / "result.json",
             arm_folder / "per_case.csv", ws.draws.hardness_report_file(trainer, plans),
             arm_folder / CASE_WEIGHTS_FILENAME,
             *(folder / f"{cases}.json" for cases in FURTHER_TEST_IDS),
             *(arm_folder / name for name in FURTHER_RESULTS.values()),
             *(arm_folder / name for name in HD95_RESULTS.values()),
             arm_folder / CALIBRATION_CHECK,
             *sorted(arm_folder.glob("per_case_training_epoch_*.csv"))]
    return [f for f in files if f.is_file()]


def export_record(ws: Workspace, arm: str, trainer: str, destination: Path, plans: str = PLANS) -> int:
    """Copy :func:`record_files` to the same place under ``destination / runs / seed_<s>``, each
    atomically; return how many were copied."""
    files = record_files(ws, arm, trainer, plans)
    target = destination / "runs" / ws.cohort_folder.folder.name
    for source in files:
        path = target / source.relative_to(ws.cohort_folder.folder)
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            shutil.copyfile(source, tmp)
    return len(files)


# ---------------------------------------------------------------------------------------- main
def preparation_lock(folder: Path):
    """Hold :func:`folder_lock` ``folder/.prepare.lock`` while the cohort is made and preprocessed:
    two benchmark processes started on one folder would otherwise both write the same raw and
    preprocessed files."""
    return folder_lock(folder / ".prepare.lock")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="ERM vs DRO arms (CPU-budget nnU-Net trainers) on the synthetic fetal-brain-like cohort, "
                    "paired over seeds; stores each (seed, arm) as it finishes and reports Dice mean, p10, p5 "
                    "and IQR per condition and region, paired differences to ERM and the trade-off plot.")
    parser.add_argument("--seeds", default="3", help="a count N (seeds 0..N-1) or a list 0,1,2 (one seed alone: 2,). Default: 3")
    parser.add_argument("--arms", default=",".join(DEFAULT_ARMS),
                        help=f"comma-separated arms among {', '.join(ARM_TRAINERS)}. {JTT_ARM}: Just Train Twice, "
                             f"a second training drawing the cases the {BASELINE} arm's network fits worst on its "
                             f"training cases (worst {JTT_SETTINGS['fraction']:g} by their worst region's Dice) "
                             f"{JTT_SETTINGS['upweight']:g} times as often. Default: {','.join(DEFAULT_ARMS)}")
    parser.add_argument("--epochs", type=int, default=None,
                        help="override the budget's 120 epochs (1 for smoke runs; 240 leaves few seeds with a tight "
                             "budget, at twice the time)")
    parser.add_argument("--iterations", type=int, default=None,
                        help="override the budget's iterations per epoch (smoke runs only)")
    parser.add_argument("--n-train", type=int, default=Cohort.n_train,
                        help=f"training cases per cohort. Default: {Cohort.n_train} (the paper's fetal training set)")
    parser.add_argument("--n-test", type=int, default=Cohort.n_test,
                        help=f"test cases per cohort (a third per group). Default: {Cohort.n_test}")
    parser.add_argument("--size", type=int, default=32, help="voxels per side. Default: 32")
    parser.add_argument("--label-noise", type=int, default=0, metavar="K",
                        help="corrupt the labels of K training cases (half from the minorities; in turn a structure "
                             "erased, two labels swapped, the mask shifted), seeded; the test cases stay clean; the "
                             "report gives each arm's share of draws on them. Default: 0 (clean)")
    parser.add_argument("--exclude-flagged", action="store_true",
                        help="after the label noise, run 'nnunet_dro audit-labels' on the training labels (within "
                             "condition, its defaults) and train every arm without the flagged cases, as a user who "
                             "drops every flagged case would; the test cases are kept. Default: off")
    parser.add_argument("-o", dest="output", default="results/robustness",
                        help="output and working folder. Default: results/robustness")
    parser.add_argument("-device", default="cpu", choices=["cpu", "cuda", "mps"], help="Default: cpu")
    parser.add_argument("--large-test", type=int, default=0, metavar="N",
                        help="also score every finished arm of these seeds on N further test cases per group (an "
                             "independent draw of the generator; the trained networks are reused, nothing is "
                             "retrained): a p10 of 20 cases interpolates between the 2nd and 3rd worst. "
                             "--report-only reports what was scored before. Default: 0 (off)")
    parser.add_argument("--shifted-test", type=int, default=0, metavar="N",
                        help="also score every finished arm of these seeds on N test cases per group acquired at a "
                             "new centre (site_C: thick slices, more noise and bias field, flatter grey/white "
                             "contrast; no training case comes from it), drawn with the larger test set's seed: with "
                             "the same N its anatomies and labels, so the paired difference to it is the shift's. "
                             "Nothing is retrained. Default: 0 (off)")
    parser.add_argument("--training-fit", action="store_true",
                        help="also score every finished arm's network on its own training cases: where an arm that "
                             "draws a minority more often lifts its training Dice and the test follows, it was "
                             "under-fitted for being rare; where the training Dice barely moves, more draws do not "
                             "help it")
    parser.add_argument("--plane", type=float, default=None, metavar="X",
                        help="train the 2D cohort instead: each case of the same generator cut at the parasagittal "
                             "plane x = X in (-1, 1) (0.11 in the converged regime), --size pixels per side, nnU-Net's "
                             "2d configuration (nnunet_dro.lab.cohort2d). Default: 3D volumes, 3d_fullres")
    parser.add_argument("--validation-fold", action="store_true",
                        help="train fold 0 of a split stratified by condition (splits_final.json) and keep nnU-Net's "
                             "final validation on its held-out fifth, instead of fold 'all' (the converged regime's "
                             "calibration reads ERM's validation). Default: off")
    parser.add_argument("--keep-checkpoints", default="", metavar="P[,P]",
                        help="also keep each arm's network after these percentages of its epochs "
                             "(checkpoint_epoch_<E>.pth); with --training-fit each is scored on the training cases "
                             "(training_fit_curve.csv: where ERM's fit of its rare cases still rises at the end, the "
                             "budget is truncated). Default: none")
    parser.add_argument("--torch-threads", type=int, default=None, metavar="N",
                        help="torch's threads in each training (default: nnU-Net's choice on CPU, every core). Two "
                             "benchmarks side by side on 2 cores, each started under 'taskset -c <core>' with "
                             "--torch-threads 1, finish about 1.2 times sooner than one after the other")
    parser.add_argument("--also-against", metavar="ARM[,ARM]", default="",
                        help="also pair every arm with each ARM, arms of --arms other than ERM (e.g. ERM_repeat or "
                             "DROAdaptive_repeat: runs trained under the same conditions as the arms they are read "
                             "against): each arm's p10 difference to it on the minorities' hardest structures, per "
                             "seed with bootstrap intervals, on the test cases and the larger test set "
                             "(p10_intervals_vs_ARM.csv, p10_intervals_large_test_vs_ARM.csv, a section of "
                             "summary.md). Default: none")
    parser.add_argument("--train-only", action="store_true",
                        help="only train the listed arms' networks (ERM need not be among them), without predictions "
                             "or report: a second benchmark process on the same -o folder, e.g. 'taskset -c 1 ... "
                             "--train-only --arms DROAdaptive' beside 'taskset -c 0 ... --arms ERM', so that two arms "
                             "of one seed train side by side on one cohort (preparing the folder is locked: the "
                             "second waits for the first). A later run with all arms predicts and reports, "
                             "training nothing again")
    parser.add_argument("--report-only", action="store_true",
                        help="train nothing: make the tables from the stored results of the requested seeds/arms")
    parser.add_argument("--overwrite", action="store_true",
                        help="delete the run folders of the requested seeds first and start again")
    parser.add_argument("--export-record", metavar="DIR", default=None,
                        help="also copy the few small files of each finished (seed, arm) that the tables are made "
                             "from (results, per-case Dice, subgroups, hardness reports: kilobytes, not the "
                             "run folders' gigabytes) to DIR, so that '--report-only -o DIR' re-makes them")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except UserError as error:
        print(f"benchmark_robustness: error: {error}", file=sys.stderr)
        return 2


def run(args: argparse.Namespace) -> int:
    seeds, arms = parse_seeds(args.seeds), parse_arms(args.arms)
    if args.train_only and args.report_only:
        raise UserError("--train-only and --report-only: choose one (the first trains, the second reports)")
    if BASELINE not in arms and not args.train_only:
        raise UserError(f"--arms {args.arms!r}: the comparison needs the {BASELINE} arm")
    against_arms = [a.strip() for a in args.also_against.split(",")] if args.also_against.strip() else []
    if any(a not in arms or a == BASELINE for a in against_arms) or len(set(against_arms)) < len(against_arms):
        raise UserError(f"--also-against {args.also_against!r}: expected distinct arms of --arms other than "
                        f"{BASELINE} ({', '.join(a for a in arms if a != BASELINE) or 'none'})")
    for flag, value, low in (("--epochs", args.epochs, 1), ("--iterations", args.iterations, 1),
                             ("--n-train", args.n_train, 5), ("--n-test", args.n_test, 3), ("--size", args.size, 16),
                             ("--large-test", args.large_test, 0), ("--shifted-test", args.shifted_test, 0),
                             ("--label-noise", args.label_noise, 0),
                             ("--torch-threads", args.torch_threads, 1)):
        if value is not None and value < low:
            raise UserError(f"{flag} {value}: must be at least {low}")
    try:
        keep = tuple(float(p) for p in args.keep_checkpoints.split(",") if p.strip())
    except ValueError:
        raise UserError(f"--keep-checkpoints {args.keep_checkpoints!r}: expected percentages, e.g. 50,75") from None
    if any(not 0 < p < 100 for p in keep):
        raise UserError(f"--keep-checkpoints {args.keep_checkpoints!r}: each percentage must lie strictly between 0 "
                        f"and 100 (the final network is kept anyway)")
    if args.plane is not None and not -1 < args.plane < 1:
        raise UserError(f"--plane {args.plane}: must lie strictly between -1 and 1")
    budget = Budget(args.epochs, args.iterations, keep)
    epochs = budget.epochs or CPUBudget.short_epochs  # the schedule the calibration tests read
    out = Path(args.output).resolve()
    runs_folder = out / "runs"
    record = None if args.export_record is None else Path(args.export_record).resolve()
    if record is not None and record == out:
        raise UserError(f"--export-record {args.export_record}: must be another folder than -o {args.output}")
    if args.overwrite and not args.report_only:
        for seed in seeds:
            shutil.rmtree(runs_folder / f"seed_{seed}", ignore_errors=True)
    started = time.perf_counter()
    say = lambda text: print(text, flush=True)  # noqa: E731
    further_sizes = {"large_test": args.large_test, "shifted_test": args.shifted_test}
    tables, training_tables, curve_tables, hd95_tables, run_rows, checks = [], [], [], [], [], []
    further_tables: dict[str, list[pd.DataFrame]] = {cases: [] for cases in FURTHER_TEST_IDS}
    for seed in seeds:
        cohort = Cohort(args.n_train, args.n_test, args.size, seed, args.label_noise, args.exclude_flagged,
                        args.plane, args.validation_fold)
        folder = runs_folder / f"seed_{seed}"
        if args.report_only and not folder.is_dir():
            continue
        ws = Workspace(folder, DATASET_ID, DATASET_NAME, cohort, echo=say, torch_threads=args.torch_threads)
        cohort_folder, arm_runs, draws = ws.cohort_folder, ws.arms, ws.draws
        pending = [arm for arm in arms if not arm_runs.finished(arm)]
        if not args.report_only:
            with preparation_lock(folder):  # a second process on this folder (--train-only) waits here
                for cases, per_group in further_sizes.items():
                    if per_group:
                        cohort_folder.prepare_further_test(cases, per_group, FURTHER_TEST_IDS[cases])
                if pending:
                    say(f"[seed {seed} | {time.perf_counter() - started:6.0f} s] {folder}: to run {', '.join(pending)}")
                    cohort_folder.prepare()
        if args.train_only:
            for arm in pending:
                arm_runs.train_arm(arm, ARM_TRAINERS[arm], seed, budget, args.device, show=progress_filter(say))
                say(f"[seed {seed} | {time.perf_counter() - started:6.0f} s] {arm}: trained; a run with every arm "
                    f"predicts and reports it")
            continue
        for arm in arms:
            if not arm_runs.finished(arm):
                if args.report_only:
                    continue
                arm_runs.run_arm(arm, ARM_TRAINERS[arm], seed, budget, args.device, show=progress_filter(say))
            summary, per_case = arm_runs.load(arm)
            stored_budget = {k: v for k, v in (summary.get("budget") or {}).items() if k != "keep_checkpoints"}
            if stored_budget != {"epochs": budget.epochs, "iterations_per_epoch": budget.iterations_per_epoch}:
                raise UserError(f"{arm_runs.arm_folder(arm)}: stored with budget {summary.get('budget')}, not "
                                f"{budget}; use another -o or --overwrite")
            # computed now, not stored: stored results predate it, and the runs' folders hold the counts
            trainer, plans = arm_run(arm, summary)
            summary.update({f"draw_share_{group}": share
                            for group, share in draws.draw_shares(trainer, finished=True, plans=plans).items()},
                           minority_hardness_auc=draws.minority_hardness_auc(trainer, plans),
                           busiest_case_draws=draws.busiest_case_draws(trainer, plans),
                           noisy_draw_share=draws.noisy_draw_share(trainer, plans),
                           noisy_cases=len(cohort_folder.noisy_cases()),
                           training_cases=cohort_folder.training_case_count())
            say(convergence_line(f"{arm} seed {seed}", summary))
            for cases, per_group in further_sizes.items():
                if per_group and not args.report_only:
                    arm_runs.score_further(arm, trainer, cases, FURTHER_TEST_IDS[cases], args.device)
            if args.training_fit and not args.report_only:
                arm_runs.score_further(arm, trainer, "training", device=args.device)
                if keep:
                    arm_runs.score_training_curve(arm, trainer, device=args.device)
            trained = cohort_folder.fold_training_cases()  # None for fold "all"
            for cases, kept in (*further_tables.items(), ("training", training_tables)):
                scored = arm_runs.load_further(arm, cases)
                if scored is not None:
                    if cases == "training" and trained is not None:  # fold 0: the cases it trained on
                        scored = scored[scored["case"].isin(trained)]
                    kept.append(scored.assign(seed=seed, method=arm))
            # an ERM run's exclusion test, while its fold folder is here (the converged regime)
            check = (arm_runs.store_calibration_check(arm, trainer, epochs) if not args.report_only
                     else None) or arm_runs.load_calibration_check(arm)
            if check is not None:
                checks.append({"seed": seed, "arm": arm, **calibration_row(check)})
            hd95 = arm_runs.load_hd95(arm)
            if hd95 is not None:
                hd95_tables.append(hd95.assign(seed=seed, method=arm))
            curve = arm_runs.load_training_curve(arm)
            if curve is not None:
                curve_tables.append((curve if trained is None else curve[curve["case"].isin(trained)])
                                    .assign(seed=seed, method=arm))
            if record is not None:
                export_record(ws, arm, trainer, record, plans)
            per_case = per_case.assign(seed=seed, method=arm)
            tables.append(per_case)
            run_rows.append(summary)
    if args.train_only:
        return 0
    if not tables:
        raise UserError(f"no finished runs in {runs_folder} for seeds {seeds} and arms {arms}")

    per_case = pd.concat(tables, ignore_index=True)
    runs = pd.DataFrame(run_rows)
    by_seed = summary_by_seed(per_case)
    summary = summary_over_seeds(by_seed, arms)
    paired = paired_comparison(per_case, by_seed)
    hardest = hardest_regions(summary)
    targets = targets_check(by_seed, paired, runs, hardest)
    settings = {"seeds": sorted(set(runs["seed"])), "arms": [a for a in arms if a in set(runs["arm"])],
                "cohort": {"n_train": args.n_train, "n_test": args.n_test, "size": args.size,
                           "label_noise": args.label_noise, "exclude_flagged": args.exclude_flagged,
                           "plane": args.plane, "validation_fold": args.validation_fold},
                "budget": ("CPU budget defaults: 120 epochs x 25 iterations" if budget == Budget()
                           else f"overridden: {budget}"),
                "device": args.device, "seconds": round(time.perf_counter() - started, 1), "runs": str(runs_folder)}
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "per_case.csv", per_case.to_csv(index=False))
    write_text_atomic(out / "summary_by_seed.csv", by_seed.to_csv(index=False))
    write_text_atomic(out / "summary.csv", summary.to_csv(index=False))
    write_text_atomic(out / "paired.csv", paired.to_csv(index=False))
    write_text_atomic(out / "runs.csv", runs.drop(columns=["cohort"], errors="ignore").to_csv(index=False))
    write_text_atomic(out / "benchmark.json", json.dumps({**settings, "hardest": hardest}, indent=2, default=str))
    intervals = p10_intervals(per_case, hardest)
    write_text_atomic(out / "p10_intervals.csv", intervals.to_csv(index=False))
    sections = learning_time_section(per_case, runs, hardest, settings["arms"]) + p10_interval_section(intervals)
    sections += label_noise_section(runs, args.n_train)
    further = {cases: pd.concat(kept, ignore_index=True) for cases, kept in further_tables.items() if kept}
    for cases, table in further.items():
        write_text_atomic(out / FURTHER_RESULTS[cases], table.to_csv(index=False))
        table_intervals = p10_intervals(table, hardest)
        write_text_atomic(out / f"p10_intervals_{cases}.csv", table_intervals.to_csv(index=False))
        sections += further_test_section(cases, table, runs, hardest, settings["arms"], table_intervals)
    for other in against_arms:
        against = p10_intervals(per_case, hardest, baseline=other)
        write_text_atomic(out / f"p10_intervals_vs_{other}.csv", against.to_csv(index=False))
        large_against = None
        if "large_test" in further:
            large_against = p10_intervals(further["large_test"], hardest, baseline=other)
            write_text_atomic(out / f"p10_intervals_large_test_vs_{other}.csv", large_against.to_csv(index=False))
        sections += against_section(against, other, large_against)
    if training_tables:
        fit = training_fit(pd.concat(training_tables, ignore_index=True), per_case, hardest)
        write_text_atomic(out / "training_fit.csv", fit.to_csv(index=False))
        sections += training_fit_section(fit)
    if hd95_tables:
        hd95 = pd.concat(hd95_tables, ignore_index=True)
        write_text_atomic(out / HD95_RESULTS["large_test"], hd95.to_csv(index=False))
        write_text_atomic(out / "hd95_large_test.csv", hd95_worst_tenth(hd95).to_csv(index=False))
    plateau = []
    if curve_tables:
        curve_summary = training_fit_curve(pd.concat(curve_tables, ignore_index=True))
        write_text_atomic(out / "training_fit_curve.csv", curve_summary.to_csv(index=False))
        plateau = plateau_rows(curve_summary, epochs)
    if checks or plateau:  # the calibration's (i) and (ii), one row per ERM run
        frames = [pd.DataFrame(rows) if rows else pd.DataFrame(columns=["seed", "arm"]) for rows in (plateau, checks)]
        write_text_atomic(out / "calibration_checks.csv",
                          frames[0].merge(frames[1], on=["seed", "arm"], how="outer").to_csv(index=False))
    write_text_atomic(out / "summary.md", markdown_report(summary, paired, runs, settings, hardest, targets, sections))
    plot_tradeoff(out / "robustness_tradeoff.png", by_seed, hardest, settings["arms"])
    say("")
    say(terminal_report(summary, paired, targets))
    say(f"\nWritten: {out / 'summary.md'}, summary.csv, paired.csv, p10_intervals.csv, runs.csv, robustness_tradeoff.png"
        + "".join(f", {FURTHER_RESULTS[cases]}, p10_intervals_{cases}.csv" for cases in further)
        + (", training_fit.csv" if training_tables else "") + (", training_fit_curve.csv" if curve_tables else "")
        + (", hd95_large_test.csv" if hd95_tables else "") + (", calibration_checks.csv" if checks or plateau else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
