"""``nnunet_dro evaluate``: stratified robustness evaluation of prediction folders.

Example::

    nnunet_dro evaluate -ref labelsTs -pred ERM=pred_erm DRO=pred_dro -o report \\
        -groups subgroups.tsv --group-by condition gestational_age:19,25,30,35,41 -regions feta

nnU-Net's own cross-validation (every fold_N/validation prediction; references: labelsTr)::

    nnunet_dro evaluate -pred CV=$nnUNet_results/Dataset201_FeTA/nnUNetTrainer__nnUNetPlans__3d_fullres \\
        -o report_cv -groups $nnUNet_raw/Dataset201_FeTA/subgroups.tsv --group-by condition
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from nnunet_dro.commands.arg_types import non_negative_int, positive_int
from nnunet_dro.commands.evaluation_options import (
    add_group_arguments,
    add_reference_argument,
    add_scoring_arguments,
    evaluation_options,
)
from nnunet_dro.errors import UserError

if TYPE_CHECKING:
    from nnunet_dro.evaluation.options import EvaluationOptions


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "evaluate",
        help="per-subgroup Dice percentiles and IQR, paired comparisons and plots for prediction folders",
        description="Stratified robustness evaluation: Dice (and HD95, volume similarity, NSD, topology errors) "
                    "per case and region, summarised per subgroup (mean, std, median, IQR, worst-tail percentiles "
                    "and CVaR10 by each metric's direction), the gap between the best and worst subgroup, paired "
                    "comparisons between methods, tables (csv, json, md, tex) and figures in OUT_DIR. Files are matched "
                    "by nnU-Net case identifier (file name without its ending).",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_reference_argument(parser, required=False,
                           when_left_out="; may be left out when -pred names a trainer folder: then the labelsTr "
                                         "of its dataset under $nnUNet_raw")
    parser.add_argument("-pred", type=str, nargs="+", required=True, metavar="NAME=DIR",
                        help="one or more methods as NAME=DIR: a prediction folder, an nnU-Net summary.json (Dice "
                             "only), or an nnU-Net trainer folder ($nnUNet_results/DatasetXXX_Name/"
                             "TRAINER__PLANS__CONFIG, with fold_N subfolders) for its cross-validation: every "
                             "fold_N/validation prediction. The first method is the reference of the paired "
                             "comparison. Several training runs of a method: NAME=DIR1,DIR2,... (statistics over "
                             "runs in runs.csv, see --paired-runs)")
    parser.add_argument("--paired-runs", action="store_true",
                        help="with several runs per method (NAME=DIR1,DIR2,...): the k-th run of every method shares "
                             "seed k (data split, initial weights), so differences are taken seed by seed, with a "
                             "t-interval over seeds and a sign count. Every method needs the same number of runs")
    parser.add_argument("-f", "--folds", dest="folds", type=non_negative_int, nargs="+", default=None, metavar="FOLD",
                        help="with a trainer folder in -pred: read only these folds' validation predictions and "
                             "evaluate only their cases. Default: every fold_N folder present, and then every case "
                             "of the references must have a prediction")
    parser.add_argument("-o", type=str, required=True, metavar="OUT_DIR", help="output folder for the report")
    add_group_arguments(parser)
    add_scoring_arguments(parser)
    parser.add_argument("--missing", type=str, default="error", choices=["error", "worst", "skip"],
                        help="reference case without prediction: error (default) stops with the list, worst scores "
                             "Dice 0 and the worst HD95, skip leaves it out")
    parser.add_argument("-np", type=positive_int, default=None, metavar="N",
                        help="number of processes reading cases. Default: nnUNet_def_n_proc or 8")
    parser.add_argument("--bootstrap", type=non_negative_int, default=0, metavar="N",
                        help="N case-resampling bootstrap resamples give 95%% intervals of the mean and CVaR10 "
                             "(summary.csv), of the differences between methods (comparison.csv) and of the gap "
                             "between groups and its change (disparity.csv; cases resampled within groups). "
                             "Default: 0 (off); with several runs per method, the resamples of the intervals over "
                             "runs and over test cases (default there: 2000)")
    parser.add_argument("-i", dest="images", type=str, default=None, metavar="IMAGES",
                        help="folder of the images (nnU-Net naming, CASE_0000.nii.gz) for the gallery of worst cases "
                             "(worst_<metric>.png). Default: the imagesTs or imagesTr beside the references' labelsTs "
                             "or labelsTr, where every case has its image")
    parser.add_argument("--gallery", type=non_negative_int, default=4, metavar="K",
                        help="worst cases per group, region and method in worst_<metric>.png (with images). "
                             "Default: 4; 0: no gallery")
    parser.set_defaults(func=run)


def parse_predictions(values: list[str]) -> dict[str, str]:
    """``["ERM=dir1", "DRO=dir2"]`` -> ``{"ERM": "dir1", "DRO": "dir2"}``; a bare DIR is named after itself."""
    predictions: dict[str, str] = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep:
            name, path = os.path.basename(os.path.normpath(value)), value
        name = name.strip()
        if not name or not path:
            raise UserError(f"-pred {value!r}: expected NAME=DIR")
        if name in predictions:
            raise UserError(f"-pred: method name {name!r} given twice")
        predictions[name] = path
    return predictions


def parse_prediction_runs(values: list[str]) -> dict[str, list[str]]:
    """``["ERM=a,b", "DRO=c,d"]`` -> ``{"ERM": ["a", "b"], "DRO": ["c", "d"]}``; a DIR that exists as
    written stays one folder, commas and all."""
    return {name: [path] if os.path.exists(path) or "," not in path else [p.strip() for p in path.split(",")]
            for name, path in parse_predictions(values).items()}


def _options(args: argparse.Namespace) -> EvaluationOptions:
    """Every evaluation option of the command line, as one EvaluationOptions."""
    return evaluation_options(args, missing=args.missing, num_processes=args.np, n_bootstrap=args.bootstrap,
                              progress=True, folds=args.folds, gallery=args.gallery, images=args.images)


def run(args: argparse.Namespace) -> int:
    from nnunet_dro.evaluation import api, reports

    runs = parse_prediction_runs(args.pred)
    if args.paired_runs or any(len(folders) > 1 for folders in runs.values()):
        return _run_several(args, runs)

    result = api.evaluate(args.ref, parse_predictions(args.pred), args.o, _options(args))
    print(reports.terminal_table(result))
    print(f"Report written to {os.path.abspath(args.o)}", file=sys.stderr)
    return 0


def _run_several(args: argparse.Namespace, runs: dict[str, list[str]]) -> int:
    from nnunet_dro.evaluation import multirun, reports
    from nnunet_dro.evaluation.runs import terminal_lines

    result = multirun.evaluate_runs(args.ref, runs, args.o, _options(args), paired=args.paired_runs)
    metric = result.settings["metrics"][0]
    q = reports.comparison_percentile(result.settings["percentiles"])
    statistics = ["mean"] + ([f"p{q:g}"] if q is not None else [])
    print(reports.policy_line(result))
    for line in terminal_lines(result.runs.table, statistics, metric, reports.METRIC_TITLES[metric],
                               reports._decimals(metric)):
        print(line)
    print(f"Report written to {os.path.abspath(args.o)} (statistics over runs: runs.csv, runs.json, table.md)",
          file=sys.stderr)
    return 0
