"""convert-feta on tiny fake FeTA trees with the real BIDS layout, written here."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import SimpleITK as sitk

from converter_cli import listing, raw_with_other_dataset, run_converter, truncate
from data_raw_checks import assert_valid_raw_dataset
from nnunet_dro.data.feta import THREE_REGION_MAP, convert_feta, normalise_condition, parse_gestational_age
from nnunet_dro.data.raw_dataset import DatasetTarget
from nnunet_dro.data.splits import HeldOutSplit
from nnunet_dro.errors import UserError

SHAPE = (6, 7, 8)  # z, y, x: small and anisotropic so axis mix-ups show
SUBJECTS = {  # participant -> (Pathology, Gestational age, rec)
    "sub-001": ("Neurotypical", "24.3", "mial"),
    "sub-002": ("Pathological", "28.9", "irtk"),
    "sub-003": ("Neurotypical", "31", "mial"),
    "sub-004": ("Pathological", "22.1", "nmic"),
}


def _write(array: np.ndarray, path: Path, spacing=(0.8, 0.8, 0.8)) -> None:
    image = sitk.GetImageFromArray(array)
    image.SetSpacing(spacing)
    image.SetOrigin((-10.0, 5.0, 2.5))
    path.parent.mkdir(parents=True, exist_ok=True)
    sitk.WriteImage(image, str(path))


def _label_array(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    label = rng.integers(0, 8, size=SHAPE).astype(np.uint8)
    label[0] = 0
    return label


def make_feta_tree(root: Path, subjects=SUBJECTS, header="participant_id\tPathology\tGestational age"
                   ) -> Path:
    lines = [header]
    for number, (participant, (pathology, age, rec)) in enumerate(subjects.items()):
        lines.append(f"{participant}\t{pathology}\t{age}")
        anat = root / participant / "anat"
        _write(np.random.default_rng(number).random(SHAPE).astype(np.float32) * 1000,
               anat / f"{participant}_rec-{rec}_T2w.nii.gz")
        _write(_label_array(number), anat / f"{participant}_rec-{rec}_dseg.nii.gz")
    (root / "participants.tsv").write_text("\n".join(lines) + "\n")
    return root


def test_feta_conversion_keeps_seven_labels_and_writes_subgroups(tmp_path, raw):
    source = make_feta_tree(tmp_path / "feta_2.1")
    target = convert_feta(source, DatasetTarget(201, "FeTA"), HeldOutSplit(["sub-004"]))
    assert target == raw / "Dataset201_FeTA"
    dataset = json.loads((target / "dataset.json").read_text())
    assert dataset["channel_names"] == {"0": "T2"}
    assert dataset["labels"]["white_matter"] == 3 and dataset["labels"]["cerebellum"] == 5
    assert dataset["numTraining"] == 3 and dataset["file_ending"] == ".nii.gz"
    assert sorted(p.name for p in (target / "imagesTr").iterdir()) == [
        "sub-001_0000.nii.gz", "sub-002_0000.nii.gz", "sub-003_0000.nii.gz"]
    assert [p.name for p in (target / "imagesTs").iterdir()] == ["sub-004_0000.nii.gz"]
    written = sitk.ReadImage(str(target / "labelsTs" / "sub-004.nii.gz"))
    np.testing.assert_array_equal(sitk.GetArrayFromImage(written), _label_array(3))
    assert written.GetSpacing() == pytest.approx((0.8, 0.8, 0.8))
    table = pd.read_csv(target / "subgroups.tsv", sep="\t")
    assert table.to_dict("list") == {
        "case": ["sub-001", "sub-002", "sub-003", "sub-004"],
        "condition": ["control", "other", "control", "other"],
        "gestational_age": [24.3, 28.9, 31.0, 22.1],
        "centre": ["zurich", "zurich", "zurich", "vienna"],
        "reconstruction": ["mial", "irtk", "mial", "nmic"],
        "split": ["train", "train", "train", "test"]}


def test_feta_three_regions_merge_and_condition_overrides(tmp_path, raw):
    source = make_feta_tree(tmp_path / "feta")
    overrides = tmp_path / "diagnoses.tsv"
    overrides.write_text("participant_id\tcondition\nsub-002\tSpina bifida aperta\n")
    target = convert_feta(source, DatasetTarget(202, "FeTA3"), three_regions=True, conditions=overrides)
    labels = json.loads((target / "dataset.json").read_text())["labels"]
    assert labels == {"background": 0, "white_matter": 1, "intra_axial_csf": 2, "cerebellum": 3}
    merged = sitk.GetArrayFromImage(sitk.ReadImage(str(target / "labelsTr" / "sub-002.nii.gz")))
    original = _label_array(1)
    expected = np.zeros_like(original)
    for feta, region in THREE_REGION_MAP.items():
        expected[original == feta] = region
    np.testing.assert_array_equal(merged, expected)
    table = pd.read_csv(target / "subgroups.tsv", sep="\t").set_index("case")
    assert table.loc["sub-002", "condition"] == "spina_bifida"
    assert table.loc["sub-004", "condition"] == "other"


def test_feta_output_is_a_consistent_raw_dataset(tmp_path, raw):
    target = convert_feta(make_feta_tree(tmp_path / "feta"), DatasetTarget(203, "FeTA"),
                          HeldOutSplit(test_fraction=0.5))
    table = assert_valid_raw_dataset(target)
    assert set(table["split"]) == {"train", "test"}


def _break(kind: str, root: Path) -> str:
    """Damage a fresh fake tree one way; return a fragment the error message must contain."""
    anat = root / "sub-002" / "anat"
    if kind == "no participants.tsv":
        (root / "participants.tsv").unlink()
        return "participants.tsv not found"
    if kind == "missing participants row":
        lines = (root / "participants.tsv").read_text().splitlines()
        (root / "participants.tsv").write_text("\n".join(l for l in lines if "sub-003" not in l))
        return "no row for sub-003"
    if kind == "missing T2w":
        next(anat.glob("*_T2w.nii.gz")).unlink()
        return "no T2w image"
    if kind == "missing dseg":
        next(anat.glob("*_dseg.nii.gz")).unlink()
        return "no dseg label map"
    if kind == "two T2w files":
        _write(np.zeros(SHAPE, np.float32), anat / "sub-002_rec-other_T2w.nii.gz")
        return "several T2w images"
    if kind == "shape mismatch":
        _write(np.zeros((6, 7, 9), np.uint8), next(anat.glob("*_dseg.nii.gz")))
        return "shape"
    if kind == "spacing mismatch":
        _write(_label_array(1), next(anat.glob("*_dseg.nii.gz")), spacing=(0.8, 0.8, 1.2))
        return "spacing"
    if kind == "unexpected label":
        label = _label_array(1)
        label[2, 2, 2] = 9
        _write(label, next(anat.glob("*_dseg.nii.gz")))
        return "unexpected label values [9]"
    if kind == "non-integer label":
        _write(np.full(SHAPE, 2.5, np.float32), next(anat.glob("*_dseg.nii.gz")))
        return "non-integer"
    if kind == "corrupt image":
        next(anat.glob("*_T2w.nii.gz")).write_bytes(b"not a nifti")
        return "cannot read image"
    if kind == "bad gestational age":
        text = (root / "participants.tsv").read_text().replace("28.9", "late")
        (root / "participants.tsv").write_text(text)
        return "gestational age"
    if kind == "no pathology column":
        text = (root / "participants.tsv").read_text().replace("Pathology", "Notes")
        (root / "participants.tsv").write_text(text)
        return "no Pathology column"
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", [
    "no participants.tsv", "missing participants row", "missing T2w", "missing dseg",
    "two T2w files", "shape mismatch", "spacing mismatch", "unexpected label",
    "non-integer label", "corrupt image", "bad gestational age", "no pathology column"])
def test_feta_bad_input_is_one_clear_error_and_writes_nothing(tmp_path, raw, kind):
    root = make_feta_tree(tmp_path / "feta")
    fragment = _break(kind, root)
    with pytest.raises(UserError) as error:
        convert_feta(root, DatasetTarget(204, "FeTA"))
    message = str(error.value)
    assert fragment in message and "\n" not in message
    assert not raw.exists() or not any(raw.iterdir())  # nothing half-written


def test_feta_unknown_test_case_and_existing_output(tmp_path, raw):
    root = make_feta_tree(tmp_path / "feta")
    with pytest.raises(UserError, match="unknown test cases"):
        convert_feta(root, DatasetTarget(205, "FeTA"), HeldOutSplit(["sub-999"]))
    convert_feta(root, DatasetTarget(205, "FeTA"))
    with pytest.raises(UserError, match="already exists; pass --overwrite"):
        convert_feta(root, DatasetTarget(205, "FeTA"))
    convert_feta(root, DatasetTarget(205, "FeTA", overwrite=True), three_regions=True)
    with pytest.raises(UserError, match="dataset ID 205 is already used"):
        convert_feta(root, DatasetTarget(205, "Other"))


@pytest.mark.parametrize("value, expected", [
    ("Neurotypical", "control"), ("Pathological", "other"), ("spina bifida", "spina_bifida"),
    ("Spina_Bifida", "spina_bifida"), ("MMC", "spina_bifida"), ("control", "control"),
    ("Dandy-Walker malformation", "other"), ("ventriculomegaly", "other")])
def test_feta_condition_spellings(value, expected):
    assert normalise_condition(value) == expected


@pytest.mark.parametrize("value, expected", [
    ("24", 24.0), ("24.5", 24.5), ("26+3", 26.43), ("26w3d", 26.43), ("31 weeks", 31.0)])
def test_feta_gestational_age_formats(value, expected):
    assert parse_gestational_age(value) == pytest.approx(expected)


@pytest.mark.parametrize("value", ["", "late", "3", "26+x"])
def test_feta_gestational_age_rejects(value):
    with pytest.raises(ValueError):
        parse_gestational_age(value)


def test_feta_cli_success_and_error_exit_codes(tmp_path):
    root = make_feta_tree(tmp_path / "feta")
    env = {"PATH": "/usr/bin:/bin", "nnUNet_raw": str(tmp_path / "raw")}
    ok = subprocess.run([sys.executable, "-m", "nnunet_dro", "convert-feta", str(root), "--id",
                         "206", "--test-fraction", "0.5", "--seed", "3"],
                        capture_output=True, text=True, env=env)
    assert ok.returncode == 0, ok.stderr
    table = pd.read_csv(tmp_path / "raw" / "Dataset206_FeTA" / "subgroups.tsv", sep="\t")
    # Stratified: one control and one "other" case held out.
    assert sorted(table[table.split == "test"].condition) == ["control", "other"]
    missing_env = subprocess.run([sys.executable, "-m", "nnunet_dro", "convert-feta", str(root),
                                  "--id", "207"], capture_output=True, text=True,
                                 env={"PATH": "/usr/bin:/bin"})
    assert missing_env.returncode == 2
    assert missing_env.stderr.strip().splitlines() == [
        "nnunet_dro convert-feta: error: environment variable nnUNet_raw is not set; export "
        "nnUNet_raw=/path/to/nnUNet_raw (nnU-Net's raw data folder) and run again"]


def test_feta_site_column_and_header_variants(tmp_path, raw):
    root = make_feta_tree(tmp_path / "feta", header="participant_id\tpathology\tGA")
    lines = (root / "participants.tsv").read_text().splitlines()
    lines = [lines[0] + "\tSite"] + [line + ("\tUCSF" if "sub-001" in line else "\tn/a")
                                     for line in lines[1:]]
    (root / "participants.tsv").write_text("\ufeff" + "\r\n".join(lines) + "\r\n")  # BOM, CRLF
    table = pd.read_csv(convert_feta(root, DatasetTarget(208, "FeTA")) / "subgroups.tsv", sep="\t").set_index("case")
    assert table["centre"].to_dict() == {"sub-001": "ucsf", "sub-002": "zurich",
                                         "sub-003": "zurich", "sub-004": "vienna"}


def test_feta_label_with_other_origin_takes_the_image_geometry(tmp_path, raw):
    root = make_feta_tree(tmp_path / "feta")
    label_path = next((root / "sub-003" / "anat").glob("*_dseg.nii.gz"))
    label = sitk.ReadImage(str(label_path))
    label.SetOrigin((0.0, 0.0, 0.0))
    sitk.WriteImage(label, str(label_path))
    notes: list[str] = []
    target = convert_feta(root, DatasetTarget(209, "FeTA", progress=notes.append))
    assert any(n.startswith("note: sub-003_rec-mial_dseg.nii.gz: origin") for n in notes)
    written = sitk.ReadImage(str(target / "labelsTr" / "sub-003.nii.gz"))
    assert written.GetOrigin() == pytest.approx((-10.0, 5.0, 2.5))


@pytest.mark.parametrize("kind", ["image", "label", "plain .nii label"])
def test_feta_cli_truncated_file_is_one_line_exit_2_and_nothing_written(tmp_path, kind):
    """SimpleITK zero-fills a truncated file; the converter reads every file to its end first."""
    root = make_feta_tree(tmp_path / "feta")
    anat = root / "sub-003" / "anat"
    if kind == "plain .nii label":
        gz = next(anat.glob("*_dseg.nii.gz"))
        sitk.WriteImage(sitk.ReadImage(str(gz)), str(anat / gz.name[: -len(".gz")]))
        gz.unlink()
    damaged = truncate(next(anat.glob("*_T2w.nii*" if kind == "image" else "*_dseg.nii*")))
    raw, before = raw_with_other_dataset(tmp_path)
    done = run_converter("convert-feta", root, "--id", "210", raw=raw)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [done.stderr.strip()], done.stderr  # one line, no traceback
    line = done.stderr.strip()
    assert line.startswith(f"nnunet_dro convert-feta: error: {damaged}: truncated file: "), line
    # The header was read (the cut is in the voxel data) and the byte count compared with it.
    assert "bytes its header promises" in line and "the download or copy is incomplete" in line
    assert listing(raw) == before  # no dataset folder, no hidden temporary folder
