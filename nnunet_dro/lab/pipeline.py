"""The experiment pipeline shared by ``nnunet_dro demo`` and ``scripts/benchmark_robustness.py``:
synthetic cohort -> ``nnUNetv2_plan_and_preprocess`` -> ``nnUNetv2_train`` of each arm ->
``nnUNetv2_predict`` of the test images -> ``nnunet_dro evaluate`` by condition and region.

Every step runs nnU-Net's real command in a subprocess inside one working folder (its own
``nnUNet_raw``/``_preprocessed``/``_results``), and every finished step is kept: an arm's result
(``arms/<ARM>/result.json`` + ``per_case.csv``) is written atomically when it is complete, and a
later call with the same folder skips it. So a long benchmark can be built in pieces.

The arms are CPU-budget trainers (:mod:`nnunet_dro.lab.budget`, found through the lab's trainer
folder, :func:`~nnunet_dro.lab.ext_trainers.lab_trainer_dirs`): nnU-Net's plans with a quarter of
the features per stage; ``nnUNet_dro_seed`` gives every arm of one repetition the same initial
weights. An arm that trains another arm's trainer again (``ERM_repeat``, ``DROAdaptive_repeat``,
``JTT``) does so under a copy of the plans with another name (:data:`ARM_PLANS`): nnU-Net names a
run's folder ``<trainer>__<plans>__<configuration>``, so a repeat is a results folder, not a class.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from nnunet_dro.atomic import replaced_folder, write_text_atomic
from nnunet_dro.data.exclude_cases import EXCLUDED_FILENAME, reasons_from_flags, write_dataset_without
from nnunet_dro.data.label_audit import audit_volumes, dataset_labels, label_volumes
from nnunet_dro.data.subgroups import SUBGROUPS_FILENAME, read_subgroups
from nnunet_dro.data.synthetic_fetal import NEW_CENTRE
from nnunet_dro.errors import UserError
from nnunet_dro.lab.budget import BUDGET_TRAINERS, SEED_ENV, THREADS_ENV, arm_name
from nnunet_dro.lab.ext_trainers import lab_trainer_dirs
from nnunet_dro.lab.label_noise import RECORD as LABEL_NOISE_RECORD
from nnunet_dro.lab.label_noise import corrupt_training_labels
from nnunet_dro.training.case_tables import CASE_WEIGHTS_ENV, CASE_WEIGHTS_FILENAME
from nnunet_dro.training.short_run import SHORT_RUN_ENV, short_run_value
from nnunet_dro.training.stability import (
    ALL_LEARNED,
    LEARNED,
    START_EPOCH,
    THRESHOLD,
    all_learned_epoch,
    collapsed_epochs,
    learning_time_text,
    lost_epochs,
)
from nnunet_dro.weighting.hardness import UNIFORM_BETA
from nnunet_dro.workflows.ensemble import PredictionSettings, predict
from nnunet_dro.workflows.nnunet_commands import nnunet_environment, run_nnunet

CONFIGURATION = "3d_fullres"
#: nnU-Net's plans identifier of every arm but those of :data:`ARM_PLANS`
PLANS = "nnUNetPlans"
FOLD = "all"
GROUP_COLUMN = "condition"
MAJORITY_GROUP = "control"
MINORITY_GROUPS = ("spina_bifida", "other")
#: ``exclude_flagged``: which training cases the audit took out, and why (beside ``label_noise.json``)
AUDIT_EXCLUDED_RECORD = "audit_excluded.json"
REGIONS = "feta"
#: "ERM has learned the majority": every region's mean Dice of the controls at least this.
CONVERGED_DICE = 80.0
#: A larger test set is drawn with the cohort's seed plus this offset: further cases from the same
#: generator, independent of the cohort (no training case, no choice was made on them).
LARGE_TEST_SEED_OFFSET = 1_000_000
#: The further test sets the same trained networks can be scored on: (raw dataset name suffix, the
#: site every case is acquired at; None: drawn per case as in the cohort). Both are drawn with the
#: cohort's seed + ``LARGE_TEST_SEED_OFFSET``: the new centre's cases are the larger test set's
#: anatomies and labels acquired at site_C, so a paired difference between the two is the shift's.
FURTHER_TESTS = {"large_test": ("LargeTest", None), "shifted_test": ("ShiftedTest", NEW_CENTRE)}
#: How messages name each further test set.
FURTHER_TEST_NAMES = {"large_test": "larger test set", "shifted_test": "new centre's test set"}
#: Where :meth:`Workspace.score_further` keeps each further scoring of an arm's network.
FURTHER_RESULTS = {"large_test": "per_case_large_test.csv", "shifted_test": "per_case_shifted_test.csv",
                   "training": "per_case_training.csv"}

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
#: The record's arms of the unreleased 0.1.0 were renamed once (scripts/migrate_record_arms.py).
ARM_TRAINERS = {**{arm_name(name): name for name in BUDGET_TRAINERS if name.endswith("_CPUBudget")},
                "ERM_repeat": "nnUNetTrainer_CPUBudget",
                "DROAdaptive_repeat": "nnUNetTrainerDROAdaptive_CPUBudget",
                **NNUNET_ALTERNATIVE_ARMS,
                JTT_ARM: "nnUNetTrainerCaseWeights_CPUBudget"}
#: the arms that train another arm's trainer again, and the plans identifier of their run: a copy
#: of nnU-Net's plans under this name (same preprocessed data, :meth:`Workspace.plans_for`), so that
#: nnU-Net gives the run a results folder of its own. ``ERM_repeat`` and ``DROAdaptive_repeat``: a
#: second run on the same cohort with the same initial weights (and draw seed); nnU-Net's
#: augmentation workers are unseeded, so the two runs differ as any two runs do, and the paired
#: difference to the first run is the run-to-run noise every other comparison carries.
ARM_PLANS = {"ERM_repeat": f"{PLANS}_repeat", "DROAdaptive_repeat": f"{PLANS}_repeat", JTT_ARM: f"{PLANS}_JTT"}


def arm_run(arm: str, summary: Mapping | None = None) -> tuple[str, str]:
    """The trainer and plans identifier of an arm's run: those its stored ``summary`` names, else
    the current ones. Results stored before repeats were plans (``nnUNetTrainer_CPUBudget_repeat``
    under ``nnUNetPlans``) keep their own.

    >>> arm_run("ERM_repeat"), arm_run("ERM_repeat", {"trainer": "nnUNetTrainer_CPUBudget_repeat"})
    (('nnUNetTrainer_CPUBudget', 'nnUNetPlans_repeat'), ('nnUNetTrainer_CPUBudget_repeat', 'nnUNetPlans'))
    """
    if summary and "trainer" in summary:
        return summary["trainer"], summary.get("plans", PLANS)
    return ARM_TRAINERS.get(arm, ""), ARM_PLANS.get(arm, PLANS)


@dataclass(frozen=True)
class Cohort:
    """A synthetic fetal-brain-like cohort (``make-synthetic --kind fetal``).

    The defaults are the size of the fetal training set of Fidon et al. (arXiv:2001.02658): 177
    training cases (control / spina bifida / other about 80 / 12 / 8 %: 142 / 21 / 14) and 60 test
    cases, 20 per group. With 40 training cases the minorities are 5 and 3 cases, too few for any
    re-sampling, even a label-aware one, to teach what they look like (docs/evidence.md)."""
    n_train: int = 177
    n_test: int = 60
    size: int = 32
    seed: int = 0
    #: training cases whose labels are corrupted (:mod:`nnunet_dro.lab.label_noise`); test cases stay clean
    label_noise: int = 0
    #: train without the cases ``audit-labels`` flags (within condition, its defaults), after the
    #: label noise: what a user who drops every flagged case would train on (:meth:`Workspace.prepare`)
    exclude_flagged: bool = False


@dataclass(frozen=True)
class Budget:
    """Overrides of the CPU budget (None: the trainer's defaults, 120 epochs x 25 iterations)."""
    epochs: int | None = None
    iterations_per_epoch: int | None = None

    def env(self) -> dict[str, str]:
        """``nnUNet_dro_short_run`` for the overrides (none: the budget as it is).

        >>> Budget().env(), Budget(1, 2).env(), Budget(iterations_per_epoch=4).env()
        ({}, {'nnUNet_dro_short_run': '1x2'}, {'nnUNet_dro_short_run': 'x4'})
        """
        value = short_run_value(self.epochs or None, self.iterations_per_epoch or None)
        return {SHORT_RUN_ENV: value} if value else {}


class Workspace:
    """One working folder: one cohort, its nnU-Net folders, and one result folder per arm."""

    def __init__(self, folder: str | os.PathLike, dataset_id: int, dataset_name: str, cohort: Cohort,
                 echo: Callable[[str], None] = print, torch_threads: int | None = None):
        """``torch_threads``: torch's threads in each training (None: nnU-Net's choice, every core)."""
        self.folder = Path(folder).resolve()
        self.folder.mkdir(parents=True, exist_ok=True)
        self.dataset_id, self.cohort, self.echo = dataset_id, cohort, echo
        self.log_file = str(self.folder / "nnunet_commands.log")
        self.env = nnunet_environment(
            root=self.folder / "nnunet", extra_trainer_dirs=lab_trainer_dirs(),
            overrides={"nnUNet_compile": "f", "nnUNet_def_n_proc": "2",
                       "nnUNet_n_proc_DA": os.environ.get("nnUNet_n_proc_DA", "2"),
                       **({THREADS_ENV: str(torch_threads)} if torch_threads else {})})
        self.raw = Path(self.env["nnUNet_raw"]) / f"Dataset{dataset_id:03d}_{dataset_name}"
        self.preprocessed = Path(self.env["nnUNet_preprocessed"]) / self.raw.name
        self._check_cohort()

    def _check_cohort(self) -> None:
        """A folder holds one cohort: refuse to mix cohorts when resuming."""
        path = self.folder / "cohort.json"
        wanted = asdict(self.cohort)
        if path.is_file():
            # folders made before label noise and the audit's exclusion existed
            found = {"label_noise": 0, "exclude_flagged": False, **json.loads(path.read_text())}
            if found != wanted:
                raise UserError(f"{path}: this folder was made with cohort {found}, not {wanted}; use the same "
                                f"cohort settings, another output folder, or --overwrite")
        else:
            write_text_atomic(path, json.dumps(wanted, indent=2))

    # ------------------------------------------------------------------ cohort and preprocessing
    def prepare(self) -> pd.DataFrame:
        """Make the cohort and preprocess it (each only once); return its subgroup table."""
        c = self.cohort
        generated = not (self.raw / "dataset.json").is_file()
        if generated:
            self.echo(f"  cohort: {c.n_train} train + {c.n_test} test cases of {c.size}^3, seed {c.seed}")
            run_python_cli(["make-synthetic", "--kind", "fetal", "--id", str(self.dataset_id), "-n",
                            self.raw.name.split("_", 1)[1], "--n-train", str(c.n_train), "--n-test", str(c.n_test),
                            "--size", str(c.size), "--seed", str(c.seed), "--overwrite"], self.env, self.log_file)
        subgroups = read_subgroups(self.raw / SUBGROUPS_FILENAME)
        record = self.folder / LABEL_NOISE_RECORD
        # Labels just generated are clean even where a noise record exists: a seed folder restored
        # from a record (--export-record) keeps label_noise.json but not the raw images.
        if c.label_noise and (generated or not record.is_file()):
            recorded = json.loads(record.read_text()) if record.is_file() else None
            if recorded is None and self._preprocessed():
                raise UserError(f"{self.folder}: preprocessed without the label noise asked for now; use another "
                                f"output folder or --overwrite")
            train = subgroups[subgroups["split"] == "train"]
            fresh = self.folder / f"{LABEL_NOISE_RECORD}.new"
            rows = corrupt_training_labels(self.raw / "labelsTr", dict(zip(train["case"], train[GROUP_COLUMN])),
                                           c.label_noise, MINORITY_GROUPS, c.seed, fresh)
            if recorded is not None and recorded != rows:
                fresh.unlink()
                (self.raw / "dataset.json").unlink()  # labels corrupted unlike the record: generate again next time
                raise UserError(f"{record}: records other corrupted cases than seed {c.seed} gives now; "
                                f"use another output folder or --overwrite")
            fresh.replace(record)
            self.echo(f"  label noise: {len(rows)} training cases corrupted ("
                      + ", ".join(f"{r['case']} {r['group']}: {r['what']}" for r in rows) + ")")
        if c.exclude_flagged and not (self.raw / EXCLUDED_FILENAME).is_file():
            subgroups = self._exclude_flagged(subgroups)
        if not self._preprocessed():
            self.echo("  nnUNetv2_plan_and_preprocess")
            # nnU-Net's planner calls torch.set_num_threads(nnUNet_n_proc_DA), which fails for 0
            env = {**self.env, "nnUNet_n_proc_DA": str(max(1, int(self.env["nnUNet_n_proc_DA"])))}
            run_nnunet("nnUNetv2_plan_and_preprocess",
                       ["-d", str(self.dataset_id), "-c", CONFIGURATION, "-np", "2", "--verify_dataset_integrity"],
                       env, echo=None, log_file=self.log_file)
        write_split_table(subgroups, "test", self.folder / "subgroups_test.tsv")
        return subgroups

    def _exclude_flagged(self, subgroups: pd.DataFrame) -> pd.DataFrame:
        """Audit the training labels within condition (``audit-labels``' defaults) and take every
        flagged case out of the raw dataset (:func:`~nnunet_dro.data.exclude_cases.write_dataset_without`,
        the raw folder replaced in one rename; its ``excluded_cases.tsv`` marks it done). The
        exclusion is recorded in ``audit_excluded.json``; a record that names other cases (a seed
        folder restored from a record) is refused. Returns the new subgroup table."""
        if (self.preprocessed / "nnUNetPlans.json").is_file():
            raise UserError(f"{self.folder}: preprocessed without the audit's exclusion asked for now; use another "
                            f"output folder or --overwrite")
        train = subgroups[subgroups["split"] == "train"]
        volumes = label_volumes(self.raw / "labelsTr", dataset_labels(self.raw / "dataset.json"),
                                num_processes=int(self.env["nnUNet_def_n_proc"]))
        groups = train.set_index("case")[GROUP_COLUMN]
        reasons = reasons_from_flags(audit_volumes(volumes, groups=groups), fallback="audit flag")
        rows = [{"case": case, "group": str(groups[case]), "reason": reason}
                for case, reason in sorted(reasons.items())]
        record = self.folder / AUDIT_EXCLUDED_RECORD
        if record.is_file() and json.loads(record.read_text()) != rows:
            (self.raw / "dataset.json").unlink()  # generate again next time
            raise UserError(f"{record}: records other excluded cases than the audit gives now; use another "
                            f"output folder or --overwrite")
        with replaced_folder(self.raw, keep=lambda name: False) as new:
            write_dataset_without(self.raw, new, reasons)
        write_text_atomic(record, json.dumps(rows, indent=2))
        self.echo(f"  audit: {len(rows)} flagged training case(s) left out ("
                  + ", ".join(f"{r['case']} {r['group']}: {r['reason']}" for r in rows) + ")")
        return read_subgroups(self.raw / SUBGROUPS_FILENAME)

    def _preprocessed(self) -> bool:
        """Planned and every training case preprocessed (an interrupted run can leave plans only)."""
        cases = self.preprocessed / f"nnUNetPlans_{CONFIGURATION}"
        return ((self.preprocessed / "nnUNetPlans.json").is_file() and cases.is_dir()
                and len(list(cases.glob("*.pkl"))) == self._raw_training_count())

    def _raw_training_count(self) -> int:
        """The raw dataset's ``numTraining`` (the cohort's, less any case the audit took out)."""
        meta = self.raw / "dataset.json"
        return int(json.loads(meta.read_text())["numTraining"]) if meta.is_file() else self.cohort.n_train

    # ------------------------------------------------------------------ one arm
    def arm_folder(self, arm: str) -> Path:
        return self.folder / "arms" / arm

    def fold_folder(self, trainer: str, plans: str = PLANS) -> Path:
        return (Path(self.env["nnUNet_results"]) / self.raw.name / f"{trainer}__{plans}__{CONFIGURATION}"
                / f"fold_{FOLD}")

    def plans_for(self, arm: str) -> str:
        """The plans identifier the arm trains under (:data:`ARM_PLANS`); for a repeat, its copy of
        nnU-Net's plans is written beside them first (same configurations and data identifier, so
        the preprocessed cases are shared; only ``plans_name``, hence the results folder, differs)."""
        plans = ARM_PLANS.get(arm, PLANS)
        path = self.preprocessed / f"{plans}.json"
        if plans != PLANS and not path.is_file():
            content = json.loads((self.preprocessed / f"{PLANS}.json").read_text())
            write_text_atomic(path, json.dumps({**content, "plans_name": plans}, indent=4))
        return plans

    def hardness_report_file(self, trainer: str, plans: str = PLANS) -> Path:
        """Where a case-weighting trainer's run keeps its ``dro_hardness.csv``."""
        return self.fold_folder(trainer, plans) / "dro_hardness.csv"

    def finished(self, arm: str) -> bool:
        folder = self.arm_folder(arm)
        return (folder / "result.json").is_file() and (folder / "per_case.csv").is_file()

    def load(self, arm: str) -> tuple[dict, pd.DataFrame]:
        """The arm's stored summary and per-case Dice. Results stored before the summary kept the
        epoch from which every structure was learned get it from the run's log, if its folder is here."""
        folder = self.arm_folder(arm)
        summary = json.loads((folder / "result.json").read_text())
        if "all_learned_epoch" not in summary:
            summary["all_learned_epoch"] = self.all_learned_epoch(*arm_run(arm, summary))
        return summary, pd.read_csv(folder / "per_case.csv", dtype={"case": str})

    def _training_groups(self) -> pd.DataFrame:
        subgroups = read_subgroups(self.raw / SUBGROUPS_FILENAME)
        return subgroups[subgroups["split"] == "train"][["case", GROUP_COLUMN]]

    def _hardness_report(self, trainer: str, plans: str = PLANS) -> pd.DataFrame | None:
        """The run's ``dro_hardness.csv`` joined with the training cases' groups, if it has one."""
        report = self.hardness_report_file(trainer, plans)
        if not report.is_file():
            return None
        table = pd.read_csv(report, dtype={"case": str}).drop(columns=[GROUP_COLUMN, "group"], errors="ignore")
        return table.merge(self._training_groups(), on="case")

    def draw_shares(self, trainer: str, finished: bool = False, plans: str = PLANS) -> dict[str, float]:
        """Share of the training draws that went to each group (condition): counted from the
        hardness report (``times_drawn``) of a case-weighting run; for a trainer without one
        (nnU-Net's ERM) each group's share of the training cases, what uniform sampling gives in
        expectation. Empty when the run's folder is gone, unless the caller knows the run
        ``finished`` (it read the run's stored result): a record keeps no checkpoint, and a
        case-weighting run always leaves its hardness report."""
        report = self._hardness_report(trainer, plans)
        if report is not None:
            counts = report.groupby(GROUP_COLUMN)["times_drawn"].sum()
        elif finished or (self.fold_folder(trainer, plans) / "checkpoint_final.pth").is_file():
            counts = self._training_groups().groupby(GROUP_COLUMN)["case"].size()
        else:
            return {}
        total = float(counts.sum())
        return {str(g): float(v) / total for g, v in counts.items()} if total > 0 else {}

    def noisy_cases(self) -> list[str]:
        """The training cases whose labels were corrupted and that are trained on (none without label
        noise; those the audit took out are not)."""
        record = self.folder / LABEL_NOISE_RECORD
        if not record.is_file():
            return []
        trained = set(self._training_groups()["case"])
        return [row["case"] for row in json.loads(record.read_text()) if row["case"] in trained]

    def training_case_count(self) -> int:
        """How many cases the arms train on: the cohort's, less any the audit took out."""
        return len(self._training_groups())

    def noisy_draw_share(self, trainer: str, plans: str = PLANS) -> float:
        """Share of the training draws that went to the noisy cases (uniform sampling: their share of
        the training cases, which is also what a run without a hardness report gets); NaN without
        label noise."""
        noisy = set(self.noisy_cases())
        if not noisy:
            return float("nan")
        report = self._hardness_report(trainer, plans)
        if report is None:
            return len(noisy) / self.training_case_count()
        total = float(report["times_drawn"].sum())
        return float(report.loc[report["case"].isin(noisy), "times_drawn"].sum()) / total if total > 0 else float("nan")

    def busiest_case_draws(self, trainer: str, plans: str = PLANS) -> float:
        """How far a case-weighting run concentrated on single cases: the most-drawn training case's
        draws over what uniform sampling gives each case (``total / n``; 1 = no case favoured).
        NaN without a hardness report (nnU-Net's own uniform sampling keeps no counts)."""
        report = self._hardness_report(trainer, plans)
        if report is None or not len(report):
            return float("nan")
        counts = report["times_drawn"].to_numpy(dtype=np.float64)
        total = counts.sum()
        return float(counts.max() * len(counts) / total) if total > 0 else float("nan")

    def all_learned_epoch(self, trainer: str, plans: str = PLANS) -> int | None:
        """The first epoch of the run with every structure's pseudo-Dice >= ``ALL_LEARNED``, read from
        its final checkpoint's log (for results stored before ``training_summary`` kept it); None
        if no epoch had, or the run's folder is gone."""
        checkpoint = self.fold_folder(trainer, plans) / "checkpoint_final.pth"
        if not checkpoint.is_file():
            return None
        return training_summary(checkpoint.parent)["all_learned_epoch"]

    def minority_hardness_auc(self, trainer: str, plans: str = PLANS) -> float:
        """How well the run's final stale losses single out the minority cases: the probability
        that a random minority case has a higher stale loss than a random control (Mann-Whitney
        AUC; 0.5: no better than chance). NaN without a hardness report."""
        report = self._hardness_report(trainer, plans)
        if report is None:
            return float("nan")
        from scipy.stats import mannwhitneyu

        minority = report[GROUP_COLUMN].isin(MINORITY_GROUPS).to_numpy()
        losses = report["stale_loss"].to_numpy(dtype=np.float64)
        if minority.all() or not minority.any():
            return float("nan")
        u = mannwhitneyu(losses[minority], losses[~minority]).statistic  # ties count one half
        return float(u) / (minority.sum() * (~minority).sum())

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
            self.echo(f"  {arm}: nnUNetv2_train {self.dataset_id} {CONFIGURATION} {FOLD} -tr {trainer}"
                      + (f" -p {plans}" if plans != PLANS else "") + (" --c (resuming)" if resume else ""))
            env = {**self.env, SEED_ENV: str(seed), **budget.env(), **extra}
            run_nnunet("nnUNetv2_train", [str(self.dataset_id), CONFIGURATION, FOLD, "-tr", trainer, "-p", plans,
                                          "-device", device, *resume], env, echo=show, log_file=self.log_file)
            self.arm_folder(arm).mkdir(parents=True, exist_ok=True)
            write_text_atomic(self.arm_folder(arm) / "train_seconds.txt", f"{time.perf_counter() - tic:.1f}\n")
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
            raise UserError(f"{self.folder}: the {JTT_ARM} arm needs the finished {BASELINE_ARM} arm (its first "
                            f"training); list {BASELINE_ARM} before it")
        fit = self.score_further(BASELINE_ARM, ARM_TRAINERS[BASELINE_ARM], "training", device=device)
        rule, fraction, upweight = JTT_SETTINGS["rule"], JTT_SETTINGS["fraction"], JTT_SETTINGS["upweight"]
        table, errors = jtt_table(fit, fraction, rule, upweight)
        self.arm_folder(JTT_ARM).mkdir(parents=True, exist_ok=True)
        write_text_atomic(table_path, table.to_csv(sep="\t", index=False))
        self.echo(f"  {JTT_ARM}: error set of the {BASELINE_ARM} network on its training cases ({rule}, worst "
                  f"{fraction:g}): {len(errors)} of {len(table)} cases, drawn {upweight:g} times as often")
        return table_path

    def _predict_and_score(self, arm: str, trainer: str, images: Path, labels: Path, groups: Path,
                           predictions: Path, device: str) -> pd.DataFrame:
        """``nnUNetv2_predict`` of ``images`` with the arm's final checkpoint, then the Dice of every
        case and region against ``labels`` (``nnunet_dro evaluate`` by condition)."""
        cases = len(list(labels.glob("*.nii.gz")))
        self.echo(f"  {arm}: nnUNetv2_predict of {cases} cases of {images.parent.name}/{images.name} (--disable_tta)")
        settings = PredictionSettings(configuration=CONFIGURATION, plans=ARM_PLANS.get(arm, PLANS), folds=(FOLD,),
                                      device=device, tta=False, npp=1, nps=1)
        predict(self.env, self.dataset_id, str(images), predictions, trainer, settings, echo=None,
                log_file=self.log_file)
        from nnunet_dro.evaluation.api import evaluate

        result = evaluate(str(labels), {arm: str(predictions)}, None, groups=str(groups),
                          group_by=[GROUP_COLUMN], regions=REGIONS, num_processes=2, progress=False, echo=self.echo)
        return result.per_case[result.per_case["metric"] == "dice"].copy()

    def run_arm(self, arm: str, trainer: str, seed: int, budget: Budget = Budget(), device: str = "cpu",
                show: Callable[[str], None] | None = None) -> tuple[dict, pd.DataFrame]:
        """Train, predict and evaluate one arm (or load its stored result)."""
        if self.finished(arm):
            return self.load(arm)
        fold_dir = self.fold_folder(trainer, self.plans_for(arm))
        self.train_arm(arm, trainer, seed, budget, device, show)
        times_file = self.arm_folder(arm) / "train_seconds.txt"  # the time of the run that trained it
        train_seconds = float(times_file.read_text()) if times_file.is_file() else float("nan")
        per_case = self._predict_and_score(arm, trainer, self.raw / "imagesTs", self.raw / "labelsTs",
                                           self.folder / "subgroups_test.tsv", self.arm_folder(arm) / "predictions",
                                           device)
        summary = {"arm": arm, "trainer": trainer, "plans": self.plans_for(arm), "seed": seed, "cohort": asdict(self.cohort),
                   "budget": asdict(budget), "train_seconds": round(train_seconds, 1),
                   **training_summary(fold_dir), "control_mean_dice": majority_means(per_case)}
        write_text_atomic(self.arm_folder(arm) / "per_case.csv", per_case.to_csv(index=False))
        write_text_atomic(self.arm_folder(arm) / "result.json", json.dumps(summary, indent=2, default=float))
        return summary, per_case

    # ------------------------------------------------------------------ further test sets
    def further_test_raw(self, cases: str, dataset_id: int) -> Path:
        suffix, _ = FURTHER_TESTS[cases]
        return Path(self.env["nnUNet_raw"]) / f"Dataset{dataset_id:03d}_{self.raw.name.split('_', 1)[1]}{suffix}"

    def prepare_further_test(self, cases: str, per_group: int, dataset_id: int) -> Path:
        """Draw ``per_group`` further test cases of each condition (cohort seed +
        ``LARGE_TEST_SEED_OFFSET``; ``cases`` names the set in ``FURTHER_TESTS``: ``large_test``
        at the cohort's sites, ``shifted_test`` the same anatomies at the new centre) as raw
        dataset ``dataset_id`` (one placeholder training case, which nothing uses), once per
        folder; return its raw folder.

        With twenty test cases per group a p10 interpolates between the second and third worst
        case: enough to see a large effect, not a few points. A larger set measures the same
        trained networks again, with the test-case draw's share of the noise shrunk."""
        c = self.cohort
        _, site = FURTHER_TESTS[cases]
        wanted = {"per_group": per_group, "seed": c.seed + LARGE_TEST_SEED_OFFSET, "size": c.size,
                  "dataset_id": dataset_id, **({"site": site} if site else {})}
        record = self.folder / f"{cases}.json"
        if record.is_file() and json.loads(record.read_text()) != wanted:
            raise UserError(f"{record}: this folder's {FURTHER_TEST_NAMES[cases]} was drawn as "
                            f"{json.loads(record.read_text())}, not {wanted}; use the same "
                            f"--{cases.replace('_', '-')} or another output folder")
        raw = self.further_test_raw(cases, dataset_id)
        if not (raw / "dataset.json").is_file():
            self.echo(f"  {FURTHER_TEST_NAMES[cases]}: {per_group} cases per condition, seed {wanted['seed']}"
                      + (f", acquired at {site}" if site else ""))
            run_python_cli(["make-synthetic", "--kind", "fetal", "--id", str(dataset_id), "-n", raw.name.split("_", 1)[1],
                            "--n-train", "1", "--n-test", str(per_group * 3), "--size", str(c.size),
                            "--seed", str(wanted["seed"]), "--overwrite", *(["--site", site] if site else [])],
                           self.env, self.log_file)
        write_split_table(read_subgroups(raw / SUBGROUPS_FILENAME), "test", self.folder / f"subgroups_{cases}.tsv")
        write_text_atomic(record, json.dumps(wanted, indent=2))
        return raw

    def score_further(self, arm: str, trainer: str, cases: str, dataset_id: int | None = None,
                      device: str = "cpu") -> pd.DataFrame:
        """The arm's final network scored again on further cases, once (stored in
        ``arms/<ARM>/per_case_<cases>.csv`` and loaded from there after):

        - ``"large_test"`` / ``"shifted_test"``: a further test set (:meth:`prepare_further_test`
          first, ``dataset_id``);
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
            raw, split = self.further_test_raw(cases, dataset_id), "Ts"
            groups = self.folder / f"subgroups_{cases}.tsv"
        else:
            raw, split = self.raw, "Tr"
            groups = self.folder / "subgroups_training.tsv"
            write_split_table(read_subgroups(raw / SUBGROUPS_FILENAME), "train", groups)
        per_case = self._predict_and_score(arm, trainer, raw / f"images{split}", raw / f"labels{split}", groups,
                                           self.arm_folder(arm) / f"predictions_{cases}", device)
        write_text_atomic(stored, per_case.to_csv(index=False))
        return per_case

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


def write_split_table(subgroups: pd.DataFrame, split: str, path: Path) -> None:
    """The subgroup rows of one split (``train``/``test``) as a tsv for ``nnunet_dro evaluate``,
    written atomically once (an existing file is kept)."""
    if not path.is_file():
        write_text_atomic(path, subgroups[subgroups["split"] == split].to_csv(sep="\t", index=False))


def training_summary(fold_dir: Path) -> dict:
    """What a finished training's checkpoint tells about it: epochs, stability, final pseudo-Dice,
    and for DRO arms the sampler's last and average statistics."""
    import torch

    checkpoint = torch.load(str(fold_dir / "checkpoint_final.pth"), map_location="cpu", weights_only=False)
    logging = checkpoint.get("logging", {})
    dice = [list(map(float, d)) for d in logging.get("dice_per_class_or_region", [])]
    out = {"epochs": len(dice), "collapsed_epochs": collapsed_epochs(dice), "lost_epochs": lost_epochs(dice),
           "all_learned_epoch": all_learned_epoch(dice),
           "collapse_rule": f"epochs >= {START_EPOCH} with a pseudo-Dice < {THRESHOLD}",
           "lost_rule": f"epochs with a pseudo-Dice < {THRESHOLD} of a structure that had reached {LEARNED}",
           "all_learned_rule": f"first epoch with every structure's pseudo-Dice >= {ALL_LEARNED}",
           "final_pseudo_dice": dice[-1] if dice else [],
           "final_train_loss": float(logging.get("train_losses", [np.nan])[-1])}
    history = (checkpoint.get("dro_state") or {}).get("history") or {}
    for key in ("beta", "perplexity_fraction", "ess_fraction", "clipped_fraction", "max_probability"):
        values = np.asarray([v for v in history.get(key, []) if v is not None], dtype=np.float64)
        if values.size:
            out[f"dro_{key}_last"] = float(values[-1])
            out[f"dro_{key}_mean"] = float(np.nanmean(values)) if np.isfinite(values).any() else float("nan")
    backed_off = [bool(v) for v in history.get("backed_off", []) if v is not None]
    if backed_off:  # the stability guard of the adaptive trainers
        out["guard_backoffs"] = int(sum(b and not a for a, b in zip([False] + backed_off, backed_off)))
        out["guard_uniform_epochs"] = int(sum(backed_off))
    if history.get("beta"):
        out["dro_robust_from_epoch"] = robust_from_epoch(history["beta"], history.get("epoch"))
    return out


def robust_from_epoch(betas: Sequence, epochs: Sequence | None = None) -> int | None:
    """The first epoch that drew under a beta well above the uniform phase's (``UNIFORM_BETA``),
    i.e. with robust weighting on; None if the run stayed uniform (ERM) throughout.

    >>> robust_from_epoch([1e-12, 1e-12, 3.5, 2.0]), robust_from_epoch([1e-12, None]), robust_from_epoch([4.0])
    (2, None, 0)
    """
    epochs = list(range(len(betas))) if epochs is None else list(epochs)
    for epoch, beta in zip(epochs, betas):
        if beta is not None and np.isfinite(beta) and beta > 1e3 * UNIFORM_BETA:
            return int(epoch)
    return None


def majority_means(per_case: pd.DataFrame) -> dict[str, float]:
    """Mean Dice (%) of the controls per region."""
    controls = per_case[per_case[GROUP_COLUMN] == MAJORITY_GROUP]
    return {str(r): float(v) for r, v in controls.groupby("region", sort=False)["value"].mean().items()}


def majority_learned(means: Mapping[str, float]) -> bool:
    """Whether every control region's mean Dice (%) is at least ``CONVERGED_DICE``: the regime check
    of a run, and what makes a seed count in the decision regime (scripts/evidence_intervals.py).

    >>> majority_learned({"white_matter": 93.0, "intra_axial_csf": 71.3}), majority_learned({})
    (False, False)
    """
    return bool(means) and min(means.values()) >= CONVERGED_DICE


def convergence_line(arm: str, summary: Mapping) -> str:
    """How converged a run is, in one line (the benchmark's and the demo's regime check)."""
    means = summary.get("control_mean_dice", {})
    ok = majority_learned(means)
    text = ", ".join(f"{r} {v:.1f}" for r, v in means.items())
    return (f"  {arm}: controls' mean Dice {text} ({'all' if ok else 'NOT all'} >= {CONVERGED_DICE:g}); "
            f"{summary.get('collapsed_epochs', '?')} of {max(0, summary.get('epochs', 0) - START_EPOCH)} epochs "
            f"since epoch {START_EPOCH} with a structure's pseudo-Dice < {THRESHOLD:g}, "
            f"{summary.get('lost_epochs', '?')} with a learned structure lost; "
            + (f"{learning_time_text(summary['all_learned_epoch'], summary.get('epochs', 0))}; "
               if "all_learned_epoch" in summary else "")
            + (f"stability guard: {summary['guard_backoffs']} back-off(s), {summary['guard_uniform_epochs']} "
               f"epochs sampled uniformly; " if summary.get("guard_backoffs") is not None else "")
            + f"trained in {summary.get('train_seconds', float('nan')):.0f} s")


_PROGRESS_MARKERS = ("Epoch ", "train_loss", "val_loss", "Pseudo dice", "Epoch time", "DRO:", "DRO guard",
                     "Error", "error", "Traceback", "Training done", "Predicting", "Done with")


def progress_filter(echo: Callable[[str], None]) -> Callable[[str], None]:
    """nnU-Net is chatty: show the lines that tell progress; the rest goes to the log file."""
    def show(line: str) -> None:
        if any(marker in line for marker in _PROGRESS_MARKERS):
            echo("    " + line.strip())
    return show


def run_python_cli(args: Sequence[str], env: Mapping[str, str], log_file: str) -> None:
    """Our own CLI in a subprocess, with the workspace's nnU-Net environment."""
    done = subprocess.run([sys.executable, "-m", "nnunet_dro", *args], env=dict(env), capture_output=True, text=True)
    with open(log_file, "a", encoding="utf-8") as log:
        log.write(done.stdout + done.stderr)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise UserError(f"nnunet_dro {args[0]} failed: {last}")
