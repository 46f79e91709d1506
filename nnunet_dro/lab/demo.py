"""``nnunet_dro demo``: the whole loop on a synthetic cohort, on CPU, in about an hour on 2 cores
(``--quick``, what ``make demo`` runs: 40 training cases and 80 epochs, about 20 minutes; it shows
the workflow, and its last line says whether nnU-Net's budget sufficed for the comparison to mean
anything).

1. a synthetic fetal-brain-like cohort with hidden stratification (``make-synthetic``), the size
   of the paper's fetal training set: 177 training cases with rare spina-bifida-like (12 %) and
   other (8 %) anatomies, 60 test cases, a third per group;
2. ``nnUNetv2_plan_and_preprocess``;
3. ``nnUNetv2_train`` of nnU-Net's ERM trainer and of the default scale-free DRO setting
   (``nnUNetTrainerDROAdaptive``: f = 0.5, no importance weights), both at the CPU budget of
   :mod:`nnunet_dro.lab.budget` (``<Trainer>_CPUBudget``: a quarter of nnU-Net's features
   per stage, 120 epochs x 25 iterations) and from the same initial weights;
4. ``nnUNetv2_predict`` of the test images with both;
5. ``nnunet_dro evaluate`` by condition and region (white matter, intra-axial CSF, cerebellum),
   printed as the paper's table, with box plots, each run's convergence and stability, and the
   hardest training cases DRO found.

Everything lives in ``OUT`` (its own ``nnUNet_raw``/``_preprocessed``/``_results``), never in the
user's nnU-Net folders. Steps already completed in ``OUT`` are reused when the demo is re-run.
The steps are those of the robustness benchmark (:mod:`nnunet_dro.lab.pipeline`).
"""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from nnunet_dro.lab.arm_runs import ARM_TRAINERS, REGIONS, Budget, progress_filter
from nnunet_dro.lab.cohort_folder import GROUP_COLUMN, MAJORITY_GROUP, MINORITY_GROUPS, Cohort
from nnunet_dro.lab.pipeline import Workspace
from nnunet_dro.lab.run_summary import convergence_line
from nnunet_dro.training.stability import budget_is_tight

DATASET_ID = 990
DATASET_NAME = "SyntheticFetalDemo"
#: method name in the tables -> arm of the pipeline. The DRO arm is nnUNetTrainerDROAdaptive's default
#: setting (the benchmark's arm DROAdaptive; docs/evidence.md).
DEMO_ARMS = {"ERM": "ERM", "DRO": "DROAdaptive"}


def run_demo(output: str | os.PathLike = "nnunet_dro_demo", budget: Budget = Budget(), cohort: Cohort = Cohort(),
             device: str = "cpu", overwrite: bool = False, echo: Callable[[str], None] = print):
    """Run the demo on ``cohort`` (its counts, size and seed; the seed is also the training seed); returns the
    evaluation result (see :func:`nnunet_dro.evaluation.api.evaluate`)."""
    out = Path(output).resolve()
    if overwrite and out.exists():
        shutil.rmtree(out)
    started = time.perf_counter()

    def step(number: int, text: str) -> None:
        echo(f"[demo {number}/5 | {time.perf_counter() - started:6.0f} s] {text}")

    seed = cohort.seed
    ws = Workspace(out, DATASET_ID, DATASET_NAME, cohort, echo=lambda text: echo("  " + text))
    arms = ws.arms
    step(1, f"synthetic cohort: {cohort.n_train} training + {cohort.n_test} test cases of {cohort.size}^3 "
            f"(seed {seed}) in {ws.cohort_folder.raw}")
    step(2, "nnUNetv2_plan_and_preprocess")
    subgroups = ws.cohort_folder.prepare()
    echo("    training set by condition: " + _counts(subgroups[subgroups["split"] == "train"]))
    echo("    test set by condition:     " + _counts(subgroups[subgroups["split"] == "test"]))

    for method, arm in DEMO_ARMS.items():
        trainer = ARM_TRAINERS[arm]
        step(3, f"nnUNetv2_train {DATASET_ID} 3d_fullres all -tr {trainer} [{method}]")
        if arms.finished(arm) or (arms.fold_folder(trainer) / "checkpoint_final.pth").is_file():
            echo(f"    already finished, reusing {arms.fold_folder(trainer)}")
        else:
            arms.train_arm(arm, trainer, seed, budget, device, show=progress_filter(echo))
    summaries = {}
    for method, arm in DEMO_ARMS.items():
        step(4, f"nnUNetv2_predict of the test images (--disable_tta) [{method}]")
        summaries[method], _ = arms.run_arm(arm, ARM_TRAINERS[arm], seed, budget, device, show=progress_filter(echo))

    step(5, "nnunet_dro evaluate by condition and region")
    from nnunet_dro.evaluation.api import evaluate
    from nnunet_dro.evaluation.reports import terminal_table

    result = evaluate(str(ws.cohort_folder.raw / "labelsTs"),
                      {method: str(arms.arm_folder(arm) / "predictions") for method, arm in DEMO_ARMS.items()},
                      str(out / "evaluation"), groups=str(out / "subgroups_test.tsv"), group_by=[GROUP_COLUMN],
                      regions=REGIONS, num_processes=2, progress=False, echo=lambda text: echo("    " + text))
    echo("")
    echo(terminal_table(result))
    echo("\nConvergence and stability of each run:")
    for method, summary in summaries.items():
        echo(convergence_line(f"{method} ({summary['trainer']})", summary))
    _print_hardest(arms.fold_folder(ARM_TRAINERS[DEMO_ARMS["DRO"]]), subgroups, echo)
    echo(f"\nDone in {time.perf_counter() - started:.0f} s. nnU-Net's output: {ws.cohort_folder.log_file}")
    echo("")
    for line in headline_lines(result.summary, out / "evaluation"):
        echo(line)
    echo(regime_line(summaries["ERM"]))
    return result


def regime_line(erm: dict) -> str:
    """What the comparison can show, in one sentence: only where nnU-Net (ERM) had learned every
    structure by half of its epochs (the benchmark's regime check) is it the benchmark's setting.

    >>> regime_line({"epochs": 80, "all_learned_epoch": 65})[:62]
    'what this run shows: nnU-Net had not learned every structure b'
    >>> regime_line({"epochs": 240, "all_learned_epoch": 70})[:58]
    'what this run shows: nnU-Net learned every structure by ep'
    """
    epochs, learned = int(erm.get("epochs", 0)), erm.get("all_learned_epoch")
    if not budget_is_tight(learned, epochs):
        return (f"what this run shows: nnU-Net learned every structure by epoch {learned} of {epochs}, the regime "
                f"of the benchmark's result; the lines above are one paired seed of it (the result over four "
                f"seeds: docs/evidence.md)")
    when = f"first at epoch {learned}" if learned is not None and np.isfinite(float(learned)) else "never"
    return (f"what this run shows: nnU-Net had not learned every structure by half of its {epochs} epochs ({when}), "
            f"so the DRO-ERM differences above are not the benchmark's result (177 cases, 240 epochs, four seeds: "
            f"docs/evidence.md); this run shows the workflow. `make demo-full` runs the benchmark's first budget "
            f"(about an hour)")


def headline_lines(summary: pd.DataFrame, report: Path) -> list[str]:
    """The three lines a demo user came for: each minority's hardest structure (its lowest ERM
    mean) with every arm's p10, the majority's mean per region for every arm, and the report.

    >>> rows = [("ERM", "other", "csf", 70.0, 60.0), ("DRO", "other", "csf", 75.0, 68.5),
    ...         ("ERM", "other", "wm", 90.0, 85.0), ("DRO", "other", "wm", 90.0, 84.0),
    ...         ("ERM", "control", "csf", 92.0, 88.0), ("DRO", "control", "csf", 91.8, 88.0)]
    >>> table = pd.DataFrame(rows, columns=["method", "group", "region", "mean", "p10"])
    >>> table["group_column"], table["metric"] = GROUP_COLUMN, "dice"
    >>> print("\\n".join(headline_lines(table, Path("report"))))
    minority p10 (Dice of the worst tenth), hardest structure: other csf: ERM 60.0, DRO 68.5
    majority (control) mean Dice: ERM csf 92.0; DRO csf 91.8
    report, tables and box plots: report
    """
    dice = summary[(summary["group_column"] == GROUP_COLUMN) & (summary["metric"] == "dice")]
    methods = list(dict.fromkeys(dice["method"]))
    first = methods[0] if methods else None
    minority = []
    for group in MINORITY_GROUPS:
        rows = dice[dice["group"] == group]
        if rows.empty:
            continue
        hardest = rows[rows["method"] == first].sort_values("mean")["region"].iloc[0]
        p10 = rows[rows["region"] == hardest].set_index("method")["p10"]
        minority.append(f"{group} {hardest}: " + ", ".join(f"{m} {p10[m]:.1f}" for m in methods if m in p10))
    controls = dice[dice["group"] == MAJORITY_GROUP]
    majority = "; ".join(f"{m} " + " / ".join(f"{r} {v:.1f}" for r, v in
                                                controls[controls["method"] == m][["region", "mean"]].values)
                         for m in methods)
    return [f"minority p10 (Dice of the worst tenth), hardest structure: {'; '.join(minority) or 'no minority group'}",
            f"majority ({MAJORITY_GROUP}) mean Dice: {majority or 'no majority group'}",
            f"report, tables and box plots: {report}"]


def _counts(table: pd.DataFrame) -> str:
    return ", ".join(f"{k} {v}" for k, v in table[GROUP_COLUMN].value_counts().items())


def _print_hardest(fold_dir: Path, subgroups: pd.DataFrame, echo: Callable[[str], None], k: int = 8) -> None:
    report = fold_dir / "dro_hardness.csv"
    if not report.is_file():
        echo(f"(no hardness report at {report})")
        return
    hardness = pd.read_csv(report, dtype={"case": str})
    merged = hardness.merge(subgroups[["case", GROUP_COLUMN]], on="case", how="left")
    merged = merged.sort_values("stale_loss", ascending=False).head(k)
    echo(f"\nHardest training cases for DRO at the end of training ({report.name}):")
    echo(merged.to_string(index=False))
