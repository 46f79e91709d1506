"""Options shared by the sub-commands that write an nnU-Net raw dataset (no sub-command here)."""
from __future__ import annotations

import argparse
from pathlib import Path

from nnunet_dro.commands.arg_types import dataset_id, fraction, non_negative_int


def add_dataset_arguments(parser: argparse.ArgumentParser, default_name: str | None) -> None:
    """``-d DATASET_ID``, ``-n NAME`` and ``--overwrite``, as nnU-Net names them.

    ``default_name=None``: the sub-command chooses the name itself when ``-n`` is not given.
    """
    parser.add_argument("-d", dest="dataset_id", type=dataset_id, required=True, metavar="DATASET_ID",
                        help="nnU-Net dataset ID (1-999) of the output")
    parser.add_argument("-n", "--name", default=default_name,
                        help="dataset name after the ID" + (f" (default: {default_name})" if default_name else
                                                            " (default: depends on --kind)"))
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing dataset folder of the same ID and name")


def add_test_split_arguments(parser: argparse.ArgumentParser, strata: str) -> None:
    """``--test-cases`` / ``--test-fraction`` / ``--seed``: the held-out imagesTs/labelsTs split."""
    parser.add_argument("--test-cases", nargs="+", metavar="CASE",
                        help="case IDs to hold out in imagesTs/labelsTs (comma lists and @file accepted)")
    parser.add_argument("--test-fraction", type=fraction, default=0.0,
                        help=f"hold out this fraction of each {strata} instead (default 0)")
    parser.add_argument("--seed", type=non_negative_int, default=0, help="seed of --test-fraction")


def conversion_options(args: argparse.Namespace) -> dict:
    """The keyword arguments every converter takes, from the parsed options above."""
    from nnunet_dro.data.splits import parse_case_list

    return dict(test_cases=parse_case_list(args.test_cases), test_fraction=args.test_fraction, seed=args.seed,
                overwrite=args.overwrite, progress=lambda message: print(message, flush=True))


def input_dir_argument(parser: argparse.ArgumentParser, help_text: str) -> None:
    parser.add_argument("input_dir", type=Path, metavar="INPUT_DIR", help=help_text)
