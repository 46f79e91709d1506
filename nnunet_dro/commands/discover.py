"""``nnunet_dro discover``: candidate hard subgroups that no table names, from per-case errors.

Examples::

    nnunet_dro discover -pred $nnUNet_results/Dataset201_FeTA/nnUNetTrainerDROAdaptive__nnUNetPlans__3d_fullres \\
        -i $nnUNet_raw/Dataset201_FeTA/imagesTr -o discovery/
    nnunet_dro discover -pred pred_test -ref labelsTs -i imagesTs -regions feta -o discovery/
    nnunet_dro evaluate -ref labelsTs -pred ERM=pred_test -groups discovery/subgroups.tsv \\
        --group-by discovered_group -o report/
"""
from __future__ import annotations

import argparse
import os
import sys

from nnunet_dro.commands.arg_types import count_or_share, non_negative_int, positive_int


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "discover", help="find candidate hard subgroups nobody labelled, from per-case errors and features",
        description="Per case: Dice and HD95 per region and their ranks, DRO hardness (fold_N/dro_hardness.csv "
                    "of a trainer folder), reference and predicted volumes, image intensity and contrast in and "
                    "around each region (with -i). The cases are clustered by a diagonal Gaussian mixture with the "
                    "error features counted --error-weight times, components merged where their errors do not "
                    "differ; the number of groups is the lowest BIC among "
                    "those whose smallest group has at least --min-size cases. OUT_DIR gets report.md (each group "
                    "in words, its Dice mean/p10/CVaR10 against the rest with case-resampling bootstrap "
                    "intervals, 'suspect labels' where the label audit flags most of its cases), groups.json, "
                    "features.tsv and subgroups.tsv (column discovered_group) for evaluate -groups and the group "
                    "trainers.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-pred", required=True, metavar="[NAME=]DIR",
                        help="(NAME= optional, as in evaluate: the name messages give it; default the folder's "
                             "name) a prediction folder (with -ref), or an nnU-Net trainer folder (TRAINER__PLANS__CONFIG "
                             "with fold_N subfolders): its fold_N/validation cross-validation predictions and "
                             "fold_N/dro_hardness.csv where present")
    parser.add_argument("-ref", default=None, metavar="GT_DIR",
                        help="folder with the reference segmentations; may be left out with a trainer folder: "
                             "then the labelsTr of its dataset under $nnUNet_raw")
    parser.add_argument("-i", dest="images", default=None, metavar="IMAGES_DIR",
                        help="folder of the images (imagesTr / imagesTs, first channel CASE_0000) for intensity "
                             "and contrast features. Default: none")
    parser.add_argument("-o", required=True, metavar="OUT_DIR",
                        help="output folder (new, empty or a previous discovery's; written as a whole)")
    parser.add_argument("-regions", default=None, metavar="SPEC",
                        help="as for evaluate: feta | brats | brats-nnunet | PATH/dataset.json | "
                             "\"NAME=l1,l2;NAME=l3\". Default: the dataset.json beside the references")
    parser.add_argument("-f", "--folds", dest="folds", type=non_negative_int, nargs="+", default=None, metavar="FOLD",
                        help="with a trainer folder: only these folds' validation predictions")
    parser.add_argument("--min-size", type=count_or_share, default=10, metavar="N|P%",
                        help="smallest group worth reporting: a count of cases (10) or a share of them (5%% or "
                             "0.05, rounded up, at least 2 cases). A better-fitting split refused by it is named "
                             "in one line with its groups' sizes. Default: 10")
    parser.add_argument("--missing", default="error", choices=["error", "worst", "skip"],
                        help="a reference case without prediction, as in evaluate: error, worst (Dice 0 and the "
                             "worst HD95: such cases form a group of their own) or skip (left out). Default: error")
    parser.add_argument("--max-groups", type=positive_int, default=8, metavar="K",
                        help="most groups tried. Default: 8")
    parser.add_argument("--error-weight", type=positive_int, default=8, metavar="W",
                        help="how many times the error features (Dice, HD95, their ranks, hardness) count in the "
                             "mixture's likelihood. Default: 8")
    parser.add_argument("--no-hd95", action="store_true", help="leave HD95 out (faster on large images)")
    parser.add_argument("--bootstrap", type=non_negative_int, default=1000, metavar="N",
                        help="case resamples for the intervals of group - rest. Default: 1000")
    parser.add_argument("--seed", type=non_negative_int, default=0, help="random seed of the mixture and the "
                                                                          "bootstrap. Default: 0")
    parser.add_argument("-np", type=positive_int, default=None, metavar="N",
                        help="processes reading cases. Default: nnUNet_def_n_proc or 8")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from nnunet_dro.commands.evaluate import parse_predictions
    from nnunet_dro.discovery.api import DiscoveryOptions, discover

    (name, prediction), = parse_predictions([args.pred]).items()
    options = DiscoveryOptions(name=name, images=args.images, regions=args.regions, hd95=not args.no_hd95,
                               min_size=args.min_size, max_groups=args.max_groups, error_weight=args.error_weight,
                               n_bootstrap=args.bootstrap, seed=args.seed, num_processes=args.np, folds=args.folds,
                               missing=args.missing,
                               progress=sys.stderr.isatty())  # bars in a terminal; a log file or a pipe gets none
    summary = discover(prediction, args.ref, args.o, options)
    for group in summary["groups"]:
        words = "; ".join(f["text"] for f in group["features"]) or "no distinguishing feature"
        flag = " [suspect labels]" if group["suspect_labels"] else ""
        print(f"{group['name']}\t{group['size']} cases{flag}\t{words}")
    print(f"{summary['k']} group(s) among {summary['n_cases']} cases; report written to {os.path.abspath(args.o)}",
          file=sys.stderr)
    return 0
