"""``nnunet_dro convert-brats19``: BraTS 2019 training data -> region-based nnU-Net raw dataset."""
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
        "convert-brats19", help="convert BraTS 2019 training data to an nnU-Net raw dataset",
        description="Convert MICCAI_BraTS_2019_Data_Training (HGG/ and LGG/ case folders with "
                    "_t1, _t1ce, _t2, _flair, _seg NIfTI files, name_mapping.csv) to "
                    "$nnUNet_raw/DatasetXXX_NAME with nnU-Net's region-based BraTS labels and "
                    "subgroups.tsv (grade, centre, institution, split).")
    input_dir_argument(parser, "MICCAI_BraTS_2019_Data_Training (or the folder that contains it)")
    add_dataset_arguments(parser, "BraTS2019")
    add_test_split_arguments(parser, "grade x centre stratum")
    parser.add_argument("--validation-dir", type=Path, metavar="DIR",
                        help="also copy the unlabelled official validation set "
                             "(MICCAI_BraTS_2019_Data_Validation) to imagesTs (split 'validation')")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from nnunet_dro.data.brats import convert_brats19

    target = convert_brats19(args.input_dir, dataset_target(args), held_out_split(args),
                             validation_dir=args.validation_dir)
    print(f"wrote {target} (dataset.json, subgroups.tsv)")
    return 0
