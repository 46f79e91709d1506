"""``nnunet_dro convert-feta``: FeTA BIDS folder -> nnU-Net raw dataset + subgroups.tsv."""
from __future__ import annotations

import argparse
from pathlib import Path

from nnunet_dro.commands.dataset_options import (
    add_dataset_arguments,
    add_test_split_arguments,
    dataset_target,
    held_out_split,
    input_dir_argument,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "convert-feta", help="convert a FeTA release (feta_2.1 of FeTA 2021, feta_2.2 of FeTA 2022) to an nnU-Net "
                             "raw dataset",
        description="Convert a FeTA BIDS folder (participants.tsv, sub-*/anat/*_T2w.nii.gz and "
                    "*_dseg.nii.gz) to $nnUNet_raw/DatasetXXX_NAME with subgroups.tsv "
                    "(condition, gestational_age, centre, reconstruction, split).")
    input_dir_argument(parser, "FeTA folder holding participants.tsv and the sub-* folders")
    add_dataset_arguments(parser, "FeTA")
    parser.add_argument("--three-regions", action="store_true",
                        help="merge the 7 FeTA labels into the paper's 3 tissues: 1 white "
                             "matter, 2 intra-axial CSF, 3 cerebellum (others -> background)")
    parser.add_argument("--conditions", type=Path, metavar="TABLE",
                        help="TSV/CSV with participant_id (or case) and condition columns that "
                             "overrides participants.tsv (e.g. spina bifida vs other)")
    add_test_split_arguments(parser, "condition")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from nnunet_dro.data.feta import convert_feta

    target = convert_feta(args.input_dir, dataset_target(args), held_out_split(args),
                          three_regions=args.three_regions, conditions=args.conditions)
    print(f"wrote {target} (dataset.json, subgroups.tsv)")
    return 0
