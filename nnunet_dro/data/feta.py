"""FeTA (Fetal Tissue Annotation) BIDS download -> nnU-Net raw dataset + subgroup table.

Expected input (FeTA 2021 "feta_2.1" and FeTA 2022 "feta_2.2" releases)::

    INPUT_DIR/participants.tsv                 participant_id, Pathology, Gestational age
    INPUT_DIR/sub-001/anat/sub-001_rec-mial_T2w.nii.gz
    INPUT_DIR/sub-001/anat/sub-001_rec-mial_dseg.nii.gz
    ...

Labels (FeTA protocol, kept as they are): 1 external CSF, 2 grey matter, 3 white matter,
4 ventricles (intra-axial CSF), 5 cerebellum, 6 deep grey matter, 7 brainstem. With
``three_regions=True`` they are merged to the paper's three tissues: 1 white matter,
2 intra-axial CSF, 3 cerebellum, everything else background.

Subgroup columns: ``condition`` (control / spina_bifida / other), ``gestational_age`` (weeks),
``centre`` (from a site column of participants.tsv if there is one, else from the reconstruction
method: mial and irtk are the Zurich releases, nmic the Vienna cases of FeTA 2022),
``reconstruction`` (the BIDS ``rec-`` entity) and ``split``.
"""
from __future__ import annotations

import re
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
    label_image_like,
    read_image_info,
    read_label_array,
)
from nnunet_dro.data.splits import HeldOutSplit
from nnunet_dro.data.subgroups import read_subgroups
from nnunet_dro.errors import UserError

FETA_LABELS = {"background": 0, "external_csf": 1, "grey_matter": 2, "white_matter": 3,
               "ventricles": 4, "cerebellum": 5, "deep_grey_matter": 6, "brainstem": 7}
THREE_REGION_LABELS = {"background": 0, "white_matter": 1, "intra_axial_csf": 2, "cerebellum": 3}
# FeTA label -> three-region label (unlisted labels become background).
THREE_REGION_MAP = {3: 1, 4: 2, 5: 3}

CONDITIONS = ("control", "spina_bifida", "other")
# Reconstruction method (BIDS rec- entity) -> acquisition centre, for the public FeTA releases.
CENTRE_BY_RECONSTRUCTION = {"mial": "zurich", "irtk": "zurich", "nmic": "vienna"}

_CONTROL_WORDS = {"neurotypical", "normal", "control", "controls", "healthy", "typical", "nt",
                  "non pathological", "nonpathological"}
_SPINA_BIFIDA_WORDS = {"sb", "sba", "mmc", "osd", "myelomeningocele", "open spinal dysraphism"}
# Accepted spellings of the participants.tsv columns (compared lower-case, '_' as ' ').
_PATHOLOGY_COLUMNS = ("pathology", "condition", "diagnosis", "group")
_AGE_COLUMNS = ("gestational age", "ga", "gestational age (weeks)", "ga (weeks)", "age")
_SITE_COLUMNS = ("site", "centre", "center", "institution", "source")


@dataclass(frozen=True)
class FetaSubject:
    """One subject folder of the BIDS tree."""

    participant_id: str
    image: Path
    label: Path
    reconstruction: str


def normalise_condition(value: object) -> str:
    """Map a FeTA ``Pathology`` value (or a finer diagnosis) to control / spina_bifida / other.

    >>> [normalise_condition(v) for v in ["Neurotypical", "Pathological", "Spina bifida", "SB"]]
    ['control', 'other', 'spina_bifida', 'spina_bifida']
    """
    text = " ".join(str(value).lower().replace("-", " ").replace("_", " ").split()) \
        if value is not None else ""
    if text in ("", "nan", "n/a", "na"):
        raise ValueError("empty condition")
    if text in _CONTROL_WORDS:
        return "control"
    if text in _SPINA_BIFIDA_WORDS or "spina" in text or "bifida" in text:
        return "spina_bifida"
    return "other"


def parse_gestational_age(value: object) -> float:
    """Gestational age in weeks from ``26.4``, ``26``, ``26+3`` or ``26w3d`` (weeks + days).

    >>> parse_gestational_age("26+3"), parse_gestational_age(" 31.2 ")
    (26.43, 31.2)
    """
    text = str(value).strip().lower()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(?:w|wk|wks|weeks?)?\s*"
                         r"(?:\+\s*(\d+)\s*(?:d|days?)?|(\d+)\s*(?:d|days?))?", text)
    if not match:
        raise ValueError(f"cannot read gestational age {value!r}")
    days = match.group(2) or match.group(3)
    weeks = float(match.group(1)) + (int(days) / 7.0 if days else 0.0)
    if not 10.0 <= weeks <= 45.0:
        raise ValueError(f"gestational age {weeks:g} weeks is outside 10..45")
    return round(weeks, 2)


def _normalise_participant_id(value: object) -> str:
    text = str(value).strip()
    return text if text.startswith("sub-") else f"sub-{text}"


def _find_column(table: pd.DataFrame, candidates: Sequence[str]) -> str | None:
    by_key = {str(c).strip().lower().replace("_", " "): c for c in table.columns}
    for candidate in candidates:
        if candidate in by_key:
            return by_key[candidate]
    return None


def read_participants(path: Path) -> pd.DataFrame:
    """participants.tsv -> DataFrame indexed by participant_id with condition, GA and site.

    Columns ``condition`` and ``gestational_age`` are normalised; ``site`` is the raw site value
    or missing. UserError naming the file on a missing column or an unreadable value.
    """
    if not path.is_file():
        raise UserError(f"{path}: participants.tsv not found (expected beside the sub-* folders)")
    try:
        table = pd.read_csv(path, sep="\t", dtype=str, keep_default_na=False,
                            encoding="utf-8-sig")
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: cannot parse ({str(e).splitlines()[0]})") from None
    id_column = _find_column(table, ("participant id", "participant", "subject", "subject id"))
    pathology_column = _find_column(table, _PATHOLOGY_COLUMNS)
    age_column = _find_column(table, _AGE_COLUMNS)
    for what, column in (("participant_id", id_column), ("Pathology", pathology_column),
                         ("Gestational age", age_column)):
        if column is None:
            raise UserError(f"{path}: no {what} column (columns: {list(table.columns)})")
    site_column = _find_column(table, _SITE_COLUMNS)
    rows = {}
    for line_number, row in enumerate(table.to_dict("records"), start=2):
        participant = _normalise_participant_id(row[id_column])
        try:
            condition = normalise_condition(row[pathology_column])
            age = parse_gestational_age(row[age_column])
        except ValueError as e:
            raise UserError(f"{path}: line {line_number} ({participant}): {e}") from None
        if participant in rows:
            raise UserError(f"{path}: duplicate row for {participant}")
        site = str(row[site_column]).strip().lower() if site_column else ""
        rows[participant] = {"condition": condition, "gestational_age": age,
                             "site": site if site not in ("", "n/a", "na") else None}
    return pd.DataFrame.from_dict(rows, orient="index")


def read_condition_overrides(path: Path) -> dict[str, str]:
    """A table with ``participant_id`` (or ``case``) and ``condition`` columns, e.g. diagnoses
    that tell spina bifida apart from other pathologies (the public table only says
    "Pathological")."""
    table = read_subgroups(path, case_column=_override_id_column(path))
    if "condition" not in table.columns:
        raise UserError(f"{path}: no 'condition' column (columns: {list(table.columns)})")
    overrides = {}
    for case, value in zip(table["case"], table["condition"]):
        try:
            overrides[_normalise_participant_id(case)] = normalise_condition(value)
        except ValueError:
            raise UserError(f"{path}: empty condition for {case}") from None
    return overrides


def _override_id_column(path: Path) -> str:
    if not path.is_file():
        raise UserError(f"{path}: condition table not found")
    header = path.read_text(encoding="utf-8").splitlines()[0] if path.stat().st_size else ""
    return "participant_id" if "participant_id" in header else "case"


def find_subjects(input_dir: Path) -> list[FetaSubject]:
    """Every ``sub-*/anat`` folder with exactly one ``*_T2w`` and one ``*_dseg`` NIfTI file."""
    if not input_dir.is_dir():
        raise UserError(f"{input_dir}: input folder not found")
    subjects = []
    for folder in sorted(p for p in input_dir.glob("sub-*") if p.is_dir()):
        anat = folder / "anat"
        images = sorted(anat.glob(f"{folder.name}_*T2w.nii*"))
        labels = sorted(anat.glob(f"{folder.name}_*dseg.nii*"))
        for kind, found in (("T2w image", images), ("dseg label map", labels)):
            if not found:
                raise UserError(f"{anat}: no {kind} ({folder.name}_rec-*_"
                                f"{'T2w' if kind.startswith('T2w') else 'dseg'}.nii.gz)")
            if len(found) > 1:
                raise UserError(f"{anat}: several {kind}s {[p.name for p in found]}; keep one")
        match = re.search(r"_rec-([A-Za-z0-9]+)", images[0].name)
        subjects.append(FetaSubject(folder.name, images[0], labels[0],
                                    match.group(1).lower() if match else "unknown"))
    if not subjects:
        raise UserError(f"{input_dir}: no sub-*/anat folders; point INPUT_DIR at the FeTA folder "
                        f"that holds participants.tsv")
    return subjects


def _subgroup_rows(subjects: Sequence[FetaSubject], participants: pd.DataFrame,
                   overrides: dict[str, str], tsv: Path) -> pd.DataFrame:
    rows = []
    for subject in subjects:
        if subject.participant_id not in participants.index:
            raise UserError(f"{tsv}: no row for {subject.participant_id}")
        info = participants.loc[subject.participant_id]
        site = info["site"]
        centre = site if isinstance(site, str) and site else \
            CENTRE_BY_RECONSTRUCTION.get(subject.reconstruction, "unknown")
        rows.append({"case": subject.participant_id,
                     "condition": overrides.get(subject.participant_id, info["condition"]),
                     "gestational_age": float(info["gestational_age"]), "centre": centre,
                     "reconstruction": subject.reconstruction})
    return pd.DataFrame(rows)


def convert_feta(input_dir: Path, target: DatasetTarget, split: HeldOutSplit = HeldOutSplit(),
                 three_regions: bool = False, conditions: Path | None = None) -> Path:
    """Convert a FeTA BIDS folder to ``target`` (``$nnUNet_raw/DatasetXXX_<name>``); return that folder.

    ``split``: the cases held out in imagesTs/labelsTs (a fraction is stratified by condition);
    ``three_regions``: the paper's 3 tissues instead of FeTA's 7 labels; ``conditions``: a table
    whose conditions override participants.tsv.

    Everything is validated before anything is written: participants.tsv rows, files, shapes
    and geometry, every file read to its end (a truncated download is an error, not zero-filled
    voxels) and label values. Any problem is a one-line UserError naming the file, and the
    dataset folder only appears when every case was written.

    Example (shell): ``nnunet_dro convert-feta feta_2.1 --id 201 --three-regions``.
    """
    target.check()  # nnUNet_raw set and writable: before any case is read
    input_dir, progress = Path(input_dir), target.progress
    subjects = find_subjects(input_dir)
    participants = read_participants(input_dir / "participants.tsv")
    overrides = read_condition_overrides(Path(conditions)) if conditions else {}
    table = _subgroup_rows(subjects, participants, overrides, input_dir / "participants.tsv")
    held_out = split.choose(table["case"].tolist(), table["condition"].tolist())
    table["split"] = [TEST if c in held_out else TRAIN for c in table["case"]]

    # Header checks first: a bad file fails the run in seconds, not after an hour of copying.
    grids = {}
    for subject in subjects:
        image_info, label_info = read_image_info(subject.image), read_image_info(subject.label)
        if image_info.components != 1:
            raise UserError(f"{subject.image}: expected one channel, found {image_info.components}")
        # Like nnU-Net's integrity check: shape and spacing must agree; a different origin or
        # direction is only noted, as the label is rewritten with the image's geometry anyway.
        mismatch = image_info.same_grid(label_info, aspects=("spacing",))
        if mismatch:
            raise UserError(f"{subject.label}: {mismatch}")
        placement = image_info.same_grid(label_info, aspects=("origin", "direction"))
        if placement:
            progress(f"note: {subject.label.name}: {placement}; the label takes the image's "
                     f"geometry")
        grids[subject.participant_id] = image_info
    # Then every byte, still before writing: SimpleITK would zero-fill a truncated file.
    check_complete_files([p for subject in subjects for p in (subject.image, subject.label)], progress)
    for subject in subjects:
        check_label_values(subject.label, read_label_array(subject.label)[1], FETA_LABELS.values())

    labels = THREE_REGION_LABELS if three_regions else FETA_LABELS
    with target.writer(num_channels=1) as writer:
        for number, (subject, split) in enumerate(zip(subjects, table["split"]), start=1):
            progress(f"[{number}/{len(subjects)}] {subject.participant_id} ({split})")
            label_image, array = read_label_array(subject.label)
            check_label_values(subject.label, array, FETA_LABELS.values())
            if three_regions:
                lookup = np.zeros(max(FETA_LABELS.values()) + 1, dtype=np.uint8)
                for feta_value, region_value in THREE_REGION_MAP.items():
                    lookup[feta_value] = region_value
                array = lookup[array]
            info = grids[subject.participant_id]
            label = label_image_like(array, label_image)
            # Same grid within tolerance was checked; copy the image's exact geometry so that
            # nnU-Net's integrity check sees identical headers.
            label.SetSpacing(info.spacing)
            label.SetOrigin(info.origin)
            label.SetDirection(info.direction)
            writer.copy_image(subject.participant_id, 0, subject.image, split)
            writer.write_label(subject.participant_id, label, split)
        writer.finish(channel_names={0: "T2"}, labels=labels, subgroups=table,
                      dataset_name=target.name,
                      description="FeTA fetal brain T2w MRI converted by nnunet_dro convert-feta"
                                  + (" (three regions)" if three_regions else ""),
                      reference="https://feta.grand-challenge.org",
                      license="FeTA data use agreement (see the FeTA website)")
    return writer.target
