"""A benchmark working folder's cohort: the synthetic cohort made once, its label noise, the audit's
exclusion, nnU-Net's planning and preprocessing, and the further test sets; the cases the arms train on.

The folder has its own ``nnUNet_raw``/``_preprocessed``/``_results`` (:attr:`CohortFolder.env`),
and ``cohort.json`` ties it to one :class:`Cohort`: a later run with other settings is refused
rather than mixed into it. Every step is skipped when its output is there, so a run resumes.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

import pandas as pd

from nnunet_dro.atomic import replaced_folder, write_text_atomic
from nnunet_dro.data.exclude_cases import EXCLUDED_FILENAME, reasons_from_flags, write_dataset_without
from nnunet_dro.data.label_audit import audit_volumes, dataset_labels, label_volumes
from nnunet_dro.data.subgroups import SUBGROUPS_FILENAME, read_subgroups
from nnunet_dro.data.synthetic_fetal import NEW_CENTRE
from nnunet_dro.errors import UserError
from nnunet_dro.lab.budget import THREADS_ENV
from nnunet_dro.lab.ext_trainers import lab_trainer_dirs
from nnunet_dro.lab.label_noise import RECORD as LABEL_NOISE_RECORD
from nnunet_dro.lab.label_noise import corrupt_training_labels
from nnunet_dro.lab.splits import SPLITS_FILENAME, stratified_folds, write_splits
from nnunet_dro.workflows.nnunet_commands import nnunet_environment, run_nnunet

#: the plans identifier ``nnUNetv2_plan_and_preprocess`` writes, and every arm trains under but
#: those of :data:`~nnunet_dro.lab.arm_runs.ARM_PLANS`
PLANS = "nnUNetPlans"
GROUP_COLUMN = "condition"
MAJORITY_GROUP = "control"
MINORITY_GROUPS = ("spina_bifida", "other")
#: ``exclude_flagged``: which training cases the audit took out, and why (beside ``label_noise.json``)
AUDIT_EXCLUDED_RECORD = "audit_excluded.json"
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
    #: label noise: what a user who drops every flagged case would train on (:meth:`CohortFolder.prepare`)
    exclude_flagged: bool = False
    #: None: 3D volumes (``3d_fullres``); a number: the 2D cohort of one parasagittal plane at that
    #: x (:mod:`nnunet_dro.lab.cohort2d`, nnU-Net's ``2d``), ``size`` its pixels per side
    plane: float | None = None
    #: train fold 0 of a split stratified by condition (nnU-Net's validation on its held-out fifth,
    #: kept), not fold ``all`` (every training case trained on, no validation)
    validation_fold: bool = False

    @property
    def configuration(self) -> str:
        """nnU-Net's configuration the arms train and predict with."""
        return "3d_fullres" if self.plane is None else "2d"

    @property
    def fold(self) -> str:
        """The fold the arms train (``0`` or ``all``).

        >>> Cohort().fold, Cohort(validation_fold=True).fold, Cohort(plane=0.11).configuration
        ('all', '0', '2d')
        """
        return "0" if self.validation_fold else "all"


class CohortFolder:
    """One working folder's cohort and nnU-Net folders."""

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
            # a cohort.json without these keys was made with their defaults
            found = {"label_noise": 0, "exclude_flagged": False, "plane": None, "validation_fold": False,
                     **json.loads(path.read_text())}
            if found != wanted:
                raise UserError(f"{path}: this folder was made with cohort {found}, not {wanted}; use the same "
                                f"cohort settings, another output folder, or --overwrite")
        else:
            write_text_atomic(path, json.dumps(wanted, indent=2))

    def prepare(self) -> pd.DataFrame:
        """Make the cohort and preprocess it (each only once); return its subgroup table."""
        c = self.cohort
        generated = not (self.raw / "dataset.json").is_file()
        if generated:
            shape = f"{c.size}^3" if c.plane is None else f"{c.size}^2 (planes at x = {c.plane:g})"
            self.echo(f"  cohort: {c.n_train} train + {c.n_test} test cases of {shape}, seed {c.seed}")
            self._make_synthetic(["--id", str(self.dataset_id), "-n", self.raw.name.split("_", 1)[1],
                                  "--n-train", str(c.n_train), "--n-test", str(c.n_test), "--size", str(c.size),
                                  "--seed", str(c.seed), "--overwrite"])
        subgroups = read_subgroups(self.raw / SUBGROUPS_FILENAME)
        record = self.folder / LABEL_NOISE_RECORD
        # Labels just generated are clean even where a noise record exists: a seed folder restored
        # from a record (--export-record) keeps label_noise.json but not the raw images.
        if c.label_noise and (generated or not record.is_file()):
            recorded = json.loads(record.read_text()) if record.is_file() else None
            if recorded is None and self.is_preprocessed():
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
        if not self.is_preprocessed():
            self.echo("  nnUNetv2_plan_and_preprocess")
            # nnU-Net's planner calls torch.set_num_threads(nnUNet_n_proc_DA), which fails for 0
            env = {**self.env, "nnUNet_n_proc_DA": str(max(1, int(self.env["nnUNet_n_proc_DA"])))}
            run_nnunet("nnUNetv2_plan_and_preprocess",
                       ["-d", str(self.dataset_id), "-c", c.configuration, "-np", "2", "--verify_dataset_integrity"],
                       env, echo=None, log_file=self.log_file)
        if c.validation_fold:
            train = subgroups[subgroups["split"] == "train"]
            write_splits(self.preprocessed, stratified_folds(dict(zip(train["case"], train[GROUP_COLUMN])), seed=c.seed))
        write_split_table(subgroups, "test", self.folder / "subgroups_test.tsv")
        return subgroups

    def _make_synthetic(self, args: Sequence[str]) -> None:
        """``make-synthetic --kind fetal`` with ``args``, or the plane cohort's command for a 2D cohort
        (the same options and the same cases, cut at the plane)."""
        if self.cohort.plane is None:
            run_python_cli(["make-synthetic", "--kind", "fetal", *args], self.env, self.log_file)
        else:
            run_python_cli([*args, "--plane", str(self.cohort.plane)], self.env, self.log_file,
                           module="nnunet_dro.lab.cohort2d")

    def fold_training_cases(self) -> list[str] | None:
        """The cases fold 0 trains on (``splits_final.json``), or None for fold ``all`` (every one)."""
        if not self.cohort.validation_fold:
            return None
        return list(json.loads((self.preprocessed / SPLITS_FILENAME).read_text())[0]["train"])

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

    def is_preprocessed(self) -> bool:
        """Planned and every training case preprocessed (an interrupted run can leave plans only)."""
        cases = self.preprocessed / f"nnUNetPlans_{self.cohort.configuration}"
        return ((self.preprocessed / "nnUNetPlans.json").is_file() and cases.is_dir()
                and len(list(cases.glob("*.pkl"))) == self._raw_training_count())

    def _raw_training_count(self) -> int:
        """The raw dataset's ``numTraining`` (the cohort's, less any case the audit took out)."""
        meta = self.raw / "dataset.json"
        return int(json.loads(meta.read_text())["numTraining"]) if meta.is_file() else self.cohort.n_train

    def training_groups(self) -> pd.DataFrame:
        """The cases the arms train on (the audit's exclusions left out), with their condition."""
        subgroups = read_subgroups(self.raw / SUBGROUPS_FILENAME)
        return subgroups[subgroups["split"] == "train"][["case", GROUP_COLUMN]]

    def noisy_cases(self) -> list[str]:
        """The training cases whose labels were corrupted and that are trained on (none without label
        noise; those the audit took out are not)."""
        record = self.folder / LABEL_NOISE_RECORD
        if not record.is_file():
            return []
        trained = set(self.training_groups()["case"])
        return [row["case"] for row in json.loads(record.read_text()) if row["case"] in trained]

    def training_case_count(self) -> int:
        """How many cases the arms train on: the cohort's, less any the audit took out."""
        return len(self.training_groups())

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
                  "dataset_id": dataset_id, **({"site": site} if site else {}),
                  **({"plane": c.plane} if c.plane is not None else {})}
        record = self.folder / f"{cases}.json"
        if record.is_file() and json.loads(record.read_text()) != wanted:
            raise UserError(f"{record}: this folder's {FURTHER_TEST_NAMES[cases]} was drawn as "
                            f"{json.loads(record.read_text())}, not {wanted}; use the same "
                            f"--{cases.replace('_', '-')} or another output folder")
        raw = self.further_test_raw(cases, dataset_id)
        if not (raw / "dataset.json").is_file():
            self.echo(f"  {FURTHER_TEST_NAMES[cases]}: {per_group} cases per condition, seed {wanted['seed']}"
                      + (f", acquired at {site}" if site else ""))
            self._make_synthetic(["--id", str(dataset_id), "-n", raw.name.split("_", 1)[1], "--n-train", "1",
                                  "--n-test", str(per_group * 3), "--size", str(c.size), "--seed", str(wanted["seed"]),
                                  "--overwrite", *(["--site", site] if site else [])])
        write_split_table(read_subgroups(raw / SUBGROUPS_FILENAME), "test", self.folder / f"subgroups_{cases}.tsv")
        write_text_atomic(record, json.dumps(wanted, indent=2))
        return raw


def write_split_table(subgroups: pd.DataFrame, split: str, path: Path) -> None:
    """The subgroup rows of one split (``train``/``test``) as a tsv for ``nnunet_dro evaluate``,
    written atomically once (an existing file is kept)."""
    if not path.is_file():
        write_text_atomic(path, subgroups[subgroups["split"] == split].to_csv(sep="\t", index=False))


def run_python_cli(args: Sequence[str], env: Mapping[str, str], log_file: str, module: str = "nnunet_dro") -> None:
    """Our own CLI (or the lab's ``module``) in a subprocess, with the workspace's nnU-Net environment."""
    done = subprocess.run([sys.executable, "-m", module, *args], env=dict(env), capture_output=True, text=True)
    with open(log_file, "a", encoding="utf-8") as log:
        log.write(done.stdout + done.stderr)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise UserError(f"{'nnunet_dro ' + args[0] if module == 'nnunet_dro' else module} failed: {last}")
