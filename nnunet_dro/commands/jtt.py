"""``nnunet_dro jtt``: the case-weight table of Just Train Twice's second training, from a finished
first (ERM) training.

Example (cross-validation of nnU-Net's ERM, then the second training on fold 0)::

    nnunet_dro jtt -pred $nnUNet_results/Dataset201_FeTA/nnUNetTrainer__nnUNetPlans__3d_fullres \\
        -o $nnUNet_preprocessed/Dataset201_FeTA/case_weights.tsv --fraction 0.2 --upweight 5
    nnUNetv2_train 201 3d_fullres 0 -tr nnUNetTrainerCaseWeights
"""
from __future__ import annotations

import argparse
import sys

from nnunet_dro.commands.arg_types import non_negative_int, positive_int


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "jtt", help="Just Train Twice: case weights for a second training from the cases ERM fits worst",
        description="Just Train Twice (Liu et al., ICML 2021, arXiv:2107.09044), label-free like DRO but in two "
                    "trainings: score a finished ERM training per case (its cross-validation: -pred "
                    "TRAINER__PLANS__CONFIG; or a folder of predictions of the training images with -ref), take "
                    "the worst --fraction of the cases (the error set, by --rule), and write case_weights.tsv "
                    "with --upweight for them and 1 for the others, for nnUNetTrainerCaseWeights.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-pred", required=True, metavar="[NAME=]DIR",
                        help="the first training (NAME= optional, as in evaluate -pred): a trainer output folder $nnUNet_results/DatasetXXX_Name/"
                             "TRAINER__PLANS__CONFIG (its fold_N/validation predictions, references from the "
                             "dataset's labelsTr), or a folder of predictions of the training images (then -ref)")
    parser.add_argument("-ref", default=None, metavar="GT_DIR",
                        help="reference segmentations (default with a trainer folder: the dataset's labelsTr)")
    parser.add_argument("-o", dest="output", required=True, metavar="TSV",
                        help="the table to write, e.g. $nnUNet_preprocessed/DatasetXXX_Name/case_weights.tsv "
                             "(where nnUNetTrainerCaseWeights looks)")
    parser.add_argument("--fraction", type=float, default=0.2,
                        help="share of the cases in the error set, strictly between 0 and 1 (rounded up). "
                             "Default: 0.2")
    parser.add_argument("--rule", default="worst-dice", choices=["worst-dice", "mean-dice"],
                        help="rank cases by their lowest region Dice (worst-dice) or their mean Dice. "
                             "Default: worst-dice")
    parser.add_argument("--upweight", type=float, default=5.0,
                        help="how many times as often the error set is drawn (lambda_up). Default: 5")
    parser.add_argument("-regions", default=None, metavar="SPEC",
                        help="regions to score (as nnunet_dro evaluate). Default: the dataset's labels")
    parser.add_argument("-f", "--folds", dest="folds", type=non_negative_int, nargs="+", default=None, metavar="FOLD",
                        help="cross-validation folds to read (default: every fold_N); together they must "
                         "validate every training case, since the second training needs a weight for each")
    parser.add_argument("-np", dest="num_processes", type=positive_int, default=None, metavar="N",
                        help="processes reading cases. Default: nnUNet_def_n_proc or 8")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from nnunet_dro.commands.evaluate import parse_predictions
    from nnunet_dro.workflows.jtt import JttOptions, write_jtt_table

    (name, prediction), = parse_predictions([args.pred]).items()
    options = JttOptions(fraction=args.fraction, rule=args.rule, upweight=args.upweight, regions=args.regions,
                         folds=args.folds, num_processes=args.num_processes, name=name,
                         progress=sys.stderr.isatty())  # bars in a terminal; a log file or a pipe gets none
    write_jtt_table(prediction, args.output, reference=args.ref, options=options)
    return 0
