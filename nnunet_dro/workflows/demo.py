"""``nnunet_dro demo``: the whole loop on a small synthetic cohort, on CPU, in about 15 minutes.

1. a synthetic fetal-brain-like cohort with hidden stratification (``make-synthetic``): rare
   spina-bifida-like and other anatomies in training, a third each in the test set;
2. ``nnUNetv2_plan_and_preprocess``;
3. ``nnUNetv2_train`` of nnU-Net's ERM trainer and of ``nnUNetTrainerDRO`` with the same small
   budget (subclasses written to ``OUT/trainers`` that only set the number of epochs and
   iterations; their names carry the budget, nnU-Net style);
4. ``nnUNetv2_predict`` of the test images with both;
5. ``nnunet_dro evaluate`` by condition and region (white matter, intra-axial CSF, cerebellum),
   printed as the paper's table, with box plots, and the hardest training cases DRO found.

Everything lives in ``OUT`` (its own ``nnUNet_raw``/``_preprocessed``/``_results``), never in the
user's nnU-Net folders. Steps already completed in ``OUT`` are reused when the demo is re-run.
"""
from __future__ import annotations

import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pandas as pd

from nnunet_dro.atomic import write_text_atomic
from nnunet_dro.errors import UserError
from nnunet_dro.workflows.ensemble import Member, run_ensemble
from nnunet_dro.workflows.nnunet_commands import nnunet_environment, run_nnunet

DATASET_ID = 990
DATASET_NAME = "SyntheticFetalDemo"
CONFIGURATION = "3d_fullres"
FOLD = "all"


@dataclass(frozen=True)
class DemoBudget:
    """Training budget of each arm (identical for ERM and DRO)."""
    epochs: int = 12
    iterations_per_epoch: int = 25
    val_iterations_per_epoch: int = 3

    def scaled(self, factor: float) -> "DemoBudget":
        return DemoBudget(max(1, round(self.epochs * factor)), self.iterations_per_epoch,
                          self.val_iterations_per_epoch)

    @property
    def suffix(self) -> str:
        return f"Demo_{self.epochs}ep_{self.iterations_per_epoch}it"


def trainer_names(budget: DemoBudget) -> dict[str, str]:
    """Method name in the tables -> trainer class name."""
    return {"ERM": f"nnUNetTrainer_{budget.suffix}", "DRO": f"nnUNetTrainerDRO_{budget.suffix}"}


def write_budget_trainers(folder: Path, budget: DemoBudget, seed: int | None = None,
                          final_validation: bool = True) -> None:
    """A module for nnU-Net's nnUNet_extTrainer lookup with the two budget subclasses.

    ``seed`` (optional): both trainers seed torch right before nnU-Net builds the network, so the
    two arms start from the same initial weights, and DRO's sampler draws from that seed (the
    data-augmentation workers stay unseeded, as in nnU-Net).
    ``final_validation=False`` skips nnU-Net's validation at the end of training (with fold
    ``all`` it only re-predicts the training cases; benchmarks evaluate the test set instead).
    """
    names = trainer_names(budget)
    body = [
        '"""Written by `nnunet_dro demo`: ERM and DRO trainers with the same small budget."""',
        "import torch",
        "from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer",
        "from nnunet_dro.training import nnUNetTrainerDRO",
        "",
    ]
    for base, name in (("nnUNetTrainer", names["ERM"]), ("nnUNetTrainerDRO", names["DRO"])):
        body += ["", f"class {name}({base}):"]
        if seed is not None and base == "nnUNetTrainerDRO":
            body += [f"    dro_seed = {int(seed)}", ""]
        body += [
            "    def __init__(self, plans, configuration, fold, dataset_json, device=torch.device('cuda')):",
            "        super().__init__(plans, configuration, fold, dataset_json, device)",
            f"        self.num_epochs = {budget.epochs}",
            f"        self.num_iterations_per_epoch = {budget.iterations_per_epoch}",
            f"        self.num_val_iterations_per_epoch = {budget.val_iterations_per_epoch}",
            "",
        ]
        if not final_validation:
            body += [
                "    def perform_actual_validation(self, save_probabilities=False):",
                "        self.print_to_log_file('final validation skipped (write_budget_trainers)')",
                "",
            ]
        if seed is not None:
            body += [
                "    def initialize(self):",
                f"        torch.manual_seed({int(seed)})  # same initial weights in both arms",
                "        super().initialize()",
                "",
            ]
    folder.mkdir(parents=True, exist_ok=True)
    write_text_atomic(folder / "nnunet_dro_demo_trainers.py", "\n".join(body))


_PROGRESS_MARKERS = ("Epoch ", "train_loss", "val_loss", "Pseudo dice", "Epoch time", "DRO:",
                     "Error", "error", "Traceback", "Training done", "Predicting", "Done with")


def progress_filter(echo: Callable[[str], None]) -> Callable[[str], None]:
    """nnU-Net is chatty: show the lines that tell progress; the rest goes to the log file."""
    def show(line: str) -> None:
        if any(marker in line for marker in _PROGRESS_MARKERS):
            echo("    " + line.strip())
    return show


def run_demo(output: str | os.PathLike = "nnunet_dro_demo", budget: DemoBudget = DemoBudget(),
             n_train: int = 40, n_test: int = 30, size: int = 32, seed: int = 0, device: str = "cpu",
             overwrite: bool = False, echo: Callable[[str], None] = print):
    """Run the demo; returns the evaluation result (see :func:`nnunet_dro.evaluation.api.evaluate`)."""
    out = Path(output).resolve()
    if overwrite and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    log_file = str(out / "nnunet_commands.log")
    env = nnunet_environment(
        root=out / "nnunet", extra_trainer_dirs=[out / "trainers"],
        overrides={"nnUNet_compile": "f", "nnUNet_def_n_proc": "2",
                   "nnUNet_n_proc_DA": os.environ.get("nnUNet_n_proc_DA", "2")})
    raw = Path(env["nnUNet_raw"]) / f"Dataset{DATASET_ID:03d}_{DATASET_NAME}"
    names = trainer_names(budget)
    started = time.perf_counter()
    show = progress_filter(echo)

    def step(number: int, text: str) -> None:
        echo(f"[demo {number}/5 | {time.perf_counter() - started:6.0f} s] {text}")

    step(1, f"synthetic cohort: {n_train} training + {n_test} test cases of {size}^3 (seed {seed}) in {raw}")
    if not (raw / "dataset.json").is_file():
        run_python_cli(["make-synthetic", "--kind", "fetal", "-d", str(DATASET_ID), "-n", DATASET_NAME,
                         "--n-train", str(n_train), "--n-test", str(n_test), "--size", str(size),
                         "--seed", str(seed)], env, log_file)
    subgroups = pd.read_csv(raw / "subgroups.tsv", sep="\t", dtype={"case": str})
    echo("    training set by condition: " + _counts(subgroups[subgroups["split"] == "train"], "condition"))
    echo("    test set by condition:     " + _counts(subgroups[subgroups["split"] == "test"], "condition"))

    step(2, "nnUNetv2_plan_and_preprocess")
    preprocessed = Path(env["nnUNet_preprocessed"]) / raw.name
    if not (preprocessed / "nnUNetPlans.json").is_file():
        # nnU-Net's planner calls torch.set_num_threads(nnUNet_n_proc_DA), which fails for 0
        plan_env = {**env, "nnUNet_n_proc_DA": str(max(1, int(env["nnUNet_n_proc_DA"])))}
        run_nnunet("nnUNetv2_plan_and_preprocess",
                   ["-d", str(DATASET_ID), "-c", CONFIGURATION, "-np", "2", "--verify_dataset_integrity"],
                   plan_env, echo=None, log_file=log_file)

    # fold "all" validates on its own training cases: skip that, the test set is evaluated below
    write_budget_trainers(out / "trainers", budget, final_validation=False)
    for method, trainer in names.items():
        step(3, f"nnUNetv2_train {DATASET_ID} {CONFIGURATION} {FOLD} -tr {trainer} "
                f"({budget.epochs} epochs x {budget.iterations_per_epoch} iterations) [{method}]")
        fold_dir = (Path(env["nnUNet_results"]) / raw.name / f"{trainer}__nnUNetPlans__{CONFIGURATION}"
                    / f"fold_{FOLD}")
        if (fold_dir / "checkpoint_final.pth").is_file():
            echo("    already trained, reusing " + str(fold_dir))
            continue
        resume = ["--c"] if (fold_dir / "checkpoint_latest.pth").is_file() else []
        run_nnunet("nnUNetv2_train", [str(DATASET_ID), CONFIGURATION, FOLD, "-tr", trainer, "-device", device,
                                      *resume], env, echo=show, log_file=log_file)

    step(4, "nnUNetv2_predict of the test images with both trainers (--disable_tta)")
    test_table = out / "subgroups_test.tsv"
    write_text_atomic(test_table, subgroups[subgroups["split"] == "test"].to_csv(sep="\t", index=False))
    step(5, "nnunet_dro evaluate by condition and region")
    _, result = run_ensemble(
        env, DATASET_ID, str(raw / "imagesTs"), out, [Member(m, t) for m, t in names.items()],
        # no test-time mirroring: 8x faster prediction, the same for both arms
        configuration=CONFIGURATION, folds=[FOLD], device=device, npp=1, nps=1, num_processes=2, tta=False,
        evaluation=dict(reference=str(raw / "labelsTs"), groups=str(test_table), group_by=["condition"],
                        regions="feta", progress=False),
        echo=lambda text: echo("    " + text))
    from nnunet_dro.evaluation.reports import terminal_table

    echo("")
    echo(terminal_table(result))
    _print_hardest(Path(env["nnUNet_results"]) / raw.name / f"{names['DRO']}__nnUNetPlans__{CONFIGURATION}"
                   / f"fold_{FOLD}", subgroups, echo)
    echo(f"\nDone in {time.perf_counter() - started:.0f} s. Report, tables and box plots: {out / 'evaluation'}")
    echo(f"Budget per arm: {budget.epochs} epochs x {budget.iterations_per_epoch} iterations "
         f"(scale it up with --budget-scale). nnU-Net's output: {log_file}")
    return result


def _counts(table: pd.DataFrame, column: str) -> str:
    return ", ".join(f"{k} {v}" for k, v in table[column].value_counts().items())


def _print_hardest(fold_dir: Path, subgroups: pd.DataFrame, echo: Callable[[str], None], k: int = 8) -> None:
    report = fold_dir / "dro_hardness.csv"
    if not report.is_file():
        echo(f"(no hardness report at {report})")
        return
    hardness = pd.read_csv(report, dtype={"case": str})
    merged = hardness.merge(subgroups[["case", "condition"]], on="case", how="left")
    merged = merged.sort_values("stale_loss", ascending=False).head(k)
    echo(f"\nHardest training cases for DRO at the end of training ({report.name}):")
    echo(merged.to_string(index=False))


def run_python_cli(args: list[str], env: dict[str, str], log_file: str) -> None:
    """Our own CLI in a subprocess, with the demo's nnU-Net environment."""
    import subprocess

    done = subprocess.run([sys.executable, "-m", "nnunet_dro", *args], env=env, capture_output=True, text=True)
    with open(log_file, "a", encoding="utf-8") as log:
        log.write(done.stdout + done.stderr)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise UserError(f"nnunet_dro {args[0]} failed: {last}")
