"""Leave training cases out of an nnU-Net raw dataset: the step after a label audit.

``nnunet_dro audit-labels`` flags training labels that may be wrong; after opening the flagged
cases, a user who decides to train without some of them needs the same dataset minus those cases.
This writes it as a new raw dataset beside the original (nnU-Net's way: a new dataset ID, so that
plans, preprocessed data and results of the two never mix), with every kept file hard-linked
where the file system allows (no second copy of the images; the labels are copied, so that a
label mended later in one dataset does not change the other), and:

- ``imagesTr`` / ``labelsTr`` without the left-out cases (every channel of their images);
- ``dataset.json`` with ``numTraining`` counting what is left (nnU-Net's integrity check compares
  them), and its ``dataset`` list, where it has one, without them;
- ``subgroups.tsv``, where the folder has one, without their rows (the other rows byte for byte);
- ``excluded_cases.tsv``: the left-out cases and why, so the new dataset says what it lacks;
- everything else (``imagesTs``, ``labelsTs``, other files) as it was.

The test cases are never touched: leaving a case out of training must not change what the
comparison is scored on.

>>> import json, pathlib, tempfile
>>> src = pathlib.Path(tempfile.mkdtemp()) / "Dataset201_Toy"
>>> for sub, name in [("imagesTr", "a_0000.nii.gz"), ("imagesTr", "b_0000.nii.gz"),
...                   ("labelsTr", "a.nii.gz"), ("labelsTr", "b.nii.gz")]:
...     (src / sub).mkdir(parents=True, exist_ok=True); _ = (src / sub / name).write_bytes(b"x")
>>> _ = (src / "dataset.json").write_text(json.dumps({"numTraining": 2, "file_ending": ".nii.gz"}))
>>> out = src.parent / "Dataset202_ToyAudited"
>>> out.mkdir()
>>> write_dataset_without(src, out, {"b": "audit: label 3 missing"})
['b']
>>> sorted(p.name for p in (out / "labelsTr").iterdir()), json.loads((out / "dataset.json").read_text())["numTraining"]
(['a.nii.gz'], 1)
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Mapping

import pandas as pd

from nnunet_dro.atomic import link_tree, write_text_atomic
from nnunet_dro.data.subgroups import CASE_COLUMN, SUBGROUPS_FILENAME
from nnunet_dro.errors import UserError

#: written into the new dataset: which training cases it lacks and why
EXCLUDED_FILENAME = "excluded_cases.tsv"


def training_cases(dataset_dir: str | os.PathLike) -> list[str]:
    """The training case identifiers of a raw dataset: its ``labelsTr`` file names without the
    file ending of ``dataset.json``."""
    dataset_dir = Path(dataset_dir)
    return _training_cases(dataset_dir, _dataset_json(dataset_dir).get("file_ending", ".nii.gz"))


def reasons_from_flags(table: pd.DataFrame, fallback: str) -> dict[str, str]:
    """Case -> why it is left out, from a table with a ``case`` column: the ``label`` and ``flag``
    of each of its rows (the columns ``audit-labels`` writes), joined per case with ``"; "``;
    ``fallback`` for a row that has neither.

    >>> reasons_from_flags(pd.DataFrame({"case": ["b", "a", "b"], "label": ["CSF", "WM", "GM"],
    ...                                  "flag": ["missing", "small", "missing"]}), "listed")
    {'b': 'CSF missing; GM missing', 'a': 'WM small'}
    >>> reasons_from_flags(pd.DataFrame({"case": ["a"]}), "listed in cases.tsv")
    {'a': 'listed in cases.tsv'}
    """
    columns = [c for c in ("label", "flag") if c in table.columns]
    reasons: dict[str, list[str]] = {}
    for row in table.to_dict("records"):
        why = " ".join(str(row[c]) for c in columns if not pd.isna(row[c]))
        reasons.setdefault(str(row["case"]), []).append(why or fallback)
    return {case: "; ".join(whys) for case, whys in reasons.items()}


def _training_cases(dataset_dir: Path, ending: str) -> list[str]:
    labels = dataset_dir / "labelsTr"
    if not labels.is_dir():
        raise UserError(f"{dataset_dir}: no labelsTr folder")
    return sorted(p.name[:-len(ending)] for p in labels.iterdir() if p.name.endswith(ending))


def write_dataset_without(source: str | os.PathLike, target: str | os.PathLike,
                          reasons: Mapping[str, str]) -> list[str]:
    """Fill the empty folder ``target`` with the raw dataset ``source`` minus the training cases
    that are the keys of ``reasons`` (case -> why it is left out), as the module docstring says;
    return the left-out cases, sorted.

    A case that is not a training case of ``source`` is a UserError naming it (a typo would
    otherwise leave the wrong label in), and so is leaving every training case out."""
    source, target = Path(source), Path(target)
    meta = _dataset_json(source)
    ending = meta.get("file_ending", ".nii.gz")
    cases = _training_cases(source, ending)
    left_out = sorted(reasons)
    unknown = sorted(set(left_out) - set(cases))
    if unknown:
        raise UserError(f"{source / 'labelsTr'}: no training case {unknown[0]!r}"
                        + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""))
    if len(left_out) == len(cases):
        raise UserError(f"{source}: leaving out all {len(cases)} training cases leaves nothing to train on")
    image_name = re.compile(r"^(?P<case>.+)_\d{4}" + re.escape(ending) + "$")
    dropped = set(left_out)
    for entry in sorted(source.iterdir()):
        if entry.name in ("dataset.json", SUBGROUPS_FILENAME, EXCLUDED_FILENAME):
            continue
        if entry.name in ("imagesTr", "labelsTr") and entry.is_dir():
            (target / entry.name).mkdir()
            for file in sorted(entry.iterdir()):
                match = image_name.match(file.name) if entry.name == "imagesTr" else None
                case = match["case"] if match else file.name[:-len(ending)] if file.name.endswith(ending) else None
                if case in dropped:
                    continue
                if entry.name == "labelsTr":  # copied: a label fixed in place (SimpleITK rewrites the
                    shutil.copy2(file, target / entry.name / file.name)  # inode) must not change the original
                else:
                    link_tree(file, target / entry.name / file.name)
        else:
            link_tree(entry, target / entry.name)
    meta["numTraining"] = len(cases) - len(left_out)
    if isinstance(meta.get("dataset"), dict):
        meta["dataset"] = {key: value for key, value in meta["dataset"].items() if key not in dropped}
    write_text_atomic(target / "dataset.json", json.dumps(meta, indent=4) + "\n")
    if (source / SUBGROUPS_FILENAME).is_file():
        write_text_atomic(target / SUBGROUPS_FILENAME, _subgroup_rows_without(source / SUBGROUPS_FILENAME, dropped))
    table = pd.DataFrame({"case": left_out, "reason": [reasons[case] for case in left_out]})
    write_text_atomic(target / EXCLUDED_FILENAME, table.to_csv(sep="\t", index=False))
    return left_out


def _dataset_json(dataset_dir: Path) -> dict:
    path = dataset_dir / "dataset.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{dataset_dir}: no dataset.json (expected an nnU-Net raw dataset folder)") from None
    except (OSError, ValueError) as error:
        raise UserError(f"{path}: cannot read it ({type(error).__name__}: {error})") from None


def _subgroup_rows_without(path: Path, dropped: set[str]) -> str:
    """The subgroup table's text without the rows of ``dropped``; every other line unchanged."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    if not lines:
        return ""
    header = lines[0].rstrip("\r\n").split("\t")
    if CASE_COLUMN not in header:
        raise UserError(f"{path}: no column {CASE_COLUMN!r} (columns: {', '.join(header)})")
    column = header.index(CASE_COLUMN)
    kept = [line for line in lines[1:] if line.rstrip("\r\n").split("\t")[column] not in dropped]
    return "".join([lines[0], *kept])
