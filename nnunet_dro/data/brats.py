"""BraTS 2019 training download -> region-based nnU-Net raw dataset + subgroup table.

Expected input (the unpacked ``MICCAI_BraTS_2019_Data_Training`` folder, or its parent)::

    INPUT_DIR/name_mapping.csv     Grade, BraTS_2017_subject_ID, BraTS_2018_subject_ID,
                                   TCGA_TCIA_subject_ID, BraTS_2019_subject_ID
    INPUT_DIR/HGG/<case>/<case>_t1.nii.gz, _t1ce, _t2, _flair, _seg   (".nii" also accepted)
    INPUT_DIR/LGG/<case>/...

The conversion is nnU-Net's own (``Dataset137_BraTS21``): channels T1, T1ce, T2, Flair; the legacy
labels 1 (necrosis / non-enhancing core), 2 (edema), 4 (enhancing) become 2, 1, 3 by
``copy_BraTS_segmentation_and_convert_labels_to_nnUNet``, and training is region based:
whole tumour (1, 2, 3), tumour core (2, 3), enhancing tumour (3), ``regions_class_order`` (1, 2, 3).

Subgroup columns: ``grade`` (HGG / LGG, from the folder), ``centre`` (TCIA / other: TCIA when
name_mapping.csv gives a TCGA/TCIA subject ID, else when the case ID says ``TCIA``),
``institution`` (the case ID's site token: 2013, CBICA, TCIA01..TCIA13, TMC) and ``split``.

The official validation set (``MICCAI_BraTS_2019_Data_Validation``: case folders with the four
images and no labels) can be added with ``validation_dir``: its images go to imagesTs, its rows
get ``split`` = ``validation`` and an empty ``grade`` (not published for those cases).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from nnunet_dro.data.raw_dataset import (
    TEST,
    TRAIN,
    DatasetTarget,
    check_complete_files,
    check_label_values,
    read_image_info,
    read_label_array,
)
from nnunet_dro.data.splits import HeldOutSplit
from nnunet_dro.errors import UserError

MODALITIES = ("t1", "t1ce", "t2", "flair")           # channel order of nnU-Net's conversion
CHANNEL_NAMES = {0: "T1", 1: "T1ce", 2: "T2", 3: "Flair"}
BRATS_LEGACY_LABELS = (0, 1, 2, 4)
REGION_LABELS = {"background": 0, "whole_tumor": (1, 2, 3), "tumor_core": (2, 3),
                 "enhancing_tumor": (3,)}
REGIONS_CLASS_ORDER = (1, 2, 3)
GRADES = ("HGG", "LGG")
MAPPING_FILENAME = "name_mapping.csv"
VALIDATION = "validation"  # split value of unlabelled validation cases


@dataclass(frozen=True)
class BratsCase:
    """One case folder: its ID, grade and files (no grade and label for validation cases)."""

    case: str
    grade: str | None
    images: tuple[Path, ...]     # in MODALITIES order
    label: Path | None


def find_training_root(input_dir: Path) -> Path:
    """``input_dir`` itself if it holds HGG/ or LGG/, else its only child that does."""
    if not input_dir.is_dir():
        raise UserError(f"{input_dir}: input folder not found")

    def has_grades(folder: Path) -> bool:
        return any((folder / grade).is_dir() for grade in GRADES)

    if has_grades(input_dir):
        return input_dir
    children = [c for c in sorted(input_dir.iterdir()) if c.is_dir() and has_grades(c)]
    if len(children) == 1:
        return children[0]
    raise UserError(f"{input_dir}: no HGG/ or LGG/ folder; point INPUT_DIR at "
                    f"MICCAI_BraTS_2019_Data_Training")


def _case_file(folder: Path, case: str, suffix: str) -> Path:
    for ending in (".nii.gz", ".nii"):
        path = folder / f"{case}_{suffix}{ending}"
        if path.is_file():
            return path
    raise UserError(f"{folder}: missing {suffix} file ({case}_{suffix}.nii.gz)")


def find_cases(root: Path) -> list[BratsCase]:
    """All case folders under ``root/HGG`` and ``root/LGG`` with their four images and label."""
    cases = []
    for grade in GRADES:
        grade_dir = root / grade
        if not grade_dir.is_dir():
            continue
        for folder in sorted(p for p in grade_dir.iterdir() if p.is_dir()):
            images = tuple(_case_file(folder, folder.name, m) for m in MODALITIES)
            label = _case_file(folder, folder.name, "seg")
            cases.append(BratsCase(folder.name, grade, images, label))
    if not cases:
        raise UserError(f"{root}: no case folders in HGG/ or LGG/")
    duplicates = pd.Series([c.case for c in cases]).duplicated()
    if duplicates.any():
        raise UserError(f"{root}: case {cases[int(duplicates.to_numpy().argmax())].case} "
                        f"appears in both HGG/ and LGG/")
    return cases


def find_validation_cases(folder: Path) -> list[BratsCase]:
    """The case folders of the unlabelled validation set (four images each, no label)."""
    if not folder.is_dir():
        raise UserError(f"{folder}: validation folder not found")
    cases = [BratsCase(case.name, None, tuple(_case_file(case, case.name, m) for m in MODALITIES),
                       None)
             for case in sorted(p for p in folder.iterdir() if p.is_dir())]
    if not cases:
        raise UserError(f"{folder}: no case folders")
    return cases


def _validation_mapping(folder: Path) -> tuple[pd.DataFrame | None, Path]:
    """The validation set's mapping table (any .csv with a BraTS_2019_subject_ID column)."""
    for path in sorted(folder.glob("*.csv")):
        header = path.read_text(encoding="utf-8-sig", errors="replace").split("\n", 1)[0]
        if "BraTS_2019_subject_ID" in header:
            return read_name_mapping(path), path
    return None, folder / "name_mapping_validation_data.csv"


def read_name_mapping(path: Path) -> pd.DataFrame | None:
    """name_mapping.csv indexed by BraTS_2019_subject_ID, or None if the file is absent."""
    if not path.is_file():
        return None
    try:
        table = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: cannot parse ({str(e).splitlines()[0]})") from None
    table.columns = [c.strip() for c in table.columns]
    if "BraTS_2019_subject_ID" not in table.columns:
        raise UserError(f"{path}: no BraTS_2019_subject_ID column (columns: {list(table.columns)})")
    if table["BraTS_2019_subject_ID"].duplicated().any():
        raise UserError(f"{path}: duplicate BraTS_2019_subject_ID rows")
    return table.set_index("BraTS_2019_subject_ID")


def institution_from_case_id(case: str) -> str:
    """The site token of a BraTS 2019 case ID.

    >>> institution_from_case_id("BraTS19_TCIA08_242_1"), institution_from_case_id("BraTS19_2013_3_1")
    ('TCIA08', '2013')
    """
    parts = case.split("_")
    return parts[1] if len(parts) >= 3 and parts[0].lower().startswith("brats") else "unknown"


def _subgroup_rows(cases: Sequence[BratsCase], mapping: pd.DataFrame | None,
                   mapping_path: Path) -> pd.DataFrame:
    rows = []
    for case in cases:
        institution = institution_from_case_id(case.case)
        centre = "TCIA" if institution.upper().startswith("TCIA") else "other"
        if mapping is not None and case.case in mapping.index:
            row = mapping.loc[case.case]
            if case.grade and "Grade" in row.index and str(row["Grade"]).strip().upper() != case.grade:
                raise UserError(f"{mapping_path}: {case.case} has grade {row['Grade']} but lies in "
                                f"{case.grade}/")
            # Either source saying TCIA is enough: the mapping also covers 2013-era TCIA cases.
            tcia_id = str(row.get("TCGA_TCIA_subject_ID", "")).strip()
            if tcia_id not in ("", "NA", "nan", "n/a"):
                centre = "TCIA"
        rows.append({"case": case.case, "grade": case.grade, "centre": centre,
                     "institution": institution})
    return pd.DataFrame(rows)


def _convert_label(source: Path, target: Path) -> None:
    """nnU-Net's own label conversion, with its bare RuntimeError turned into a named error."""
    from nnunetv2.dataset_conversion.Dataset137_BraTS21 import copy_BraTS_segmentation_and_convert_labels_to_nnUNet
    try:
        copy_BraTS_segmentation_and_convert_labels_to_nnUNet(str(source), str(target))
    except RuntimeError:
        _, array = read_label_array(source)
        check_label_values(source, array, BRATS_LEGACY_LABELS)  # raises with the values found
        raise


def convert_brats19(input_dir: Path, target: DatasetTarget, split: HeldOutSplit = HeldOutSplit(),
                    validation_dir: Path | None = None) -> Path:
    """Convert BraTS 2019 training data to ``target`` (``$nnUNet_raw/DatasetXXX_<name>``); return the folder.

    Held-out cases (``split``: named cases, or a fraction stratified by grade and centre) go to
    imagesTs with their labels in labelsTs; unlabelled validation cases (``validation_dir``) go
    to imagesTs only.

    Example (shell): ``nnunet_dro convert-brats19 MICCAI_BraTS_2019_Data_Training --id 219``.
    """
    target.check()  # nnUNet_raw set and writable: before any case is read
    progress = target.progress
    root = find_training_root(Path(input_dir))
    cases = find_cases(root)
    mapping_path = root / MAPPING_FILENAME
    if not mapping_path.is_file() and (root.parent / MAPPING_FILENAME).is_file():
        mapping_path = root.parent / MAPPING_FILENAME
    table = _subgroup_rows(cases, read_name_mapping(mapping_path), mapping_path)
    strata = (table["grade"] + "/" + table["centre"]).tolist()
    held_out = split.choose(table["case"].tolist(), strata)
    table["split"] = [TEST if c in held_out else TRAIN for c in table["case"]]
    if validation_dir is not None:
        extra = find_validation_cases(Path(validation_dir))
        clash = sorted({c.case for c in extra} & set(table["case"]))
        if clash:
            raise UserError(f"{validation_dir}: case IDs {clash[:5]} are also training cases")
        mapping, path = _validation_mapping(Path(validation_dir))
        table = pd.concat([table, _subgroup_rows(extra, mapping, path).assign(split=VALIDATION)],
                          ignore_index=True)
        cases = cases + extra

    for case in cases:  # header checks before any copying
        reference = read_image_info(case.images[0])
        for path in case.images[1:] + ((case.label,) if case.label else ()):
            mismatch = reference.same_grid(read_image_info(path))
            if mismatch:
                raise UserError(f"{path}: {mismatch}")
    # Then every byte, still before writing: SimpleITK would zero-fill a truncated file.
    check_complete_files([p for case in cases for p in case.images + ((case.label,) if case.label else ())],
                         progress)
    for case in cases:
        if case.label is not None:
            check_label_values(case.label, read_label_array(case.label)[1], BRATS_LEGACY_LABELS)

    with target.writer(num_channels=4) as writer:
        for number, (case, split) in enumerate(zip(cases, table["split"]), start=1):
            progress(f"[{number}/{len(cases)}] {case.case} ({case.grade or 'grade unknown'}, "
                     f"{split})")
            folder_split = TEST if split == VALIDATION else split
            if case.label is not None:
                _convert_label(case.label, writer.label_path(case.case, folder_split))
            for channel, image in enumerate(case.images):
                writer.copy_image(case.case, channel, image, folder_split)
        writer.finish(channel_names=CHANNEL_NAMES, labels=REGION_LABELS, subgroups=table,
                      regions_class_order=REGIONS_CLASS_ORDER, dataset_name=target.name,
                      description="BraTS 2019 training data converted by nnunet_dro "
                                  "convert-brats19 (nnU-Net region-based labels)",
                      reference="https://www.med.upenn.edu/cbica/brats2019/data.html",
                      license="BraTS 2019 data usage terms (see the BraTS 2019 website)")
    return writer.target


def legacy_to_nnunet(labels: np.ndarray) -> np.ndarray:
    """Legacy BraTS labels (1 necrosis, 2 edema, 4 enhancing) -> nnU-Net's (2, 1, 3), as arrays.

    The inverse of nnunetv2's ``convert_labels_back_to_BraTS``; used by the synthetic BraTS-like
    generator, which draws tumours in the legacy convention.

    >>> legacy_to_nnunet(np.array([0, 1, 2, 4])).tolist()
    [0, 2, 1, 3]
    """
    out = np.zeros_like(labels)
    out[labels == 2] = 1
    out[labels == 1] = 2
    out[labels == 4] = 3
    return out
