"""docs/tutorial.md runs: every command of its FeTA section, in the page's order, in one bash shell
(``set -e``: the first command that exits non-zero stops it and fails the test), on a fake FeTA 2.1
release in the real BIDS layout (``make_feta_tree`` of the converter tests: 8 subjects of 16^3
voxels, random labels, 5 Neurotypical and 3 Pathological), on CPU.

What the test changes in the page's commands, and nothing else:

1. the release folder ``/data/feta_2.1`` -> the fake release in tmp;
2. the trainers: ``-tr NAME`` (also ``-tr ALIAS=NAME`` of ``nnunet_dro ensemble``) ->
   ``NAME_tutorialTest``, and the trainer output folders ``/NAME__PLANS__CONFIG`` in the evaluate
   command likewise. ``NAME_tutorialTest`` are test-sized subclasses (1 epoch of 2 iterations, one
   validation iteration; nnU-Net's final validation kept, the cross-validation report reads
   ``fold_N/validation``) in a tmp folder, which the harness joins to ``nnUNet_extTrainer`` (with
   ``os.pathsep``) right after the page's own ``export nnUNet_extTrainer=$(nnunet_dro trainer-dir)``
   line has run.

It appends ``-device cpu`` to ``nnUNetv2_train``, ``nnUNetv2_predict`` and ``nnunet_dro ensemble``
(which runs nnUNetv2_predict), and ``-npp 1 -nps 1`` to ``nnunet_dro ensemble``. The environment
holds what the page's "Before you start" section sets (nnUNet_raw, nnUNet_preprocessed,
nnUNet_results, here in tmp) and CPU-sized nnU-Net settings: ``nnUNet_def_n_proc=1``,
``nnUNet_compile=f``, and ``nnUNet_n_proc_DA=0`` from the command after
``nnUNetv2_plan_and_preprocess`` on (nnU-Net's planner calls
``torch.set_num_threads(nnUNet_n_proc_DA)``, which fails for 0, so it plans with 1).

Checks: every command exits 0; the cross-validation report read folds 0-4 and all 6 training
cases, and names the groups the tutorial names (control, other, the gestational-age bins of the
training cases); the test-set evaluation of both trainers and the export zip exist.

Runtime: 4.0 min alone on 2 cores (4.8 CPU-minutes), December 4, 2026. Most of it is nnU-Net's
process start-ups: every nnUNetv2_train imports for ~5 s, and its final validation starts two
spawned pools (segmentation export, metrics), each worker importing torch and nnU-Net again. With
``nnUNet_def_n_proc=2`` and the ensemble's default 3 + 3 predict workers it took 7.3 min in the
suite beside another worker (the validation of one 16^3 case 35 s, the ensemble 87 s). One worker
per pool is still nnU-Net's real multiprocessing, at half the start-ups.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pandas as pd
import pytest

from nnunet_dro.evaluation.groups import parse_group_by

ROOT = Path(__file__).resolve().parents[2]
import test_data_feta  # noqa: E402  (the converter tests' fake FeTA release: tests/data, pyproject's pythonpath)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

PAGE = ROOT / "docs" / "tutorial.md"
BIN = Path(sys.executable).parent
RELEASE = "/data/feta_2.1"
SUFFIX = "_tutorialTest"
SHAPE = (16, 16, 16)
SUBJECTS = {  # participant -> (Pathology, Gestational age, rec), as in FeTA 2.1's participants.tsv
    "sub-001": ("Neurotypical", "21.2", "mial"),
    "sub-002": ("Neurotypical", "23.9", "irtk"),
    "sub-003": ("Neurotypical", "26.5", "mial"),
    "sub-004": ("Neurotypical", "29.1", "irtk"),
    "sub-005": ("Neurotypical", "33.4", "mial"),
    "sub-006": ("Pathological", "22.7", "irtk"),
    "sub-007": ("Pathological", "27.8", "mial"),
    "sub-008": ("Pathological", "31.6", "irtk"),
}
TEST_TRAINERS = ("nnUNetTrainer", "nnUNetTrainerDROAdaptive")
TRAINER_MODULE = '''
"""Test-sized twins of the tutorial's trainers (found through nnUNet_extTrainer)."""
from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer

from nnunet_dro.training import nnUNetTrainerDROAdaptive
from nnunet_dro.training.short_run import ShortRun


class TutorialTestSize(ShortRun):
    short_epochs, short_iterations, short_val_iterations = 1, 2, 1


class nnUNetTrainer_tutorialTest(TutorialTestSize, nnUNetTrainer):
    pass


class nnUNetTrainerDROAdaptive_tutorialTest(TutorialTestSize, nnUNetTrainerDROAdaptive):
    pass
'''


def feta_shell_blocks(page: Path) -> list[str]:
    """The ```bash blocks between the '## FeTA' heading and the next '## ' heading."""
    section = re.search(r"^## FeTA[^\n]*\n(.*?)(?=^## )", page.read_text(), re.S | re.M)
    assert section, f"{page}: no '## FeTA' section"
    return re.findall(r"^```bash\n(.*?)^```", section.group(1), re.S | re.M)


def tutorial_script(blocks: list[str], release: Path, trainer_dir: Path) -> tuple[str, dict]:
    """The page's commands with the rewrites of the module docstring, and how often each applied."""
    text = "\n".join(blocks).replace("\\\n", " ")  # one logical line per command
    counts = {"release": text.count(RELEASE)}
    text = text.replace(RELEASE, str(release))
    renamed = []

    def rename(match: re.Match) -> str:
        renamed.append(match.group(1))
        return match.group(1) + SUFFIX

    def rename_tr(match: re.Match) -> str:
        return re.sub(r"\b(nnUNetTrainer\w*)", rename, match.group(0))

    text, counts["-tr"] = re.subn(r"-tr(?:[ \t]+(?:\w+=)?nnUNetTrainer\w*)+", rename_tr, text)
    text, counts["trainer folder"] = re.subn(r"/(nnUNetTrainer\w*?)(?=__)", lambda m: "/" + rename(m), text)
    unknown = sorted(set(renamed) - set(TEST_TRAINERS))
    assert not unknown, f"the tutorial trains {unknown}: add their test-sized twins to TRAINER_MODULE"
    lines = []
    for line in text.splitlines():
        command = line.strip()
        if re.match(r"(nnUNetv2_train|nnUNetv2_predict|nnunet_dro ensemble)\s", command):
            line += " -device cpu"
        if re.match(r"nnunet_dro ensemble\s", command):
            line += " -npp 1 -nps 1"  # one nnUNetv2_predict worker of each kind: CPU-sized, like -device cpu
        lines.append(line)
        if command.startswith("export nnUNet_extTrainer="):
            lines.append(f'export nnUNet_extTrainer="$nnUNet_extTrainer{os.pathsep}{trainer_dir}"')
        if command.startswith("nnUNetv2_plan_and_preprocess"):
            lines.append("export nnUNet_n_proc_DA=0  # training without augmentation worker processes")
    header = ["set -eo pipefail",
              "trap 'echo \"TUTORIAL COMMAND FAILED (exit $?): $BASH_COMMAND\" >&2' ERR",
              "set -x"]
    return "\n".join(header + lines + ["set +x", "echo TUTORIAL_DONE"]) + "\n", counts


def evaluate_group_by(blocks: list[str]) -> list[str]:
    """The --group-by values of the tutorial's `nnunet_dro evaluate` command."""
    text = "\n".join(blocks).replace("\\\n", " ")
    command = next(line for line in text.splitlines() if line.strip().startswith("nnunet_dro evaluate"))
    argv = shlex.split(command)
    values = []
    for token in argv[argv.index("--group-by") + 1:]:
        if token.startswith("-"):
            break
        values.append(token)
    return values


def test_the_feta_tutorial_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.setattr(test_data_feta, "SHAPE", SHAPE)  # the fixture's subjects, 16^3 voxels
    release = test_data_feta.make_feta_tree(tmp_path / "feta_2.1", subjects=SUBJECTS)
    trainer_dir = tmp_path / "tutorial_trainers"
    trainer_dir.mkdir()
    (trainer_dir / "tutorial_test_trainers.py").write_text(textwrap.dedent(TRAINER_MODULE))
    blocks = feta_shell_blocks(PAGE)
    script, counts = tutorial_script(blocks, release, trainer_dir)
    for needed in ("nnunet_dro convert-feta", "nnUNetv2_plan_and_preprocess", "nnUNetv2_train",
                   "nnunet_dro evaluate", "nnunet_dro ensemble", "nnunet_dro export"):
        assert needed in script, f"the FeTA section of {PAGE.name} has no {needed} command any more"
    assert all(counts.values()), f"a rewrite did not apply (page changed?): {counts}"
    (tmp_path / "tutorial.sh").write_text(script)

    nnunet = {name: tmp_path / name for name in ("nnUNet_raw", "nnUNet_preprocessed", "nnUNet_results")}
    env = {key: value for key, value in os.environ.items() if not key.startswith("nnUNet")}
    env.update({name: str(path) for name, path in nnunet.items()})
    env.update({"PATH": f"{BIN}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}", "nnUNet_def_n_proc": "1",
                "nnUNet_n_proc_DA": "1", "nnUNet_compile": "f", "OMP_NUM_THREADS": "1",
                "MKL_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"})
    work = tmp_path / "work"
    work.mkdir()
    log_path = tmp_path / "tutorial.log"
    with open(log_path, "w") as log:
        done = subprocess.run(["bash", str(tmp_path / "tutorial.sh")], cwd=work, env=env, stdout=log,
                              stderr=subprocess.STDOUT, timeout=2300)
    log = log_path.read_text(errors="replace")
    failed = [line for line in log.splitlines() if line.startswith("TUTORIAL COMMAND FAILED")]
    assert done.returncode == 0 and "TUTORIAL_DONE" in log, \
        f"{failed or 'exit ' + str(done.returncode)}\n--- end of the output ---\n{log[-6000:]}"

    # The cross-validation report: five folds, the training cases, the groups the tutorial names.
    dataset = nnunet["nnUNet_raw"] / "Dataset201_FeTA"
    table = pd.read_csv(dataset / "subgroups.tsv", sep="\t")
    train = table[table["split"] == "train"]
    assert set(table["condition"]) == {"control", "other"} and len(train) == 6
    report = work / "report_cv"
    text = (report / "table.md").read_text()
    assert "Cross-validation:" in text and "folds 0, 1, 2, 3, 4 (6 cases)" in text, text[:2000]
    summary = pd.read_csv(report / "summary.csv")
    groups = summary.groupby("group_column")["group"].apply(set).to_dict()
    assert groups["all"] == {"all"} and groups["condition"] == {"control", "other"}, groups
    spec = next(s for s in evaluate_group_by(blocks) if s.startswith("gestational_age:"))
    bins = parse_group_by([spec])[0]
    binned = {bins.bin_label(age) for age in train["gestational_age"]}
    assert groups["gestational_age"] == binned and len(binned) >= 2, (binned, groups)
    assert set(summary["method"]) == {"ERM", "DRO"}
    comparison = pd.read_csv(report / "comparison.csv")
    assert set(comparison["method"]) == {"DRO"} and {"all", "other"} <= set(comparison["group"])

    # The held-out test cases (one per condition) through the 5-fold ensembles, and the export.
    test_summary = pd.read_csv(work / "ens_test" / "evaluation" / "summary.csv")
    assert set(test_summary["method"]) == {"ERM", "DRO"}
    assert {"control", "other"} <= set(test_summary[test_summary["group_column"] == "condition"]["group"])
    names = zipfile.ZipFile(work / "Dataset201_FeTA_DRO.zip").namelist()
    assert any(n.endswith("nnUNetTrainer__nnUNetPlans__3d_fullres/fold_4/checkpoint_final.pth") for n in names)
