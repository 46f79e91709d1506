"""``nnunet_dro convert-brats19``: BraTS 2019 training data -> region-based nnU-Net raw dataset."""
from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "convert-brats19", help="convert BraTS 2019 training data to an nnU-Net raw dataset",
        description="Convert MICCAI_BraTS_2019_Data_Training (HGG/ and LGG/ case folders with "
                    "_t1, _t1ce, _t2, _flair, _seg NIfTI files, name_mapping.csv) to "
                    "$nnUNet_raw/DatasetXXX_NAME with nnU-Net's region-based BraTS labels and "
                    "subgroups.tsv (grade, centre, institution, split).")
    parser.add_argument("input_dir", type=Path, metavar="INPUT_DIR",
                        help="MICCAI_BraTS_2019_Data_Training (or the folder that contains it)")
    parser.add_argument("-d", dest="dataset_id", type=int, required=True, metavar="DATASET_ID",
                        help="nnU-Net dataset ID (1-999) of the output")
    parser.add_argument("-n", "--name", default="BraTS2019",
                        help="dataset name after the ID (default: BraTS2019)")
    parser.add_argument("--test-cases", nargs="+", metavar="CASE",
                        help="case IDs to hold out in imagesTs/labelsTs (comma lists and @file "
                             "accepted)")
    parser.add_argument("--test-fraction", type=float, default=0.0,
                        help="hold out this fraction of each grade x centre stratum instead")
    parser.add_argument("--seed", type=int, default=0, help="seed of --test-fraction")
    parser.add_argument("--validation-dir", type=Path, metavar="DIR",
                        help="also copy the unlabelled official validation set "
                             "(MICCAI_BraTS_2019_Data_Validation) to imagesTs (split 'validation')")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing dataset folder of the same ID and name")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from nnunet_dro.data.brats import convert_brats19
    from nnunet_dro.data.splits import parse_case_list

    target = convert_brats19(args.input_dir, args.dataset_id, args.name,
                             test_cases=parse_case_list(args.test_cases),
                             test_fraction=args.test_fraction, seed=args.seed,
                             validation_dir=args.validation_dir, overwrite=args.overwrite,
                             progress=lambda message: print(message, flush=True))
    print(f"wrote {target} (dataset.json, subgroups.tsv)")
    return 0
