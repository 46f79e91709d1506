"""convert-brats19 on tiny fake BraTS 2019 trees with the real layout, written here."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import SimpleITK as sitk

from converter_cli import listing, raw_with_other_dataset, run_converter, truncate
from data_raw_checks import assert_valid_raw_dataset
from nnunet_dro.data.brats import MODALITIES, convert_brats19, institution_from_case_id, legacy_to_nnunet
from nnunet_dro.data.raw_dataset import DatasetTarget
from nnunet_dro.data.splits import HeldOutSplit
from nnunet_dro.errors import UserError

SHAPE = (5, 6, 7)
CASES = {  # case -> grade
    "BraTS19_2013_2_1": "HGG",
    "BraTS19_CBICA_AAB_1": "HGG",
    "BraTS19_TCIA08_242_1": "HGG",
    "BraTS19_TMC_06290_1": "HGG",
    "BraTS19_2013_0_1": "LGG",
    "BraTS19_TCIA10_103_1": "LGG",
}
TCGA_IDS = {"BraTS19_2013_2_1": "TCGA-02-0006", "BraTS19_TCIA08_242_1": "TCGA-08-0520",
            "BraTS19_TCIA10_103_1": "TCGA-DU-5851"}


def _write(array: np.ndarray, path: Path) -> None:
    image = sitk.GetImageFromArray(array)
    image.SetSpacing((1.0, 1.0, 1.0))
    path.parent.mkdir(parents=True, exist_ok=True)
    sitk.WriteImage(image, str(path))


def _legacy_label(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).choice(np.array([0, 1, 2, 4], np.uint8), size=SHAPE)


def make_brats_tree(parent: Path, with_mapping: bool = True) -> Path:
    root = parent / "MICCAI_BraTS_2019_Data_Training"
    rows = []
    for number, (case, grade) in enumerate(CASES.items()):
        folder = root / grade / case
        for channel, modality in enumerate(MODALITIES):
            data = np.random.default_rng([number, channel]).random(SHAPE).astype(np.float32)
            _write(data, folder / f"{case}_{modality}.nii.gz")
        _write(_legacy_label(number), folder / f"{case}_seg.nii.gz")
        rows.append({"Grade": grade, "BraTS_2017_subject_ID": "NA", "BraTS_2018_subject_ID": "NA",
                     "TCGA_TCIA_subject_ID": TCGA_IDS.get(case, "NA"),
                     "BraTS_2019_subject_ID": case})
    if with_mapping:
        pd.DataFrame(rows).to_csv(root / "name_mapping.csv", index=False)
    return root


def test_brats_conversion_is_nnunets_region_layout(tmp_path, raw):
    make_brats_tree(tmp_path)
    # The parent folder works too: the converter finds MICCAI_BraTS_2019_Data_Training inside.
    target = convert_brats19(tmp_path, DatasetTarget(219, "BraTS2019"), HeldOutSplit(["BraTS19_TCIA10_103_1"]))
    dataset = json.loads((target / "dataset.json").read_text())
    assert dataset["channel_names"] == {"0": "T1", "1": "T1ce", "2": "T2", "3": "Flair"}
    assert dataset["labels"] == {"background": 0, "whole_tumor": [1, 2, 3],
                                 "tumor_core": [2, 3], "enhancing_tumor": [3]}
    assert dataset["regions_class_order"] == [1, 2, 3] and dataset["numTraining"] == 5
    for channel, modality in enumerate(MODALITIES):  # channel order t1, t1ce, t2, flair
        source = tmp_path / "MICCAI_BraTS_2019_Data_Training/HGG/BraTS19_TMC_06290_1" / \
            f"BraTS19_TMC_06290_1_{modality}.nii.gz"
        written = target / "imagesTr" / f"BraTS19_TMC_06290_1_{channel:04d}.nii.gz"
        assert written.read_bytes() == source.read_bytes()
    label = sitk.GetArrayFromImage(sitk.ReadImage(str(target / "labelsTs" /
                                                      "BraTS19_TCIA10_103_1.nii.gz")))
    legacy = _legacy_label(5)
    expected = np.select([legacy == 1, legacy == 2, legacy == 4], [2, 1, 3], 0)
    np.testing.assert_array_equal(label, expected)
    table = assert_valid_raw_dataset(target).set_index("case")
    assert table["grade"].to_dict() == CASES
    assert table["centre"].to_dict() == {
        "BraTS19_2013_2_1": "TCIA", "BraTS19_CBICA_AAB_1": "other",
        "BraTS19_TCIA08_242_1": "TCIA", "BraTS19_TMC_06290_1": "other",
        "BraTS19_2013_0_1": "other", "BraTS19_TCIA10_103_1": "TCIA"}
    assert table.loc["BraTS19_CBICA_AAB_1", "institution"] == "CBICA"
    assert table.loc["BraTS19_TCIA10_103_1", "split"] == "test"


def test_brats_centre_from_case_ids_without_mapping(tmp_path, raw):
    root = make_brats_tree(tmp_path, with_mapping=False)
    target = convert_brats19(root, DatasetTarget(220, "BraTS2019"))
    table = pd.read_csv(target / "subgroups.tsv", sep="\t").set_index("case")
    assert table.loc["BraTS19_2013_2_1", "centre"] == "other"  # only the mapping knows it
    assert table.loc["BraTS19_TCIA08_242_1", "centre"] == "TCIA"


def test_legacy_to_nnunet_inverts_nnunets_back_conversion():
    from nnunetv2.dataset_conversion.Dataset137_BraTS21 import convert_labels_back_to_BraTS
    nnunet = np.array([0, 1, 2, 3, 3, 1])
    np.testing.assert_array_equal(legacy_to_nnunet(convert_labels_back_to_BraTS(nnunet)), nnunet)


def _break(kind: str, root: Path) -> str:
    folder = root / "HGG" / "BraTS19_CBICA_AAB_1"
    if kind == "missing modality":
        (folder / "BraTS19_CBICA_AAB_1_t1ce.nii.gz").unlink()
        return "missing t1ce file"
    if kind == "missing seg":
        (folder / "BraTS19_CBICA_AAB_1_seg.nii.gz").unlink()
        return "missing seg file"
    if kind == "shape mismatch between modalities":
        _write(np.zeros((5, 6, 8), np.float32), folder / "BraTS19_CBICA_AAB_1_flair.nii.gz")
        return "BraTS19_CBICA_AAB_1_flair.nii.gz: shape"
    if kind == "label 3":
        label = _legacy_label(1)
        label[0, 0, 0] = 3
        _write(label, folder / "BraTS19_CBICA_AAB_1_seg.nii.gz")
        return "unexpected label values [3]"
    if kind == "grade mismatch":
        mapping = pd.read_csv(root / "name_mapping.csv")
        mapping.loc[mapping.BraTS_2019_subject_ID == "BraTS19_CBICA_AAB_1", "Grade"] = "LGG"
        mapping.to_csv(root / "name_mapping.csv", index=False)
        return "has grade LGG but lies in HGG/"
    if kind == "no grade folders":
        for grade in ("HGG", "LGG"):
            (root / grade).rename(root / f"old_{grade}")
        return "no HGG/ or LGG/ folder"
    if kind == "malformed mapping":
        (root / "name_mapping.csv").write_text("Grade;Subject\nHGG;x\n")
        return "no BraTS_2019_subject_ID column"
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["missing modality", "missing seg",
                                  "shape mismatch between modalities", "label 3",
                                  "grade mismatch", "no grade folders", "malformed mapping"])
def test_brats_bad_input_is_one_clear_error_and_writes_nothing(tmp_path, raw, kind):
    root = make_brats_tree(tmp_path)
    fragment = _break(kind, root)
    with pytest.raises(UserError) as error:
        convert_brats19(root, DatasetTarget(221, "BraTS2019"))
    assert fragment in str(error.value) and "\n" not in str(error.value)
    assert not raw.exists() or not any(raw.iterdir())


def test_brats_stratified_test_fraction_keeps_each_stratum_in_training(tmp_path, raw):
    root = make_brats_tree(tmp_path)
    target = convert_brats19(root, DatasetTarget(222, "BraTS2019"), HeldOutSplit(test_fraction=0.5, seed=1))
    table = pd.read_csv(target / "subgroups.tsv", sep="\t")
    for _, stratum in table.groupby(["grade", "centre"]):
        if len(stratum) >= 2:
            assert set(stratum["split"]) == {"train", "test"}


@pytest.mark.parametrize("case, expected", [
    ("BraTS19_TCIA08_242_1", "TCIA08"), ("BraTS19_2013_3_1", "2013"),
    ("BraTS19_CBICA_ABM_1", "CBICA"), ("BraTS19_TMC_11964_1", "TMC"), ("patient7", "unknown")])
def test_brats_institution_from_case_id(case, expected):
    assert institution_from_case_id(case) == expected


def test_brats_validation_set_goes_to_images_ts_without_labels(tmp_path, raw):
    root = make_brats_tree(tmp_path)
    validation = tmp_path / "MICCAI_BraTS_2019_Data_Validation"
    for number, case in enumerate(["BraTS19_CBICA_AAM_1", "BraTS19_TCIA12_101_1"]):
        for channel, modality in enumerate(MODALITIES):
            data = np.random.default_rng([9, number, channel]).random(SHAPE).astype(np.float32)
            _write(data, validation / case / f"{case}_{modality}.nii.gz")
    (validation / "name_mapping_validation_data.csv").write_text(
        "BraTS_2017_subject_ID,BraTS_2018_subject_ID,TCGA_TCIA_subject_ID,BraTS_2019_subject_ID\n"
        "NA,NA,NA,BraTS19_CBICA_AAM_1\nNA,NA,TCGA-HT-7680,BraTS19_TCIA12_101_1\n")
    target = convert_brats19(root, DatasetTarget(223, "BraTS2019"), HeldOutSplit(["BraTS19_2013_0_1"]),
                             validation_dir=validation)
    dataset = json.loads((target / "dataset.json").read_text())
    assert dataset["numTraining"] == 5 and dataset["numTest"] == 3
    assert len(list((target / "imagesTs").glob("BraTS19_TCIA12_101_1_000?.nii.gz"))) == 4
    assert sorted(p.name for p in (target / "labelsTs").iterdir()) == ["BraTS19_2013_0_1.nii.gz"]
    table = pd.read_csv(target / "subgroups.tsv", sep="\t").set_index("case")
    assert table.loc["BraTS19_TCIA12_101_1", ["centre", "split"]].tolist() == ["TCIA", "validation"]
    assert pd.isna(table.loc["BraTS19_CBICA_AAM_1", "grade"])
    with pytest.raises(UserError, match="also training cases"):
        convert_brats19(root, DatasetTarget(224, "BraTS2019"), validation_dir=root / "HGG")


@pytest.mark.parametrize("kind", ["flair image", "seg label", "plain .nii t1ce image"])
def test_brats_cli_truncated_file_is_one_line_exit_2_and_nothing_written(tmp_path, kind):
    """An interrupted download: images are copied byte for byte and labels read with SimpleITK,
    which zero-fills; the converter reads every file to its end before writing."""
    root = make_brats_tree(tmp_path)
    folder = root / "LGG" / "BraTS19_TCIA10_103_1"
    name = {"flair image": "flair", "seg label": "seg", "plain .nii t1ce image": "t1ce"}[kind]
    path = folder / f"BraTS19_TCIA10_103_1_{name}.nii.gz"
    if kind.startswith("plain"):
        sitk.WriteImage(sitk.ReadImage(str(path)), str(path)[: -len(".gz")])
        path.unlink()
        path = path.with_suffix("")
    truncate(path)
    raw, before = raw_with_other_dataset(tmp_path)
    done = run_converter("convert-brats19", root, "--id", "225", "--test-fraction", "0.3", raw=raw)
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip()
    assert line.splitlines() == [line], done.stderr  # one line, no traceback
    assert line.startswith(f"nnunet_dro convert-brats19: error: {path}: truncated file: "), line
    assert "bytes its header promises" in line and "the download or copy is incomplete" in line
    assert listing(raw) == before
