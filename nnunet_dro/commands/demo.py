"""``nnunet_dro demo``: synthetic cohort -> plan -> train ERM and DRO -> predict -> stratified table."""
from __future__ import annotations

import argparse


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "demo", help="the whole pipeline on a small synthetic cohort, on CPU (about 15 minutes)",
        description="Make a synthetic fetal-brain-like cohort with hidden stratification, plan and preprocess "
                    "it, train nnU-Net's ERM trainer and nnUNetTrainerDRO with the same small budget, predict "
                    "the test cases and print the stratified table (ERM vs DRO per condition and region). "
                    "Everything is written to OUT (its own nnUNet_raw/preprocessed/results); completed steps "
                    "are reused when re-run.")
    parser.add_argument("-o", dest="output", default="nnunet_dro_demo", metavar="OUT",
                        help="working and output folder. Default: ./nnunet_dro_demo")
    parser.add_argument("--budget-scale", type=float, default=1.0, metavar="K",
                        help="multiply the number of training epochs by K (default 1: about 15 minutes on 2 "
                             "CPU cores in total; the paper-scale budget is far larger)")
    parser.add_argument("--epochs", type=int, default=None, help="epochs per arm (overrides the default budget)")
    parser.add_argument("--iterations", type=int, default=None, help="training iterations per epoch")
    parser.add_argument("--n-train", type=int, default=40, help="training cases. Default: 40")
    parser.add_argument("--n-test", type=int, default=30, help="test cases. Default: 30")
    parser.add_argument("--size", type=int, default=32, help="voxels per side. Default: 32")
    parser.add_argument("--seed", type=int, default=0, help="cohort seed. Default: 0")
    parser.add_argument("-device", default="cpu", choices=["cpu", "cuda", "mps"], help="Default: cpu")
    parser.add_argument("--overwrite", action="store_true", help="start from scratch, deleting OUT")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from nnunet_dro.workflows.demo import DemoBudget, run_demo

    default = DemoBudget()
    budget = DemoBudget(args.epochs or default.epochs, args.iterations or default.iterations_per_epoch,
                        default.val_iterations_per_epoch).scaled(args.budget_scale)
    run_demo(args.output, budget, n_train=args.n_train, n_test=args.n_test, size=args.size, seed=args.seed,
             device=args.device, overwrite=args.overwrite)
    return 0
