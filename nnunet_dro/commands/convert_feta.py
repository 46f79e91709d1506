"""``nnunet_dro convert-feta``: FeTA BIDS folder -> nnU-Net raw dataset + subgroups.tsv."""
from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "convert-feta", help="convert a FeTA 2021/2022 download to an nnU-Net raw dataset",
        description="Convert a FeTA BIDS folder (participants.tsv, sub-*/anat/*_T2w.nii.gz and "
                    "*_dseg.nii.gz) to $nnUNet_raw/DatasetXXX_NAME with subgroups.tsv "
                    "(condition, gestational_age, centre, reconstruction, split).")
    parser.add_argument("input_dir", type=Path, metavar="INPUT_DIR",
                        help="FeTA folder holding participants.tsv and the sub-* folders")
    parser.add_argument("-d", dest="dataset_id", type=int, required=True, metavar="DATASET_ID",
                        help="nnU-Net dataset ID (1-999) of the output")
    parser.add_argument("-n", "--name", default="FeTA",
                        help="dataset name after the ID (default: FeTA)")
    parser.add_argument("--three-regions", action="store_true",
                        help="merge the 7 FeTA labels into the paper's 3 tissues: 1 white "
                             "matter, 2 intra-axial CSF, 3 cerebellum (others -> background)")
    parser.add_argument("--conditions", type=Path, metavar="TABLE",
                        help="TSV/CSV with participant_id (or case) and condition columns that "
                             "overrides participants.tsv (e.g. spina bifida vs other)")
    parser.add_argument("--test-cases", nargs="+", metavar="CASE",
                        help="participant IDs to hold out in imagesTs/labelsTs (comma lists "
                             "and @file accepted)")
    parser.add_argument("--test-fraction", type=float, default=0.0,
                        help="hold out this fraction of each condition instead (default 0)")
    parser.add_argument("--seed", type=int, default=0, help="seed of --test-fraction")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing dataset folder of the same ID and name")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from nnunet_dro.data.feta import convert_feta
    from nnunet_dro.data.splits import parse_case_list

    target = convert_feta(args.input_dir, args.dataset_id, args.name,
                          three_regions=args.three_regions,
                          test_cases=parse_case_list(args.test_cases),
                          test_fraction=args.test_fraction, seed=args.seed,
                          conditions=args.conditions, overwrite=args.overwrite,
                          progress=lambda message: print(message, flush=True))
    print(f"wrote {target} (dataset.json, subgroups.tsv)")
    return 0
