"""``nnunet_dro export``: a zip of a DRO model that stock nnU-Net installs and runs as its own trainer's.

Example (then, anywhere with nnunetv2 only: ``nnUNetv2_install_pretrained_model_from_zip model.zip``
and ``nnUNetv2_predict ... -tr nnUNetTrainer``)::

    nnunet_dro export -d 990 -o model.zip -c 3d_fullres -tr nnUNetTrainerDRO -f 0 1 2 3 4
"""
from __future__ import annotations

import argparse
import sys


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "export",
        help="zip a trained model so that stock nnU-Net (no nnunet_dro) installs and runs it as nnUNetTrainer",
        description="Like nnUNetv2_export_model_to_zip, but the model is filed under a stock nnU-Net trainer "
                    "(--as-trainer, default nnUNetTrainer): the folder is renamed to "
                    "AS_TRAINER__PLANS__CONFIG and the checkpoints name that trainer; network weights, plans, "
                    "dataset.json and fingerprint are unchanged, and our extra checkpoint state ('dro_state') "
                    "is kept (stock nnU-Net ignores it) unless --drop-state. "
                    "nnUNetv2_install_pretrained_model_from_zip installs the zip; nnUNetv2_predict -tr "
                    "AS_TRAINER then runs it without nnunet_dro and without nnUNet_extTrainer. A trainer whose "
                    "network differs from the stock trainer's (e.g. the *_CPUBudget trainers) is refused. "
                    "Reads $nnUNet_results.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-d", dest="dataset", required=True, metavar="DATASET",
                        help="the input dataset: nnU-Net dataset ID or name (e.g. 990 or Dataset990_FeTA)")
    parser.add_argument("-o", dest="output", required=True, metavar="ZIP", help="output file name")
    parser.add_argument("-c", dest="configurations", nargs="+", default=None, metavar="CONFIG",
                        help="configurations to export. Default: every configuration of TRAINER/PLANS found "
                             "in nnUNet_results")
    parser.add_argument("-tr", dest="trainer", required=True, metavar="TRAINER",
                        help="trainer class the model was trained with, e.g. nnUNetTrainerDRO")
    parser.add_argument("-p", dest="plans", default="nnUNetPlans", help="plans identifier. Default: nnUNetPlans")
    parser.add_argument("-f", dest="folds", nargs="+", default=["0", "1", "2", "3", "4"], metavar="FOLD",
                        help="folds to export (integers or 'all'). Default: 0 1 2 3 4")
    parser.add_argument("-chk", dest="checkpoints", nargs="+", default=["checkpoint_final.pth"], metavar="NAME",
                        help="checkpoints to export. Default: checkpoint_final.pth")
    parser.add_argument("--as-trainer", dest="as_trainer", default="nnUNetTrainer", metavar="NAME",
                        help="stock nnU-Net trainer class the exported model is filed under (it must build the "
                             "same network). Default: nnUNetTrainer")
    parser.add_argument("--drop-state", dest="drop_state", action="store_true",
                        help="leave out our extra state: checkpoint keys nnU-Net does not write ('dro_state': "
                             "per-case losses, draw counts, case ids) and dro_hardness.csv / dro_progress.png")
    parser.add_argument("--exp_cv_preds", dest="crossval_predictions", action="store_true",
                        help="as in nnUNetv2_export_model_to_zip: also export the cross-validation predictions "
                             "(validation folders, without .npz/.pkl)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from nnunet_dro.workflows.export import ExportRequest, export_model

    request = ExportRequest(args.dataset, args.output, args.trainer, configurations=args.configurations,
                            plans=args.plans, folds=args.folds, checkpoints=args.checkpoints,
                            as_trainer=args.as_trainer, drop_state=args.drop_state,
                            crossval_predictions=args.crossval_predictions)
    summary = export_model(request)
    kept = sorted({k for keys in summary["kept"].values() for k in keys})
    print(f"Exported {args.trainer} as {args.as_trainer}: {', '.join(summary['target_folders'])} "
          f"({len(summary['entries'])} files" + (f"; extra checkpoint keys kept: {', '.join(kept)}" if kept else "")
          + ")", file=sys.stderr)
    print(f"Install with: nnUNetv2_install_pretrained_model_from_zip {summary['output']}", file=sys.stderr)
    print(summary["output"])
    return 0
