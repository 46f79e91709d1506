"""Options shared by the sub-commands that write an nnU-Net raw dataset (no sub-command here)."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from nnunet_dro.commands.arg_types import dataset_id, fraction, non_negative_int

if TYPE_CHECKING:  # imported when a command runs (below): building the parser reads no image library
    from nnunet_dro.data.raw_dataset import DatasetTarget
    from nnunet_dro.data.splits import HeldOutSplit


def add_dataset_arguments(parser: argparse.ArgumentParser, default_name: str | None,
                          name_default_text: str | None = None, required: bool = True) -> None:
    """``--id ID``, ``-n NAME`` and ``--overwrite``: the dataset the command writes.

    ``-d`` is the *input* dataset in every command (as in nnU-Net); the ID of the dataset a command
    creates is ``--id``. ``default_name=None``: the sub-command chooses the name itself when ``-n`` is
    not given (``name_default_text`` says how). ``required=False``: the command checks ``--id``
    itself (``exclude-cases``, where ``-d`` or ``-i`` give the input).
    """
    parser.add_argument("--id", dest="dataset_id", type=dataset_id, metavar="ID", required=required,
                        help="nnU-Net dataset ID (1-999) of the dataset written")
    parser.add_argument("-n", "--name", default=default_name,
                        help="dataset name after the ID" + (f" (default: {default_name})" if default_name else
                                                            f" (default: {name_default_text or 'chosen by the command'})"))
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing dataset folder of the same ID and name")


def add_input_dataset_argument(parser: argparse._ActionsContainer, help_text: str = "the input dataset") -> None:
    """``-d DATASET``: an nnU-Net dataset of ``$nnUNet_raw`` by ID or name (``201``,
    ``Dataset201_FeTA``), as nnUNetv2_train and nnUNetv2_predict take it."""
    parser.add_argument("-d", dest="dataset", default=None, metavar="DATASET",
                        help=f"{help_text}: nnU-Net dataset ID or name under $nnUNet_raw (e.g. 201 or Dataset201_FeTA)")


def raw_dataset_folder(dataset: str) -> Path:
    """``$nnUNet_raw/DatasetXXX_Name`` for ``-d`` (an ID or a name); UserError if there is none."""
    import os
    import re

    from nnunet_dro.errors import UserError

    raw = os.environ.get("nnUNet_raw")
    if not raw:
        raise UserError(f"-d {dataset}: environment variable nnUNet_raw is not set; export it, or give the folder "
                        f"with -i")
    text = str(dataset).strip()
    if re.fullmatch(r"\d{1,3}", text):
        matches = sorted(Path(raw).glob(f"Dataset{int(text):03d}_*"))
    else:
        matches = [Path(raw) / text] if (Path(raw) / text).is_dir() else []
    matches = [m for m in matches if m.is_dir()]
    if len(matches) != 1:
        found = "no dataset" if not matches else f"{len(matches)} datasets ({', '.join(m.name for m in matches)})"
        raise UserError(f"-d {dataset}: {found} of that ID or name in nnUNet_raw={raw}")
    return matches[0]


def add_test_split_arguments(parser: argparse.ArgumentParser, strata: str) -> None:
    """``--test-cases`` / ``--test-fraction`` / ``--seed``: the held-out imagesTs/labelsTs split."""
    parser.add_argument("--test-cases", nargs="+", metavar="CASE",
                        help="case IDs to hold out in imagesTs/labelsTs (comma lists and @file accepted)")
    parser.add_argument("--test-fraction", type=fraction, default=0.0,
                        help=f"hold out this fraction of each {strata} instead (default 0)")
    parser.add_argument("--seed", type=non_negative_int, default=0, help="seed of --test-fraction")


def dataset_target(args: argparse.Namespace, name: str | None = None) -> DatasetTarget:
    """The :class:`~nnunet_dro.data.raw_dataset.DatasetTarget` of ``--id``, ``-n`` (or ``name``,
    where the command chose it) and ``--overwrite``; progress notes go to stdout."""
    from nnunet_dro.data.raw_dataset import DatasetTarget

    return DatasetTarget(args.dataset_id, name or args.name, overwrite=args.overwrite,
                         progress=lambda message: print(message, flush=True))


def held_out_split(args: argparse.Namespace) -> HeldOutSplit:
    """The :class:`~nnunet_dro.data.splits.HeldOutSplit` of ``--test-cases`` / ``--test-fraction`` / ``--seed``."""
    from nnunet_dro.data.splits import HeldOutSplit, parse_case_list

    return HeldOutSplit(parse_case_list(args.test_cases), args.test_fraction, args.seed)


def input_dir_argument(parser: argparse.ArgumentParser, help_text: str) -> None:
    parser.add_argument("input_dir", type=Path, metavar="INPUT_DIR", help=help_text)
