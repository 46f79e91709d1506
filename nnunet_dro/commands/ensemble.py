"""``nnunet_dro ensemble``: fold ensembles, ERM+DRO ensembles and their evaluation in one go.

Example (the paper's workflow, after training 5 folds of each trainer)::

    nnunet_dro ensemble -d 990 -i $nnUNet_raw/Dataset990_FeTA/imagesTs -o ens \\
        -tr ERM=nnUNetTrainer DRO=nnUNetTrainerDRO --combine ERM+DRO \\
        -ref $nnUNet_raw/Dataset990_FeTA/labelsTs -groups $nnUNet_raw/Dataset990_FeTA/subgroups.tsv \\
        --group-by condition -regions feta
"""
from __future__ import annotations

import argparse
import os

from nnunet_dro.commands.arg_types import dataset_id_or_name, non_negative_int, positive_int
from nnunet_dro.commands.evaluation_options import (
    add_group_arguments,
    add_reference_argument,
    add_scoring_arguments,
    evaluation_options,
)


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "ensemble", help="predict fold ensembles of trainers, ensemble across trainers, evaluate",
        description="Predict IMAGES with the folds of each trainer (nnUNetv2_predict averages the folds' "
                    "probabilities), optionally average trainers (nnUNetv2_ensemble; probabilities are saved "
                    "for you), and evaluate all members and ensembles with `nnunet_dro evaluate` if -ref is "
                    "given. Uses $nnUNet_results and adds this package's trainers to nnUNet_extTrainer.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-d", dest="dataset_id", type=dataset_id_or_name, required=True, metavar="DATASET",
                        help="the input dataset: nnU-Net dataset ID or name (e.g. 990 or Dataset990_FeTA)")
    parser.add_argument("-i", dest="images", required=True, metavar="IMAGES",
                        help="folder of images to predict (nnU-Net naming, e.g. imagesTs)")
    parser.add_argument("-o", dest="output", required=True, metavar="OUT",
                        help="output folder (predictions/ and evaluation/ inside)")
    parser.add_argument("-tr", dest="trainers", nargs="+", required=True, metavar="NAME=TRAINER",
                        help="trainers to predict with, as NAME=TRAINER (or just TRAINER). The first is the "
                             "reference of the paired comparison")
    parser.add_argument("-c", dest="configuration", default="3d_fullres", help="configuration. Default: 3d_fullres")
    parser.add_argument("-p", dest="plans", default="nnUNetPlans", help="plans identifier. Default: nnUNetPlans")
    parser.add_argument("-f", dest="folds", nargs="+", default=["0", "1", "2", "3", "4"],
                        help="folds to ensemble. Default: 0 1 2 3 4")
    parser.add_argument("--combine", nargs="+", default=[], metavar="A+B",
                        help="cross-trainer ensembles to build, e.g. ERM+DRO")
    parser.add_argument("--per-fold", action="store_true",
                        help="also predict and evaluate every fold on its own")
    parser.add_argument("-chk", dest="checkpoint", default="checkpoint_final.pth",
                        help="checkpoint name. Default: checkpoint_final.pth")
    parser.add_argument("-device", default="cuda", choices=["cuda", "cpu", "mps"],
                        help="device for nnUNetv2_predict. Default: cuda")
    parser.add_argument("--disable_tta", action="store_true",
                        help="no test-time mirroring in nnUNetv2_predict (faster, slightly less accurate)")
    parser.add_argument("-npp", type=non_negative_int, default=None,
                        help="nnUNetv2_predict preprocessing processes (0 with -nps 0: nnU-Net's sequential "
                             "prediction, no worker processes). Default: nnUNet_npp or 3")
    parser.add_argument("-nps", type=non_negative_int, default=None,
                        help="nnUNetv2_predict export processes. Default: nnUNet_nps or 3")
    parser.add_argument("-np", dest="num_processes", type=positive_int, default=None, metavar="N",
                        help="processes for nnUNetv2_ensemble and the evaluation. Default: nnUNet_def_n_proc or 8")
    evaluation = parser.add_argument_group("evaluation (as in `nnunet_dro evaluate`)")
    add_reference_argument(evaluation, required=False)
    add_group_arguments(evaluation)
    add_scoring_arguments(evaluation)
    parser.set_defaults(func=run)


def predict_processes(given: int | None, variable: str) -> int:
    """``-npp``/``-nps`` as ``nnUNetv2_predict`` reads them: the option, else its environment variable
    (``nnUNet_npp``, ``nnUNet_nps``), else 3. A variable that is not an integer >= 0 is refused
    (nnU-Net would fall back to 3 without a word).

    >>> predict_processes(1, "nnUNet_npp"), predict_processes(None, "nnUNet_npp_unset_in_this_example")
    (1, 3)
    """
    from nnunet_dro.errors import UserError

    if given is not None:
        return given
    text = os.environ.get(variable, "").strip()
    if not text:
        return 3
    try:
        return non_negative_int(text)
    except argparse.ArgumentTypeError:
        raise UserError(f"{variable}={text!r}: expected an integer >= 0 (or unset: 3)") from None


def run(args: argparse.Namespace) -> int:
    from nnunet_dro.evaluation.api import default_num_processes
    from nnunet_dro.workflows.ensemble import (
        EnsemblePlan,
        PredictionSettings,
        parse_combinations,
        parse_members,
        run_ensemble,
    )
    from nnunet_dro.workflows.nnunet_commands import nnunet_environment

    members = parse_members(args.trainers)
    combine = parse_combinations(args.combine, members)
    evaluation = evaluation_options(args) if args.ref else None
    settings = PredictionSettings(configuration=args.configuration, plans=args.plans, folds=args.folds,
                                  checkpoint=args.checkpoint, device=args.device, tta=not args.disable_tta,
                                  npp=predict_processes(args.npp, "nnUNet_npp"),
                                  nps=predict_processes(args.nps, "nnUNet_nps"))
    plan = EnsemblePlan(members, settings, combine=combine, per_fold=args.per_fold,
                        num_processes=args.num_processes or default_num_processes())
    folders, result = run_ensemble(nnunet_environment(), args.dataset_id, args.images, args.output, plan,
                                   reference=args.ref or None, evaluation=evaluation)
    for name, folder in folders.items():
        print(f"{name}: {folder}")
    if result is not None:
        from nnunet_dro.evaluation.reports import terminal_table

        print(terminal_table(result))
        print(f"Report written to {result.output_folder}")
    return 0
