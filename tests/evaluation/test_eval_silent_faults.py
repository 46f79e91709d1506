"""Issue 65's silent wrong results of ``nnunet_dro evaluate`` and their neighbours, through the real
CLI on tiny NIfTI folders: each ends in one line and exit 2 with nothing written (data_docs/faults.md,
"Round two").

- a refusal never suggests a flag that turns it into a wrong report: predictions that match no
  reference case (a folder of images), or files named like a case under another name, stay an
  error with ``--missing worst/skip``, and the message does not suggest them;
- region names on the command line are checked against the dataset.json beside the references;
- cross-validation reads ``splits_final.json`` and compares the folds of two trainers;
- a folder of ``.nii`` predictions against ``.nii.gz`` references says what it holds; a dataset
  folder given as a trainer folder says so.
"""
from __future__ import annotations

import json
import shutil

import pytest
from test_eval_crossval import CASES, DATASET, FOLD_OF, LABELS, TRAINER, make_world

from eval_testdata import make_cohort, run_cli

PREFIX = "nnunet_dro evaluate: error: "


def _messages(stderr: str) -> list[str]:
    return [line for line in stderr.replace("\r", "\n").splitlines()
            if line.strip() and not line.lstrip().startswith(("Reading cases", "Report written to"))]


def _refused(done, out, *expected: str) -> str:
    lines = _messages(done.stderr)
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and lines[0].startswith(PREFIX), lines
    for text in expected:
        assert text in lines[0], lines[0]
    assert "Traceback" not in done.stderr and not out.exists()
    return lines[0]


@pytest.fixture(scope="module")
def cohort(tmp_path_factory):
    root = tmp_path_factory.mktemp("silent")
    ref, preds = make_cohort(root, n_cases=4, methods=("A", "B"))
    images = root / "imagesTs"  # what a user passes by mistake: the input images, CASE_0000.nii.gz
    images.mkdir()
    for file in sorted(ref.iterdir()):
        shutil.copy(file, images / file.name.replace(".nii.gz", "_0000.nii.gz"))
    half = root / "half"  # two predictions, two files named like the images
    shutil.copytree(preds["B"], half)
    for case in ("case_002", "case_003"):
        (half / f"{case}.nii.gz").rename(half / f"{case}_0000.nii.gz")
    return root, ref, preds, images, half


@pytest.mark.parametrize("missing", ["error", "worst", "skip"])
def test_predictions_matching_no_case_are_refused_whatever_missing_says(cohort, tmp_path, missing):
    """Following the old hint (--missing worst) gave DRO Dice 0 everywhere, 'Wilcoxon p < 0.001'."""
    root, ref, preds, images, half = cohort
    out = tmp_path / "report"
    done = run_cli("-ref", ref, "-pred", f"ERM={preds['A']}", f"DRO={images}", "-o", out, "-np", "1",
                   "--missing", missing)
    line = _refused(done, out, f"-pred DRO={images}: none of its 4 file(s) matches a reference case",
                    "they look like nnU-Net input images (CASE_0000), not predictions")
    assert "--missing" not in line


@pytest.mark.parametrize("missing", ["error", "worst"])
def test_half_matched_under_another_name_is_refused_without_the_missing_hint(cohort, tmp_path, missing):
    root, ref, preds, images, half = cohort
    out = tmp_path / "report"
    done = run_cli("-ref", ref, "-pred", f"A={preds['A']}", f"B={half}", "-o", out, "-np", "1", "--missing", missing)
    line = _refused(done, out, "2 file(s) look like predictions of reference cases under another name "
                               "(case_002_0000 for case_002, case_003_0000 for case_003)")
    assert "--missing" not in line


def test_a_really_missing_prediction_still_offers_missing(cohort, tmp_path):
    root, ref, preds, images, half = cohort
    partial = tmp_path / "partial"
    shutil.copytree(preds["B"], partial)
    (partial / "case_003.nii.gz").unlink()
    out = tmp_path / "report"
    _refused(run_cli("-ref", ref, "-pred", f"B={partial}", "-o", out, "-np", "1"), out,
             "B has no prediction for 1 case(s): case_003 (use --missing worst or --missing skip to go on)")
    done = run_cli("-ref", ref, "-pred", f"B={partial}", "-o", out, "-np", "1", "--missing", "worst")
    assert done.returncode == 0, done.stderr


def test_nii_predictions_against_nii_gz_references_say_what_was_seen(tmp_path):
    raw, folders = make_world(tmp_path)
    pred = tmp_path / "pred_nii"
    pred.mkdir()
    import SimpleITK as sitk
    for file in sorted((raw / "labelsTr").iterdir()):
        sitk.WriteImage(sitk.ReadImage(str(file)), str(pred / file.name.replace(".nii.gz", ".nii")))
    out = tmp_path / "report"
    done = run_cli("-ref", raw / "labelsTr", "-pred", f"A={pred}", "-o", out, "-np", "1")
    _refused(done, out, f"prediction folder of A {pred} contains no segmentation files (.nii.gz); it holds 6 .nii, "
                        f"e.g. case_000.nii (the dataset.json of the references says file_ending .nii.gz")


@pytest.mark.parametrize("spec, expected", [
    ("white_matter=3;cerebellum=1", "white_matter is 1 there, 3 in the list, cerebellum is 3 there, 1 in the list"),
    ("cerebellum=2", "cerebellum is 3 there, 2 in the list"),
    ("Intra-Axial-CSF=1", "Intra-Axial-CSF is 2 there, 1 in the list"),
])
def test_region_names_on_the_command_line_are_checked_against_dataset_json(tmp_path, spec, expected):
    """-regions "cerebellum=4" used to report the ventricles as cerebellum, exit 0."""
    raw, folders = make_world(tmp_path)
    out = tmp_path / "report"
    done = run_cli("-ref", raw / "labelsTr", "-pred", f"A={folders[TRAINER]}", "-o", out, "-np", "1", "-regions", spec)
    _refused(done, out, f"-regions {spec} does not fit the dataset of the references: the list has", expected)
    fine = run_cli("-ref", raw / "labelsTr", "-pred", f"A={folders[TRAINER]}", "-o", out, "-np", "1", "-regions",
                   "cerebellum=3;tissue=1,2")  # right names, and a name of the user's own
    assert fine.returncode == 0, fine.stderr


def _splits(folds: dict[str, int]) -> list[dict]:
    return [{"train": sorted(c for c, f in folds.items() if f != k), "val": sorted(c for c, f in folds.items() if f == k)}
            for k in sorted(set(folds.values()))]


@pytest.mark.parametrize("where", ["trainer folder", "nnUNet_preprocessed"])
def test_cross_validation_follows_splits_final_json(tmp_path, monkeypatch, where):
    raw, folders = make_world(tmp_path)
    folder = folders[TRAINER]
    moved = dict(FOLD_OF, case_002=1)  # the split says case_002 is validated by fold 1; the folder has it in fold 0
    if where == "trainer folder":
        (folder / "splits_final.json").write_text(json.dumps(_splits(moved)))
    else:
        pre = tmp_path / "pre" / DATASET
        pre.mkdir(parents=True)
        (pre / "splits_final.json").write_text(json.dumps(_splits(moved)))
    monkeypatch.setenv("nnUNet_raw", str(tmp_path / "raw"))
    monkeypatch.setenv("nnUNet_preprocessed", str(tmp_path / "pre"))
    out = tmp_path / "report"
    _refused(run_cli("-pred", f"CV={folder}", "-o", out, "-np", "1"), out,
             "1 case(s) validated in another fold than", "splits_final.json says, e.g. 'case_002' in "
             "fold_0/validation, in the validation of fold 1 there")
    (tmp_path / "pre").exists() and shutil.rmtree(tmp_path / "pre")
    (folder / "splits_final.json").write_text(json.dumps(_splits(FOLD_OF)))  # the right split
    assert run_cli("-pred", f"CV={folder}", "-o", out, "-np", "1").returncode == 0


def test_two_trainers_with_different_folds_are_not_paired(tmp_path, monkeypatch):
    """A case moved from one trainer's fold_1 to another's fold_0 used to give exit 0."""
    other = "nnUNetTrainerDRO__nnUNetPlans__3d_fullres"
    raw, folders = make_world(tmp_path, trainers=(TRAINER, other))
    moved = folders[other] / "fold_1" / "validation" / "case_003.nii.gz"
    moved.rename(folders[other] / "fold_0" / "validation" / "case_003.nii.gz")
    monkeypatch.setenv("nnUNet_raw", str(tmp_path / "raw"))
    out = tmp_path / "report"
    _refused(run_cli("-pred", f"ERM={folders[TRAINER]}", f"DRO={folders[other]}", "-o", out, "-np", "1"), out,
             "-pred DRO: 1 case(s) validated in another fold than in ERM, e.g. 'case_003' in fold_0 of "
             f"{other} and fold_1 of {TRAINER}")


@pytest.mark.parametrize("given", ["results dataset", "raw dataset"])
def test_a_dataset_folder_given_as_predictions_is_named(tmp_path, monkeypatch, given):
    raw, folders = make_world(tmp_path)
    monkeypatch.setenv("nnUNet_raw", str(tmp_path / "raw"))
    folder = folders[TRAINER].parent if given == "results dataset" else raw
    out = tmp_path / "report"
    expected = (f"a dataset folder of nnUNet_results holding the trainer folder(s) {TRAINER}; give one of them"
                if given == "results dataset" else "an nnU-Net raw dataset folder (dataset.json, imagesTr, labelsTr)")
    if given == "raw dataset":
        (raw / "imagesTr").mkdir()
    _refused(run_cli("-pred", f"CV={folder}", "-o", out, "-np", "1"), out, f"-pred CV={folder}: {expected}")


assert set(CASES) == set(FOLD_OF) and LABELS["cerebellum"] == 3  # the world these tests build on
