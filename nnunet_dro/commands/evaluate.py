"""``nnunet_dro evaluate``: stratified robustness evaluation of prediction folders.

Example::

    nnunet_dro evaluate -ref labelsTs -pred ERM=pred_erm DRO=pred_dro -o report \\
        -groups subgroups.tsv --group-by condition gestational_age:19,25,30,35,41 -regions feta
"""
from __future__ import annotations

import argparse
import os
import sys

from nnunet_dro.commands.arg_types import non_negative_int, percentile, positive_int
from nnunet_dro.errors import UserError


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "evaluate",
        help="per-subgroup Dice percentiles and IQR, paired comparisons and plots for prediction folders",
        description="Stratified robustness evaluation: Dice (and HD95, volume similarity) per case and region, "
                    "summarised per subgroup (mean, std, median, IQR, low percentiles), paired comparisons "
                    "between methods, tables (csv, json, md, tex) and box plots in OUT_DIR. Files are matched "
                    "by nnU-Net case identifier (file name without its ending).",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-ref", type=str, required=True, metavar="GT_DIR",
                        help="folder with the reference segmentations")
    parser.add_argument("-pred", type=str, nargs="+", required=True, metavar="NAME=DIR",
                        help="one or more methods as NAME=DIR (a prediction folder, or an nnU-Net summary.json for "
                             "Dice only). The first method is the reference of the paired comparison")
    parser.add_argument("-o", type=str, required=True, metavar="OUT_DIR", help="output folder for the report")
    parser.add_argument("-groups", type=str, default=None, metavar="TABLE",
                        help="subgroup table (.csv or .tsv), one row per case")
    parser.add_argument("--group-by", type=str, nargs="+", default=None, metavar="COL",
                        help="group table columns to stratify by, each on its own (default: all columns but "
                             "numeric ones with more than 10 values). Bin a "
                             "numeric column with COL:EDGES, e.g. gestational_age:19,25,30,35,41 gives [19,25), "
                             "[25,30), ... plus <19 and >=41")
    parser.add_argument("--case-column", type=str, default="case", metavar="COL",
                        help="column of the group table holding the case identifiers. Default: case")
    parser.add_argument("-regions", type=str, default=None, metavar="SPEC",
                        help="feta | brats | brats-nnunet | PATH/dataset.json | \"NAME=l1,l2;NAME=l3\". "
                             "Default: each foreground label found in the references")
    parser.add_argument("--metrics", type=str, nargs="+", default=["dice"], choices=["dice", "hd95", "vs"],
                        help="metrics: dice (%%), hd95 (mm), vs (volume similarity, %%). Default: dice")
    parser.add_argument("--percentiles", type=percentile, nargs="+", default=[25, 10, 5], metavar="Q",
                        help="percentiles to report (numpy linear interpolation). Default: 25 10 5")
    parser.add_argument("--empty", type=str, default="one", choices=["one", "nan"],
                        help="region empty in both reference and prediction: one = Dice 100 (BraTS convention, "
                             "default), nan = left out of the statistics (nnU-Net's convention)")
    parser.add_argument("--missing", type=str, default="error", choices=["error", "worst", "skip"],
                        help="reference case without prediction: error (default) stops with the list, worst scores "
                             "Dice 0 and the worst HD95, skip leaves it out")
    parser.add_argument("-np", type=positive_int, default=None, metavar="N",
                        help="number of processes reading cases. Default: nnUNet_def_n_proc or 8")
    parser.add_argument("--bootstrap", type=non_negative_int, default=0, metavar="N",
                        help="with 2+ methods: N bootstrap resamples of the cases give 95%% confidence intervals "
                             "of the percentile differences in comparison.csv. Default: 0 (off)")
    parser.add_argument("--strict", action="store_true",
                        help="a region whose labels occur in no reference file is an error, not a warning")
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


def run(args: argparse.Namespace) -> int:
    from nnunet_dro.evaluation import api, reports

    result = api.evaluate(args.ref, parse_predictions(args.pred), args.o, groups=args.groups, group_by=args.group_by,
                          case_column=args.case_column, regions=args.regions, metrics=args.metrics,
                          percentiles=args.percentiles, empty=args.empty, missing=args.missing,
                          num_processes=args.np, n_bootstrap=args.bootstrap, strict=args.strict,
                          progress=True)
    print(reports.terminal_table(result))
    print(f"Report written to {os.path.abspath(args.o)}", file=sys.stderr)
    return 0
