"""Robustness benchmark: nnU-Net's ERM trainer vs nnUNetTrainerDRO on the synthetic fetal cohort.

The paper's claim under test (method.md section 5): hardness weighted sampling (DRO) raises the
low percentiles (p10, p5) of the Dice of the minority groups (spina bifida, other abnormality)
while leaving the controls unchanged.

Each repetition ``s`` (``--seeds``) is one full, independent experiment in its own working folder
``OUT/runs/seed_<s>/`` (its own nnUNet_raw / _preprocessed / _results):

1. a synthetic fetal-brain-like cohort drawn with cohort seed ``s`` (``make-synthetic --kind
   fetal``): minorities rare in training (80/12/8 %), a third each in the test set;
2. ``nnUNetv2_plan_and_preprocess``;
3. ``nnUNetv2_train ... all`` of ERM and DRO with the same budget (epochs x iterations), both
   starting from the same initial weights (torch seeded with ``s`` before the network is built;
   DRO's sampler seeded with ``s``); fold ``all`` = every training case, so the (rare) minority
   cases are all seen and the split is fixed;
4. ``nnUNetv2_predict`` of the test images and ``nnunet_dro evaluate`` by condition with the
   FeTA regions (white matter, intra-axial CSF, cerebellum).

Why a new cohort per repetition: with ~5 spina-bifida and ~3 "other" training cases, *which*
minority cases the network sees dominates the variance of the minority percentiles; a fixed
cohort with only the training seed varied would understate it. The training seed also changes
with ``s`` (the augmentation workers are unseeded, as in nnU-Net), so the spread across seeds
covers both sources. ERM and DRO of one repetition share cohort, preprocessing, initial weights
and test cases, so their per-case differences are paired.

Reported (terminal and OUT/): per condition and region, for each arm, the mean, median, p25,
p10, p5 and IQR of the per-case Dice (%) averaged over repetitions (± sd across repetitions);
the paired comparison DRO - ERM: per-repetition differences of those statistics (mean ± sd,
and how many repetitions are > 0), and the per-case differences pooled over repetitions (mean,
two-sided Wilcoxon signed-rank p, Holm-adjusted over all condition x region rows).

    python scripts/benchmark_robustness.py                          # 3 seeds, default budget
    python scripts/benchmark_robustness.py --seeds 3 --epochs 10 --iterations 25 --keep
    python scripts/benchmark_robustness.py --seeds 2 --epochs 1 --iterations 2 --n-train 10 --n-test 6

Outputs in OUT (default results/robustness/): ``summary.md`` (the tables and the claim check),
``summary.csv`` (statistics averaged over seeds), ``paired.csv`` (DRO - ERM),
``summary_by_seed.csv`` and ``per_case.csv`` (every repetition), ``benchmark.json`` (budget,
settings, timings). ``--keep`` reuses every finished step (cohort, preprocessing, trained arms, evaluated
repetitions), so an interrupted benchmark resumes; an interrupted training continues from
nnU-Net's ``checkpoint_latest.pth`` if there is one (nnU-Net writes it every 50 epochs), otherwise
it starts again.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from nnunet_dro.atomic import write_text_atomic
from nnunet_dro.errors import UserError
from nnunet_dro.evaluation.stats import holm, paired_wilcoxon
from nnunet_dro.workflows.demo import (CONFIGURATION, FOLD, DemoBudget, progress_filter, run_python_cli,
                                       trainer_names, write_budget_trainers)
from nnunet_dro.workflows.ensemble import Member, run_ensemble
from nnunet_dro.workflows.nnunet_commands import nnunet_environment, run_nnunet

DATASET_ID = 991
DATASET_NAME = "SyntheticFetalBenchmark"
ARMS = ("ERM", "DRO")
GROUP_COLUMN = "condition"
MINORITY_GROUPS = ("spina_bifida", "other")
CONTROL_GROUP = "control"
STATISTICS = ("mean", "median", "p25", "p10", "p5", "iqr")
PERCENTILES = (25, 10, 5)
#: claim check: a change of at most this many Dice points counts as no change (controls
#: "unchanged"; minority percentiles need more than this, in every seed, to count as raised)
NEGLIGIBLE_POINTS = 1.0
SECONDS_PER_ITERATION = 1.0  # measured: one nnU-Net training iteration at 32^3 on 2 CPU cores


def parse_seeds(text: str) -> list[int]:
    """``"3"`` -> ``[0, 1, 2]``; ``"4,7,9"`` -> ``[4, 7, 9]``.

    >>> parse_seeds("3"), parse_seeds("4,7")
    ([0, 1, 2], [4, 7])
    """
    try:
        if "," in text:
            seeds = [int(part) for part in text.split(",") if part.strip()]
        else:
            seeds = list(range(int(text)))
    except ValueError:
        raise UserError(f"--seeds {text!r}: expected a count (3) or a comma-separated list (0,1,2)") from None
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise UserError(f"--seeds {text!r}: need at least one seed, non-negative and without repeats")
    return seeds


# ---------------------------------------------------------------------------------------- one repetition
def run_repetition(folder: Path, seed: int, budget: DemoBudget, cohort: dict, device: str,
                   echo: Callable[[str], None]) -> pd.DataFrame:
    """Run (or reuse the finished steps of) one repetition; return its per-case Dice table."""
    folder.mkdir(parents=True, exist_ok=True)
    _check_cohort(folder / "cohort.json", cohort)
    log_file = str(folder / "nnunet_commands.log")
    env = nnunet_environment(
        root=folder / "nnunet", extra_trainer_dirs=[folder / "trainers"],
        overrides={"nnUNet_compile": "f", "nnUNet_def_n_proc": "2",
                   "nnUNet_n_proc_DA": os.environ.get("nnUNet_n_proc_DA", "2")})
    raw = Path(env["nnUNet_raw"]) / f"Dataset{DATASET_ID:03d}_{DATASET_NAME}"
    evaluation_root = folder / f"evaluation_{budget.suffix}"
    marker = evaluation_root / "repetition.json"
    if marker.is_file() and (evaluation_root / "evaluation" / "per_case.csv").is_file():
        echo(f"  reusing the finished repetition in {evaluation_root}")
        return pd.read_csv(evaluation_root / "evaluation" / "per_case.csv", dtype={"case": str})

    started = time.perf_counter()
    if not (raw / "dataset.json").is_file():
        echo(f"  cohort: {cohort['n_train']} train + {cohort['n_test']} test cases of {cohort['size']}^3, seed {seed}")
        run_python_cli(["make-synthetic", "--kind", "fetal", "-d", str(DATASET_ID), "-n", DATASET_NAME,
                         "--n-train", str(cohort["n_train"]), "--n-test", str(cohort["n_test"]),
                         "--size", str(cohort["size"]), "--seed", str(seed), "--overwrite"], env, log_file)
    subgroups = pd.read_csv(raw / "subgroups.tsv", sep="\t", dtype={"case": str})
    echo("  training set: " + _counts(subgroups[subgroups["split"] == "train"]) +
         " | test set: " + _counts(subgroups[subgroups["split"] == "test"]))

    if not _preprocessed(Path(env["nnUNet_preprocessed"]) / raw.name, cohort["n_train"]):
        echo("  nnUNetv2_plan_and_preprocess")
        run_nnunet("nnUNetv2_plan_and_preprocess",
                   ["-d", str(DATASET_ID), "-c", CONFIGURATION, "-np", "2", "--verify_dataset_integrity"],
                   env, echo=None, log_file=log_file)

    names = trainer_names(budget)
    # fold "all" validates on the training cases: pointless here, and minutes of CPU per arm
    write_budget_trainers(folder / "trainers", budget, seed=seed, final_validation=False)
    show = progress_filter(echo)
    train_seconds = {}
    for arm in ARMS:
        trainer = names[arm]
        fold_dir = (Path(env["nnUNet_results"]) / raw.name / f"{trainer}__nnUNetPlans__{CONFIGURATION}"
                    / f"fold_{FOLD}")
        if (fold_dir / "checkpoint_final.pth").is_file():
            echo(f"  {arm}: already trained ({fold_dir})")
            continue
        resume = ["--c"] if (fold_dir / "checkpoint_latest.pth").is_file() else []
        echo(f"  {arm}: nnUNetv2_train {DATASET_ID} {CONFIGURATION} {FOLD} -tr {trainer}"
             + (" --c (resuming)" if resume else ""))
        tic = time.perf_counter()
        run_nnunet("nnUNetv2_train", [str(DATASET_ID), CONFIGURATION, FOLD, "-tr", trainer, "-device", device,
                                      *resume], env, echo=show, log_file=log_file)
        train_seconds[arm] = round(time.perf_counter() - tic, 1)

    echo("  predicting the test cases and evaluating by condition and region")
    test_table = folder / "subgroups_test.tsv"
    write_text_atomic(test_table, subgroups[subgroups["split"] == "test"].to_csv(sep="\t", index=False))
    _, result = run_ensemble(
        env, DATASET_ID, str(raw / "imagesTs"), evaluation_root, [Member(arm, names[arm]) for arm in ARMS],
        configuration=CONFIGURATION, folds=[FOLD], device=device, npp=1, nps=1, num_processes=2,
        evaluation=dict(reference=str(raw / "labelsTs"), groups=str(test_table), group_by=[GROUP_COLUMN],
                        regions="feta", percentiles=PERCENTILES, progress=False, echo=echo),
        echo=None)
    write_text_atomic(marker, json.dumps({"seed": seed, "cohort": cohort, "budget": _budget_dict(budget),
                                          "trainers": names, "train_seconds": train_seconds,
                                          "seconds": round(time.perf_counter() - started, 1)}, indent=2))
    return result.per_case


def _preprocessed(folder: Path, n_train: int) -> bool:
    """Planned and every training case preprocessed (nnU-Net writes the plans first, so an
    interrupted run can leave plans without all cases)."""
    cases = folder / f"nnUNetPlans_{CONFIGURATION}"
    return (folder / "nnUNetPlans.json").is_file() and cases.is_dir() and len(list(cases.glob("*.pkl"))) == n_train


def _check_cohort(path: Path, cohort: dict) -> None:
    """A repetition folder holds one cohort: refuse to mix cohort sizes when resuming."""
    if path.is_file():
        found = json.loads(path.read_text())
        if found != cohort:
            raise UserError(f"{path}: this run folder was made with cohort {found}, not {cohort}; "
                            f"use the same --n-train/--n-test/--size, another -o, or --overwrite")
    else:
        write_text_atomic(path, json.dumps(cohort, indent=2))


def _counts(table: pd.DataFrame) -> str:
    return ", ".join(f"{k} {v}" for k, v in table[GROUP_COLUMN].value_counts().items())


def _budget_dict(budget: DemoBudget) -> dict:
    return {"epochs": budget.epochs, "iterations_per_epoch": budget.iterations_per_epoch,
            "val_iterations_per_epoch": budget.val_iterations_per_epoch}


# ---------------------------------------------------------------------------------------- aggregation
def _group_order(per_case: pd.DataFrame) -> list[str]:
    present = list(dict.fromkeys(per_case[GROUP_COLUMN].dropna()))
    known = [g for g in ("control", *MINORITY_GROUPS) if g in present]
    return ["all"] + known + [g for g in present if g not in known]


def _groups_of(per_case: pd.DataFrame):
    """(group name, rows) for 'all' and every condition."""
    for group in _group_order(per_case):
        yield group, per_case if group == "all" else per_case[per_case[GROUP_COLUMN] == group]


def _statistics(values: np.ndarray) -> dict[str, float]:
    values = values[~np.isnan(values)]
    if values.size == 0:
        return {s: np.nan for s in STATISTICS}
    p5, p10, p25, p50, p75 = np.percentile(values, [5, 10, 25, 50, 75])
    return {"mean": float(values.mean()), "median": float(p50), "p25": float(p25), "p10": float(p10),
            "p5": float(p5), "iqr": float(p75 - p25)}


def summary_by_seed(per_case: pd.DataFrame) -> pd.DataFrame:
    """One row per seed, arm, group and region: n and the statistics of the per-case Dice.

    The numbers are those of ``nnunet_dro evaluate``'s summary.csv (numpy percentiles, linear
    interpolation; a region empty in reference and prediction scores 100).
    """
    rows = []
    for group, frame in _groups_of(per_case):
        for (seed, method, region), part in frame.groupby(["seed", "method", "region"], sort=False):
            values = part["value"].to_numpy(float)
            rows.append({"seed": seed, "method": method, "group": group, "region": region,
                         "n": int(np.isfinite(values).sum()), **_statistics(values)})
    return pd.DataFrame(rows)


def summary_over_seeds(by_seed: pd.DataFrame) -> pd.DataFrame:
    """Each statistic averaged over seeds, with its sd across seeds (``<stat>_sd``)."""
    keys = ["method", "group", "region"]
    grouped = by_seed.groupby(keys, sort=False)
    table = grouped[list(STATISTICS)].mean()
    spread = grouped[list(STATISTICS)].std(ddof=1).add_suffix("_sd")
    out = pd.concat([table, spread], axis=1).reset_index()
    out.insert(3, "n_seeds", grouped.size().to_numpy())
    out.insert(4, "n_cases_per_seed", grouped["n"].mean().to_numpy())
    ordered = ["method", "group", "region", "n_seeds", "n_cases_per_seed"]
    for s in STATISTICS:
        ordered += [s, f"{s}_sd"]
    # group, then region, then ERM before DRO: the two arms of a row pair sit together
    rank = {name: i for i, name in enumerate(dict.fromkeys(by_seed["group"]))}
    regions = {name: i for i, name in enumerate(dict.fromkeys(by_seed["region"]))}
    arms = {name: i for i, name in enumerate(ARMS)}
    out = out.assign(_g=out["group"].map(rank), _r=out["region"].map(regions),
                     _m=out["method"].map(lambda m: arms.get(m, len(arms))))
    return out.sort_values(["_g", "_r", "_m"], kind="stable")[ordered].reset_index(drop=True)


def paired_comparison(per_case: pd.DataFrame, by_seed: pd.DataFrame) -> pd.DataFrame:
    """DRO - ERM per group and region.

    ``d_<stat>``: the per-seed difference of the statistic averaged over seeds, ``d_<stat>_sd`` its
    sd across seeds, ``d_<stat>_seeds_up`` how many seeds have it > 0. ``pooled_*``: per-case
    differences pooled over seeds (mean, median, share of cases improved, two-sided Wilcoxon
    signed-rank p and its Holm adjustment over all rows).
    """
    rows = []
    for group, frame in _groups_of(per_case):
        for region in dict.fromkeys(per_case["region"]):
            row = {"group": group, "region": region}
            part = by_seed[(by_seed["group"] == group) & (by_seed["region"] == region)]
            seeds = part.pivot(index="seed", columns="method", values=list(STATISTICS)).dropna(how="all")
            for s in STATISTICS:
                both = (s, "DRO") in seeds and (s, "ERM") in seeds
                diff = (seeds[(s, "DRO")] - seeds[(s, "ERM")]).dropna().to_numpy(float) if both else np.array([])
                row[f"d_{s}"] = float(diff.mean()) if diff.size else np.nan
                row[f"d_{s}_sd"] = float(np.std(diff, ddof=1)) if diff.size > 1 else np.nan
                row[f"d_{s}_seeds_up"] = int((diff > 0).sum())
            row["n_seeds"] = len(seeds)
            pairs = (frame[frame["region"] == region]
                     .pivot_table(index=["seed", "case"], columns="method", values="value", aggfunc="first"))
            if set(ARMS) <= set(pairs.columns):
                dro, erm = pairs["DRO"].to_numpy(float), pairs["ERM"].to_numpy(float)
            else:
                dro = erm = np.array([])
            keep = ~(np.isnan(dro) | np.isnan(erm))
            difference = dro[keep] - erm[keep]
            row.update(pooled_n=int(keep.sum()),
                       pooled_mean=float(difference.mean()) if difference.size else np.nan,
                       pooled_median=float(np.median(difference)) if difference.size else np.nan,
                       pooled_share_improved=float((difference > 0).mean()) if difference.size else np.nan,
                       pooled_wilcoxon_p=paired_wilcoxon(dro, erm))
            rows.append(row)
    table = pd.DataFrame(rows)
    table["pooled_holm_p"] = holm(table["pooled_wilcoxon_p"].tolist())
    return table


def claim_check(paired: pd.DataFrame) -> list[str]:
    """Plain sentences on the paper's claim, by the rules stated in each sentence."""
    lines = []
    n = int(paired["n_seeds"].max()) if len(paired) else 0
    for group in MINORITY_GROUPS:
        for _, row in paired[paired["group"] == group].iterrows():
            verdicts = []
            for s in ("p10", "p5"):
                d, up = row[f"d_{s}"], row[f"d_{s}_seeds_up"]
                if np.isnan(d):
                    verdicts.append(f"{s}: no data")
                    continue
                if abs(d) <= NEGLIGIBLE_POINTS:
                    trend = "negligible"
                elif up == n:
                    trend = "raised in every seed"
                elif up == 0:
                    trend = "lowered in every seed"
                else:
                    trend = "no consistent change"
                verdicts.append(f"{s} {d:+.1f} ({up}/{n} seeds up: {trend})")
            lines.append(f"{group} / {row['region']}: " + "; ".join(verdicts))
    for _, row in paired[paired["group"] == CONTROL_GROUP].iterrows():
        d = row["d_mean"]
        state = ("unchanged" if abs(d) <= NEGLIGIBLE_POINTS else "changed") if not np.isnan(d) else "no data"
        lines.append(f"{CONTROL_GROUP} / {row['region']}: mean {d:+.1f} points: {state}, pooled Wilcoxon p = "
                     f"{row['pooled_wilcoxon_p']:.3g}")
    lines.append(f"(rules: a change of at most {NEGLIGIBLE_POINTS:g} Dice point is negligible / unchanged; "
                 f"'raised' = larger and > 0 in every seed)")
    return lines


# ---------------------------------------------------------------------------------------- reporting
def _pm(value: float, sd: float) -> str:
    if np.isnan(value):
        return "n/a"
    return f"{value:.1f}" if np.isnan(sd) else f"{value:.1f} ± {sd:.1f}"


def _signed(value: float, sd: float, up: int | None = None, n: int | None = None) -> str:
    if np.isnan(value):
        return "n/a"
    text = f"{value:+.1f}" + ("" if np.isnan(sd) else f" ± {sd:.1f}")
    return text + (f" [{up}/{n}]" if up is not None else "")


def markdown_report(summary: pd.DataFrame, paired: pd.DataFrame, settings: dict) -> str:
    seeds = settings["seeds"]
    budget = settings["budget"]
    lines = [
        "# Robustness benchmark: ERM vs DRO on the synthetic fetal-brain-like cohort",
        "",
        f"Repetitions (cohort seed = training seed): {', '.join(map(str, seeds))}. Cohort per repetition: "
        f"{settings['cohort']['n_train']} training cases (control/spina bifida/other about 80/12/8 %), "
        f"{settings['cohort']['n_test']} test cases (a third each), {settings['cohort']['size']}^3 voxels. "
        f"Budget per arm and repetition: {budget['epochs']} epochs x {budget['iterations_per_epoch']} "
        f"iterations ({budget['epochs'] * budget['iterations_per_epoch']} training iterations), nnU-Net "
        f"{CONFIGURATION}, fold {FOLD}, device {settings['device']}. DRO: nnUNetTrainerDRO defaults.",
        "",
        "Dice in percent per test case; statistics per repetition (numpy percentiles, IQR = p75 - p25), "
        "then mean ± sd across repetitions. A region empty in both reference and prediction scores 100.",
        "",
        "## Dice per condition and region (mean ± sd over seeds)",
        "",
        "| group | region | method | n/seed | " + " | ".join(STATISTICS) + " |",
        "|---|---|---|---:|" + "---:|" * len(STATISTICS),
    ]
    for _, r in summary.iterrows():
        lines.append(f"| {r['group']} | {r['region']} | {r['method']} | {r['n_cases_per_seed']:.0f} | "
                     + " | ".join(_pm(r[s], r[f'{s}_sd']) for s in STATISTICS) + " |")
    lines += [
        "",
        "## Paired comparison DRO - ERM",
        "",
        "Per-seed differences of each statistic: mean ± sd over seeds [seeds with DRO > ERM]. Pooled: "
        "per-case differences of all seeds (mean; two-sided Wilcoxon signed-rank p; Holm-adjusted over "
        "all rows).",
        "",
        "| group | region | Δmean | Δp10 | Δp5 | ΔIQR | pooled n | pooled Δ | improved | Wilcoxon p | Holm p |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for _, r in paired.iterrows():
        n = int(r["n_seeds"])
        cells = [_signed(r[f"d_{s}"], r[f"d_{s}_sd"], int(r[f"d_{s}_seeds_up"]), n) for s in ("mean", "p10", "p5", "iqr")]
        lines.append(f"| {r['group']} | {r['region']} | " + " | ".join(cells) +
                     f" | {r['pooled_n']} | {r['pooled_mean']:+.1f} | {100 * r['pooled_share_improved']:.0f} % | "
                     f"{r['pooled_wilcoxon_p']:.3g} | {r['pooled_holm_p']:.3g} |")
    lines += ["", "(ΔIQR < 0 means DRO's Dice is less spread out.)", "",
              "## The paper's claim: DRO raises the low percentiles of the minority groups, controls unchanged", ""]
    lines += [f"- {line}" for line in claim_check(paired)]
    lines += ["", f"Total time {settings['seconds']:.0f} s. Per-repetition folders: `{settings['runs']}`.", ""]
    return "\n".join(lines)


def terminal_report(summary: pd.DataFrame, paired: pd.DataFrame) -> str:
    """Compact fixed-width tables for the terminal."""
    stat_header = "".join(f"{s:>14}" for s in STATISTICS)
    lines = ["Dice (%) per condition and region, mean ± sd over seeds",
             f"{'group':<13}{'region':<17}{'arm':<5}{'n':>4}" + stat_header]
    previous = None
    for _, r in summary.iterrows():
        key = (r["group"], r["region"])
        left = f"{r['group']:<13}{r['region']:<17}" if key != previous else " " * 30
        previous = key
        lines.append(left + f"{r['method']:<5}{r['n_cases_per_seed']:>4.0f}"
                     + "".join(f"{_pm(r[s], r[f'{s}_sd']):>14}" for s in STATISTICS))
    lines += ["", "Paired DRO - ERM: per-seed difference mean ± sd [seeds up]; pooled cases: mean, Wilcoxon p, Holm p",
              f"{'group':<13}{'region':<17}" + "".join(f"{h:>20}" for h in ("Δmean", "Δp10", "Δp5", "ΔIQR"))
              + f"{'pooled Δ':>10}{'p':>9}{'Holm':>9}"]
    for _, r in paired.iterrows():
        n = int(r["n_seeds"])
        lines.append(f"{r['group']:<13}{r['region']:<17}"
                     + "".join(f"{_signed(r[f'd_{s}'], r[f'd_{s}_sd'], int(r[f'd_{s}_seeds_up']), n):>20}"
                               for s in ("mean", "p10", "p5", "iqr"))
                     + f"{r['pooled_mean']:>+10.1f}{r['pooled_wilcoxon_p']:>9.3g}{r['pooled_holm_p']:>9.3g}")
    lines += ["", "Claim check (DRO raises minority p10/p5, controls unchanged):"]
    lines += ["  " + line for line in claim_check(paired)]
    return "\n".join(lines)


def write_outputs(out: Path, per_case: pd.DataFrame, by_seed: pd.DataFrame, summary: pd.DataFrame,
                  paired: pd.DataFrame, settings: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "per_case.csv", per_case.to_csv(index=False))
    write_text_atomic(out / "summary_by_seed.csv", by_seed.to_csv(index=False))
    write_text_atomic(out / "summary.csv", summary.to_csv(index=False))
    write_text_atomic(out / "paired.csv", paired.to_csv(index=False))
    write_text_atomic(out / "benchmark.json", json.dumps(settings, indent=2, default=str))
    write_text_atomic(out / "summary.md", markdown_report(summary, paired, settings))


# ---------------------------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    default = DemoBudget()
    parser = argparse.ArgumentParser(
        description="ERM vs DRO (nnUNetTrainerDRO) with equal budgets on the synthetic fetal-brain-like cohort, "
                    "repeated over seeds; reports Dice mean, p10, p5 and IQR per condition and region and the "
                    "paired comparison.")
    parser.add_argument("--seeds", default="3", help="repetitions: a count N (seeds 0..N-1) or a list 0,1,2; "
                                                     "each seed draws its own cohort and training seed. Default: 3")
    parser.add_argument("--epochs", type=int, default=default.epochs,
                        help=f"training epochs per arm and repetition. Default: {default.epochs}")
    parser.add_argument("--iterations", type=int, default=default.iterations_per_epoch,
                        help=f"training iterations per epoch. Default: {default.iterations_per_epoch}")
    parser.add_argument("--n-train", type=int, default=40, help="training cases per cohort. Default: 40")
    parser.add_argument("--n-test", type=int, default=30, help="test cases per cohort. Default: 30")
    parser.add_argument("--size", type=int, default=32, help="voxels per side. Default: 32")
    parser.add_argument("-o", dest="output", default="results/robustness",
                        help="output and working folder. Default: results/robustness")
    parser.add_argument("-device", default="cpu", choices=["cpu", "cuda", "mps"], help="Default: cpu")
    resume = parser.add_mutually_exclusive_group()
    resume.add_argument("--keep", action="store_true",
                        help="reuse finished steps of earlier runs in OUT/runs (resume an interrupted benchmark)")
    resume.add_argument("--overwrite", action="store_true",
                        help="delete the run folders of the requested seeds first and start again")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except UserError as error:
        print(f"benchmark_robustness: error: {error}", file=sys.stderr)
        return 2


def run(args: argparse.Namespace) -> int:
    seeds = parse_seeds(args.seeds)
    for flag, value, low in (("--epochs", args.epochs, 1), ("--iterations", args.iterations, 1),
                             ("--n-train", args.n_train, 5),
                             ("--n-test", args.n_test, 3), ("--size", args.size, 16)):
        if value < low:
            raise UserError(f"{flag} {value}: must be at least {low}")
    budget = DemoBudget(args.epochs, args.iterations)  # validation iterations: the demo's default
    cohort = {"n_train": args.n_train, "n_test": args.n_test, "size": args.size}
    out = Path(args.output).resolve()
    runs = out / "runs"
    folders = {seed: runs / f"seed_{seed}" for seed in seeds}
    existing = [f for f in folders.values() if f.exists()]
    if existing and args.overwrite:
        for folder in existing:
            shutil.rmtree(folder)
    elif existing and not args.keep:
        raise UserError(f"{existing[0]} exists from an earlier run: pass --keep to reuse its finished steps "
                        f"or --overwrite to start again")

    iterations = budget.epochs * budget.iterations_per_epoch
    total = len(seeds) * len(ARMS) * iterations
    print(f"Budget: {len(seeds)} repetitions (seeds {', '.join(map(str, seeds))}) x {len(ARMS)} arms x "
          f"{budget.epochs} epochs x {budget.iterations_per_epoch} iterations = {total} training iterations "
          f"(~{total * SECONDS_PER_ITERATION / 60:.0f} min at {SECONDS_PER_ITERATION:g} s/iteration on 2 CPU cores, "
          f"plus preprocessing, validation and prediction)")
    print(f"Cohort per repetition: {args.n_train} train + {args.n_test} test cases of {args.size}^3. Output: {out}",
          flush=True)
    started = time.perf_counter()
    tables = []
    for index, seed in enumerate(seeds, 1):
        print(f"[repetition {index}/{len(seeds)} | seed {seed} | {time.perf_counter() - started:6.0f} s] "
              f"{folders[seed]}", flush=True)
        per_case = run_repetition(folders[seed], seed, budget, cohort, args.device,
                                  echo=lambda text: print(text, flush=True))
        per_case = per_case[per_case["metric"] == "dice"].copy()
        per_case.insert(0, "seed", seed)
        tables.append(per_case)

    per_case = pd.concat(tables, ignore_index=True)
    by_seed = summary_by_seed(per_case)
    summary = summary_over_seeds(by_seed)
    paired = paired_comparison(per_case, by_seed)
    settings = {"seeds": seeds, "cohort": cohort, "budget": _budget_dict(budget), "device": args.device,
                "trainers": trainer_names(budget), "dataset": f"Dataset{DATASET_ID:03d}_{DATASET_NAME}",
                "configuration": CONFIGURATION, "fold": FOLD, "regions": "feta", "group_column": GROUP_COLUMN,
                "seconds": round(time.perf_counter() - started, 1), "runs": str(runs)}
    write_outputs(out, per_case, by_seed, summary, paired, settings)
    print("")
    print(terminal_report(summary, paired))
    print(f"\nBudget per arm and repetition: {budget.epochs} epochs x {budget.iterations_per_epoch} iterations; "
          f"{len(seeds)} repetitions; {time.perf_counter() - started:.0f} s in total.")
    print(f"Written: {out / 'summary.md'}, summary.csv, paired.csv, summary_by_seed.csv, per_case.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
