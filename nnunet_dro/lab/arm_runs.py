"""The arms of one working folder: each arm's ``nnUNetv2_train`` (a CPU-budget trainer,
:mod:`nnunet_dro.lab.budget`), ``nnUNetv2_predict`` of the test images and ``nnunet_dro evaluate``
by condition and region, stored as ``arms/<ARM>/result.json`` + ``per_case.csv`` when complete (a
later run loads it), and the further scorings of an arm's final network.

An arm that trains another arm's trainer again (``ERM_repeat``, ``DROAdaptive_repeat``, ``JTT``)
does so under a copy of the plans with another name (:data:`ARM_PLANS`): nnU-Net names a run's
folder ``<trainer>__<plans>__<configuration>``, so a repeat is a results folder, not a class.
``nnUNet_dro_seed`` gives every arm of one repetition the same initial weights.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Mapping

import pandas as pd

from nnunet_dro.atomic import write_text_atomic
from nnunet_dro.data.subgroups import SUBGROUPS_FILENAME, read_subgroups
from nnunet_dro.errors import UserError
from nnunet_dro.lab.budget import (
    BUDGET_TRAINERS,
    FINAL_VALIDATION_ENV,
    KEEP_CHECKPOINTS_ENV,
    SEED_ENV,
    arm_name,
    checkpoint_name,
)
from nnunet_dro.lab.calibration import check_erm_run
from nnunet_dro.lab.cohort_folder import (
    FURTHER_TESTS,
    GROUP_COLUMN,
    PLANS,
    CohortFolder,
    write_split_table,
)
from nnunet_dro.lab.run_summary import majority_means, training_summary
from nnunet_dro.training.case_tables import CASE_WEIGHTS_ENV, CASE_WEIGHTS_FILENAME
from nnunet_dro.training.short_run import SHORT_RUN_ENV, short_run_value
from nnunet_dro.workflows.ensemble import PredictionSettings, predict
from nnunet_dro.workflows.nnunet_commands import run_nnunet

REGIONS = "feta"
#: where :meth:`ArmRuns.score_further` keeps each further scoring of an arm's network
FURTHER_RESULTS = {"large_test": "per_case_large_test.csv", "shifted_test": "per_case_shifted_test.csv",
                   "training": "per_case_training.csv"}
#: the further test sets also scored by HD95 (mm; a structure missing on one side scores the image
#: diagonal), stored beside their Dice: the converged regime's secondary statistic, the "other"
#: group's worst tenth of the intra-axial CSF's HD95 on the larger test set (journal, December 6)
HD95_RESULTS = {"large_test": "per_case_large_test_hd95.csv"}
#: an ERM run's exclusion test (:mod:`nnunet_dro.lab.calibration`), stored while its fold folder
#: (nnU-Net's validation, the checkpoint's log) exists: the record keeps the verdict, not the folder
CALIBRATION_CHECK = "calibration_check.json"

#: the arm every other arm is compared with, paired: nnU-Net's own training (uniform draws)
BASELINE_ARM = "ERM"
#: short names for nnU-Net's own alternatives (the arms of the comparison with what users try first)
NNUNET_ALTERNATIVE_ARMS = {"DiceTopK10": "nnUNetTrainerDiceTopK10Loss_CPUBudget",
                           "TopK10": "nnUNetTrainerTopk10Loss_CPUBudget",
                           "Oversample033": "nnUNetTrainer_probabilisticOversampling_033_CPUBudget"}
#: Just Train Twice as an arm: the ERM arm's final network scored on its own training cases, the
#: error set and its table (:mod:`nnunet_dro.workflows.jtt`, the defaults of ``nnunet_dro jtt``), then
#: a second training that reads the table (``nnUNetTrainerCaseWeights``, in a results folder of its
#: own, :data:`ARM_PLANS`, so that it is not the CaseWeights arm's).
JTT_ARM = "JTT"
JTT_SETTINGS = {"fraction": 0.2, "rule": "worst-dice", "upweight": 5.0}
#: arm -> CPU-budget trainer: every budget trainer under its arm name (the trainer's name without
#: ``nnUNetTrainer``, ERM for nnU-Net's), ERM and the default run again (ERM_repeat, DROAdaptive_repeat).
ARM_TRAINERS = {**{arm_name(name): name for name in BUDGET_TRAINERS if name.endswith("_CPUBudget")},
                "ERM_repeat": "nnUNetTrainer_CPUBudget",
                "DROAdaptive_repeat": "nnUNetTrainerDROAdaptive_CPUBudget",
                **NNUNET_ALTERNATIVE_ARMS,
                JTT_ARM: "nnUNetTrainerCaseWeights_CPUBudget"}
#: the arms that train another arm's trainer again, and the plans identifier of their run: a copy
#: of nnU-Net's plans under this name (same preprocessed data, :meth:`ArmRuns.plans_for`), so that
#: nnU-Net gives the run a results folder of its own. ``ERM_repeat`` and ``DROAdaptive_repeat``: a
#: second run on the same cohort with the same initial weights (and draw seed); nnU-Net's
#: augmentation workers are unseeded, so the two runs differ as any two runs do, and the paired
#: difference to the first run is the run-to-run noise every other comparison carries.
ARM_PLANS = {"ERM_repeat": f"{PLANS}_repeat", "DROAdaptive_repeat": f"{PLANS}_repeat", JTT_ARM: f"{PLANS}_JTT"}


def arm_run(arm: str, summary: Mapping | None = None) -> tuple[str, str]:
    """The trainer and plans identifier of an arm's run: those its stored ``summary`` names (a
    repeat stored as a trainer of its own, ``nnUNetTrainer_CPUBudget_repeat`` under ``nnUNetPlans``,
    keeps it), else those of :data:`ARM_TRAINERS` and :data:`ARM_PLANS`.

    >>> arm_run("ERM_repeat"), arm_run("ERM_repeat", {"trainer": "nnUNetTrainer_CPUBudget_repeat"})
    (('nnUNetTrainer_CPUBudget', 'nnUNetPlans_repeat'), ('nnUNetTrainer_CPUBudget_repeat', 'nnUNetPlans'))
    """
    if summary and "trainer" in summary:
        return summary["trainer"], summary.get("plans", PLANS)
    return ARM_TRAINERS.get(arm, ""), ARM_PLANS.get(arm, PLANS)


@dataclass(frozen=True)
class Budget:
    """Overrides of the CPU budget (None: the trainer's defaults, 120 epochs x 25 iterations), and
    the percentages of the epochs after which a copy of the network is kept (the training fit's
    curve, :meth:`ArmRuns.score_training_curve`)."""
    epochs: int | None = None
    iterations_per_epoch: int | None = None
    keep_checkpoints: tuple[float, ...] = ()

    def env(self) -> dict[str, str]:
        """``nnUNet_dro_short_run`` for the overrides (none: the budget as it is), and
        ``nnUNet_dro_keep_checkpoints``.

        >>> Budget().env(), Budget(1, 2).env(), Budget(iterations_per_epoch=4).env()
        ({}, {'nnUNet_dro_short_run': '1x2'}, {'nnUNet_dro_short_run': 'x4'})
        >>> Budget(800, keep_checkpoints=(50, 75)).env()[KEEP_CHECKPOINTS_ENV]
        '50,75'
        """
        value = short_run_value(self.epochs or None, self.iterations_per_epoch or None)
        kept = {KEEP_CHECKPOINTS_ENV: ",".join(f"{p:g}" for p in self.keep_checkpoints)} if self.keep_checkpoints else {}
        return ({SHORT_RUN_ENV: value} if value else {}) | kept


class ArmRuns:
    """Train, predict, evaluate and store each arm of one :class:`~nnunet_dro.lab.cohort_folder.CohortFolder`."""

    def __init__(self, cohort_folder: CohortFolder):
        self.cohort_folder = cohort_folder

    def arm_folder(self, arm: str) -> Path:
        return self.cohort_folder.folder / "arms" / arm

    def fold_folder(self, trainer: str, plans: str = PLANS) -> Path:
        results = Path(self.cohort_folder.env["nnUNet_results"]) / self.cohort_folder.raw.name
        cohort = self.cohort_folder.cohort
        return results / f"{trainer}__{plans}__{cohort.configuration}" / f"fold_{cohort.fold}"

    def plans_for(self, arm: str) -> str:
        """The plans identifier the arm trains under (:data:`ARM_PLANS`); for a repeat, its copy of
        nnU-Net's plans is written beside them first (same configurations and data identifier, so
        the preprocessed cases are shared; only ``plans_name``, hence the results folder, differs)."""
        plans = ARM_PLANS.get(arm, PLANS)
        path = self.cohort_folder.preprocessed / f"{plans}.json"
        if plans != PLANS and not path.is_file():
            content = json.loads((self.cohort_folder.preprocessed / f"{PLANS}.json").read_text())
            write_text_atomic(path, json.dumps({**content, "plans_name": plans}, indent=4))
        return plans

    def finished(self, arm: str) -> bool:
        folder = self.arm_folder(arm)
        return (folder / "result.json").is_file() and (folder / "per_case.csv").is_file()

    def load(self, arm: str) -> tuple[dict, pd.DataFrame]:
        """The arm's stored summary and per-case Dice; a summary without the epoch from which every
        structure was learned gets it from the run's checkpoint, if its folder is here."""
        folder = self.arm_folder(arm)
        summary = json.loads((folder / "result.json").read_text())
        if "all_learned_epoch" not in summary:
            summary["all_learned_epoch"] = self.all_learned_epoch(*arm_run(arm, summary))
        return summary, pd.read_csv(folder / "per_case.csv", dtype={"case": str})

    def all_learned_epoch(self, trainer: str, plans: str = PLANS) -> int | None:
        """The first epoch of the run with every structure's pseudo-Dice >= ``ALL_LEARNED``, read from
        its final checkpoint's log (for a stored summary without it); None if no epoch had, or the
        run's folder is gone."""
        checkpoint = self.fold_folder(trainer, plans) / "checkpoint_final.pth"
        if not checkpoint.is_file():
            return None
        return training_summary(checkpoint.parent)["all_learned_epoch"]

    def train_arm(self, arm: str, trainer: str, seed: int, budget: Budget = Budget(), device: str = "cpu",
                  show: Callable[[str], None] | None = None) -> float:
        """``nnUNetv2_train`` of one arm (resumed with ``--c`` after an interruption, skipped when
        finished); returns the seconds it took now. The JTT arm first writes its case-weight table
        (:meth:`jtt_table`) and trains with it."""
        plans = self.plans_for(arm)
        fold_dir = self.fold_folder(trainer, plans)
        tic = time.perf_counter()
        if not (fold_dir / "checkpoint_final.pth").is_file():
            extra = {CASE_WEIGHTS_ENV: str(self.jtt_table(device))} if arm == JTT_ARM else {}
            resume = ["--c"] if (fold_dir / "checkpoint_latest.pth").is_file() else []
            cohort = self.cohort_folder
            configuration, fold = cohort.cohort.configuration, cohort.cohort.fold
            cohort.echo(f"  {arm}: nnUNetv2_train {cohort.dataset_id} {configuration} {fold} -tr {trainer}"
                        + (f" -p {plans}" if plans != PLANS else "") + (" --c (resuming)" if resume else ""))
            # fold 0 keeps nnU-Net's final validation: the converged regime's calibration reads it
            validation = {FINAL_VALIDATION_ENV: "1"} if cohort.cohort.validation_fold else {}
            env = {**cohort.env, SEED_ENV: str(seed), **budget.env(), **validation, **extra}
            run_nnunet("nnUNetv2_train", [str(cohort.dataset_id), configuration, fold, "-tr", trainer, "-p", plans,
                                          "-device", device, *resume], env, echo=show, log_file=cohort.log_file)
            self.arm_folder(arm).mkdir(parents=True, exist_ok=True)
            write_text_atomic(self.arm_folder(arm) / "train_seconds.txt", f"{time.perf_counter() - tic:.1f}\n")
            # nnU-Net's augmentation processes of the run that trained it (0: in the training
            # process): same transforms, another random stream and cost, so the record says which
            write_text_atomic(self.arm_folder(arm) / "augmentation_processes.txt", f"{env['nnUNet_n_proc_DA']}\n")
        return time.perf_counter() - tic

    def jtt_table(self, device: str = "cpu") -> Path:
        """Just Train Twice's first stage, from the finished ERM arm: its final network scored on its
        own training cases (:meth:`score_further`, kept), the error set by ``JTT_SETTINGS`` and the
        case-weight table ``arms/JTT/case_weights.tsv`` (written once; its path is returned)."""
        from nnunet_dro.workflows.jtt import jtt_table

        table_path = self.arm_folder(JTT_ARM) / CASE_WEIGHTS_FILENAME
        if table_path.is_file():
            return table_path
        if not self.finished(BASELINE_ARM):
            raise UserError(f"{self.cohort_folder.folder}: the {JTT_ARM} arm needs the finished {BASELINE_ARM} arm "
                            f"(its first training); list {BASELINE_ARM} before it")
        fit = self.score_further(BASELINE_ARM, ARM_TRAINERS[BASELINE_ARM], "training", device=device)
        trained = self.cohort_folder.fold_training_cases()
        if trained is not None:  # fold 0: the error set among the cases the network trained on
            fit = fit[fit["case"].isin(trained)]
        rule, fraction, upweight = JTT_SETTINGS["rule"], JTT_SETTINGS["fraction"], JTT_SETTINGS["upweight"]
        table, errors = jtt_table(fit, fraction, rule, upweight)
        self.arm_folder(JTT_ARM).mkdir(parents=True, exist_ok=True)
        write_text_atomic(table_path, table.to_csv(sep="\t", index=False))
        self.cohort_folder.echo(f"  {JTT_ARM}: error set of the {BASELINE_ARM} network on its training cases ({rule}, "
                                f"worst {fraction:g}): {len(errors)} of {len(table)} cases, drawn {upweight:g} times "
                                f"as often")
        return table_path

    def _predict_and_score(self, arm: str, trainer: str, images: Path, labels: Path, groups: Path,
                           predictions: Path, device: str, checkpoint: str = "checkpoint_final.pth",
                           metrics: tuple[str, ...] = ("dice",)) -> pd.DataFrame:
        """``nnUNetv2_predict`` of ``images`` with the arm's ``checkpoint``, then the ``metrics`` of
        every case and region against ``labels`` (``nnunet_dro evaluate`` by condition; rows of
        every metric, column ``metric``)."""
        cohort = self.cohort_folder
        cases = len(list(labels.glob("*.nii.gz")))
        cohort.echo(f"  {arm}: nnUNetv2_predict of {cases} cases of {images.parent.name}/{images.name} (--disable_tta"
                    + (f", {checkpoint}" if checkpoint != "checkpoint_final.pth" else "") + ")")
        settings = PredictionSettings(configuration=cohort.cohort.configuration, plans=ARM_PLANS.get(arm, PLANS),
                                      folds=(cohort.cohort.fold,), checkpoint=checkpoint, device=device, tta=False,
                                      npp=1, nps=1)
        predict(cohort.env, cohort.dataset_id, str(images), predictions, trainer, settings, echo=None,
                log_file=cohort.log_file)
        from nnunet_dro.evaluation.api import evaluate

        result = evaluate(str(labels), {arm: str(predictions)}, None, groups=str(groups), group_by=[GROUP_COLUMN],
                          regions=REGIONS, metrics=list(metrics), num_processes=2, progress=False, echo=cohort.echo)
        return result.per_case[result.per_case["metric"].isin(metrics)].reset_index(drop=True)

    def run_arm(self, arm: str, trainer: str, seed: int, budget: Budget = Budget(), device: str = "cpu",
                show: Callable[[str], None] | None = None) -> tuple[dict, pd.DataFrame]:
        """Train, predict and evaluate one arm (or load its stored result)."""
        if self.finished(arm):
            return self.load(arm)
        fold_dir = self.fold_folder(trainer, self.plans_for(arm))
        self.train_arm(arm, trainer, seed, budget, device, show)
        # the time and augmentation processes of the run that trained it (absent: trained before they were kept)
        times_file = self.arm_folder(arm) / "train_seconds.txt"
        train_seconds = float(times_file.read_text()) if times_file.is_file() else float("nan")
        workers_file = self.arm_folder(arm) / "augmentation_processes.txt"
        workers = int(workers_file.read_text()) if workers_file.is_file() else None
        cohort = self.cohort_folder
        per_case = self._predict_and_score(arm, trainer, cohort.raw / "imagesTs", cohort.raw / "labelsTs",
                                           cohort.folder / "subgroups_test.tsv", self.arm_folder(arm) / "predictions",
                                           device)
        summary = {"arm": arm, "trainer": trainer, "plans": self.plans_for(arm), "seed": seed,
                   "cohort": asdict(cohort.cohort), "budget": asdict(budget), "train_seconds": round(train_seconds, 1),
                   "augmentation_processes": workers,
                   **training_summary(fold_dir), "control_mean_dice": majority_means(per_case)}
        write_text_atomic(self.arm_folder(arm) / "per_case.csv", per_case.to_csv(index=False))
        write_text_atomic(self.arm_folder(arm) / "result.json", json.dumps(summary, indent=2, default=float))
        return summary, per_case

    def score_further(self, arm: str, trainer: str, cases: str, dataset_id: int | None = None,
                      device: str = "cpu") -> pd.DataFrame:
        """The arm's final network scored again on further cases, once (stored in
        ``arms/<ARM>/per_case_<cases>.csv`` and loaded from there after):

        - ``"large_test"`` / ``"shifted_test"``: a further test set (:meth:`CohortFolder.prepare_further_test
          <nnunet_dro.lab.cohort_folder.CohortFolder.prepare_further_test>` first, ``dataset_id``);
        - ``"training"``: its own training cases. Read across arms: where an arm that draws a
          group more often raises that group's Dice on its training cases and the test cases
          follow, the group was under-fitted for being rare; where its training Dice barely moves,
          more draws do not help it (the structure is hard in the image itself).

        Two benchmark processes on one seed folder (``--arms ERM,A`` beside ``--arms ERM,B``) both
        score the baseline: the second waits on the arm's lock and then loads the first's result."""
        with folder_lock(self.arm_folder(arm) / f".score_{cases}.lock"):
            return self._score_further(arm, trainer, cases, dataset_id, device)

    def _score_further(self, arm: str, trainer: str, cases: str, dataset_id: int | None, device: str) -> pd.DataFrame:
        stored = self.arm_folder(arm) / FURTHER_RESULTS[cases]
        if stored.is_file():
            return pd.read_csv(stored, dtype={"case": str})
        fold_dir = self.fold_folder(trainer, ARM_PLANS.get(arm, PLANS))
        if not (fold_dir / "checkpoint_final.pth").is_file():
            raise UserError(f"{fold_dir}: no checkpoint_final.pth to score the {cases} cases "
                            f"with (arm {arm}); its run folder is needed, a record is not enough")
        if cases in FURTHER_TESTS:
            raw, split = self.cohort_folder.further_test_raw(cases, dataset_id), "Ts"
            groups = self.cohort_folder.folder / f"subgroups_{cases}.tsv"
        else:
            raw, split = self.cohort_folder.raw, "Tr"
            groups = self.cohort_folder.folder / "subgroups_training.tsv"
            write_split_table(read_subgroups(raw / SUBGROUPS_FILENAME), "train", groups)
        metrics = ("dice", "hd95") if cases in HD95_RESULTS else ("dice",)
        scored = self._predict_and_score(arm, trainer, raw / f"images{split}", raw / f"labels{split}", groups,
                                         self.arm_folder(arm) / f"predictions_{cases}", device, metrics=metrics)
        per_case = scored[scored["metric"] == "dice"].reset_index(drop=True)
        if cases in HD95_RESULTS:  # written first: a stored Dice table means both are there
            write_text_atomic(self.arm_folder(arm) / HD95_RESULTS[cases],
                              scored[scored["metric"] == "hd95"].to_csv(index=False))
        write_text_atomic(stored, per_case.to_csv(index=False))
        return per_case

    def score_training_curve(self, arm: str, trainer: str, device: str = "cpu") -> pd.DataFrame:
        """The arm's network kept part-way (``checkpoint_epoch_<E>.pth``, :class:`Budget`'s
        ``keep_checkpoints``) and its final network, each scored on its own training cases (fold 0:
        those of the fold); rows of :meth:`score_further`'s table with a column ``epoch``, stored per
        network as ``arms/<ARM>/per_case_training_epoch_<E>.csv`` (the final one is
        ``per_case_training.csv``). The curve of one training replaces trainings of several lengths:
        where ERM's fit of its rare training cases still rises at the end, the budget is truncated."""
        fold_dir = self.fold_folder(trainer, ARM_PLANS.get(arm, PLANS))
        final = self.score_further(arm, trainer, "training", device=device)
        if not (fold_dir / "checkpoint_final.pth").is_file():  # a run restored from the record: its scorings
            curve = self.load_training_curve(arm)
            if curve is None:
                raise UserError(f"{fold_dir}: no checkpoint_final.pth and no stored training-fit curve of arm {arm}")
        else:
            curve = self._score_kept_networks(arm, trainer, fold_dir, final, device)
        trained = self.cohort_folder.fold_training_cases()
        return curve if trained is None else curve[curve["case"].isin(trained)].reset_index(drop=True)

    def _score_kept_networks(self, arm: str, trainer: str, fold_dir: Path, final: pd.DataFrame,
                             device: str) -> pd.DataFrame:
        """The final network's scoring and each kept network's (scored once, then stored), column ``epoch``."""
        epochs = int(torch_epoch(fold_dir / "checkpoint_final.pth"))
        tables = [final.assign(epoch=epochs)]
        for epoch in sorted(int(p.stem.rsplit("_", 1)[1]) for p in fold_dir.glob("checkpoint_epoch_*.pth")):
            stored = self.arm_folder(arm) / f"per_case_training_epoch_{epoch}.csv"
            if not stored.is_file():
                raw = self.cohort_folder.raw
                per_case = self._predict_and_score(arm, trainer, raw / "imagesTr", raw / "labelsTr",
                                                   self.cohort_folder.folder / "subgroups_training.tsv",
                                                   self.arm_folder(arm) / f"predictions_training_epoch_{epoch}", device,
                                                   checkpoint=checkpoint_name(epoch))
                write_text_atomic(stored, per_case.to_csv(index=False))
            tables.append(pd.read_csv(stored, dtype={"case": str}).assign(epoch=epoch))
        return pd.concat(tables, ignore_index=True)

    def load_training_curve(self, arm: str) -> pd.DataFrame | None:
        """The stored scorings of :meth:`score_training_curve` (every kept network's and the final
        one's, column ``epoch``), or None where no kept network was scored."""
        folder = self.arm_folder(arm)
        kept = sorted(folder.glob("per_case_training_epoch_*.csv"))
        final_file, result_file = folder / FURTHER_RESULTS["training"], folder / "result.json"
        if not kept or not final_file.is_file() or not result_file.is_file():
            return None
        summary = json.loads(result_file.read_text())
        tables = [pd.read_csv(path, dtype={"case": str}).assign(epoch=int(path.stem.rsplit("_", 1)[1])) for path in kept]
        tables.append(pd.read_csv(final_file, dtype={"case": str}).assign(epoch=int(summary["epochs"])))
        return pd.concat(tables, ignore_index=True)

    def store_calibration_check(self, arm: str, trainer: str, epochs: int) -> dict | None:
        """The exclusion test of an ERM run (``ERM``, ``ERM_repeat``) on its fold's validation
        cases, written once to ``arms/<ARM>/calibration_check.json`` and returned; None where the
        arm trained no held-out fold or its folder is gone (a record alone cannot be tested)."""
        stored = self.arm_folder(arm) / CALIBRATION_CHECK
        if stored.is_file():
            return json.loads(stored.read_text())
        fold_dir = self.fold_folder(trainer, self.plans_for(arm))
        if arm_name(trainer) != "ERM" or self.cohort_folder.cohort.fold == "all" \
                or not (fold_dir / "checkpoint_final.pth").is_file():
            return None
        subgroups = read_subgroups(self.cohort_folder.raw / SUBGROUPS_FILENAME).astype({"case": str})
        check = check_erm_run(fold_dir, subgroups, epochs)
        verdict = {"passed": check.passed, "reasons": list(check.reasons), "control_means": check.control_means,
                   "learned_epoch": check.learned_epoch, "epochs": check.epochs}
        write_text_atomic(stored, json.dumps(verdict, indent=2))
        return verdict

    def load_calibration_check(self, arm: str) -> dict | None:
        """The stored verdict of :meth:`store_calibration_check`, or None."""
        stored = self.arm_folder(arm) / CALIBRATION_CHECK
        return json.loads(stored.read_text()) if stored.is_file() else None

    def load_hd95(self, arm: str, cases: str = "large_test") -> pd.DataFrame | None:
        """The stored HD95 rows of :meth:`score_further` (``HD95_RESULTS``), or None (an arm
        scored before HD95 was, or a set not scored by it)."""
        if cases not in HD95_RESULTS:
            return None
        stored = self.arm_folder(arm) / HD95_RESULTS[cases]
        return pd.read_csv(stored, dtype={"case": str}) if stored.is_file() else None

    def load_further(self, arm: str, cases: str) -> pd.DataFrame | None:
        """The stored result of :meth:`score_further`, or None."""
        stored = self.arm_folder(arm) / FURTHER_RESULTS[cases]
        return pd.read_csv(stored, dtype={"case": str}) if stored.is_file() else None


@contextlib.contextmanager
def folder_lock(lock_file: Path):
    """Hold an exclusive lock on ``lock_file`` (made with its folder if missing). The lock is the
    kernel's (``flock``), so a killed process releases it."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


_PROGRESS_MARKERS = ("Epoch ", "train_loss", "val_loss", "Pseudo dice", "Epoch time", "DRO:", "DRO guard",
                     "Error", "error", "Traceback", "Training done", "Predicting", "Done with")


def progress_filter(echo: Callable[[str], None]) -> Callable[[str], None]:
    """nnU-Net is chatty: show the lines that tell progress; the rest goes to the log file."""
    def show(line: str) -> None:
        if any(marker in line for marker in _PROGRESS_MARKERS):
            echo("    " + line.strip())
    return show


def torch_epoch(checkpoint: Path) -> int:
    """The epochs a checkpoint's network was trained for (nnU-Net's ``current_epoch``)."""
    import torch

    return int(torch.load(str(checkpoint), map_location="cpu", weights_only=False)["current_epoch"])
