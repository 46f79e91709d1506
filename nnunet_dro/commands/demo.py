"""``nnunet_dro demo``: synthetic cohort -> plan -> train ERM and DRO -> predict -> stratified table."""
from __future__ import annotations

import argparse
import importlib.util

from nnunet_dro.commands.arg_types import non_negative_int, positive_float, positive_int

#: ``--quick`` (``make demo``): about 20 minutes on 2 cores, install excluded (docs/getting-started.md)
QUICK = {"n_train": 40, "n_test": 24, "epochs": 80}


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "demo", help="the whole pipeline on a synthetic cohort, on CPU (about an hour on 2 cores; --quick: "
                     "about 20 minutes)",
        description="Make a synthetic fetal-brain-like cohort with hidden stratification, plan and preprocess "
                    "it, train nnU-Net's ERM trainer and nnUNetTrainerDROAdaptive (scale-free DRO, default setting: "
                    "f = 0.5, no importance weights) with the same CPU budget (a quarter of nnU-Net's "
                    "features per stage, 120 epochs x 25 iterations) from the same initial weights, predict "
                    "the test cases and print the stratified table (ERM vs DRO per condition and region). "
                    "Everything is written to OUT (its own "
                    "nnUNet_raw/preprocessed/results); completed steps are reused when re-run.")
    parser.add_argument("-o", dest="output", default="nnunet_dro_demo", metavar="OUT",
                        help="working and output folder. Default: ./nnunet_dro_demo")
    parser.add_argument("--quick", action="store_true",
                        help=f"the short form (`make demo`): {QUICK['n_train']} training and {QUICK['n_test']} test "
                             f"cases, {QUICK['epochs']} epochs per arm; it shows the workflow and says whether "
                             "nnU-Net's budget sufficed, not the benchmark's result")
    parser.add_argument("--budget-scale", type=positive_float, default=1.0, metavar="K",
                        help="multiply the number of training epochs (120) by K")
    parser.add_argument("--epochs", type=positive_int, default=None,
                        help="epochs per arm (overrides the CPU budget's 120; quick looks only)")
    parser.add_argument("--iterations", type=positive_int, default=None,
                        help="training iterations per epoch (overrides the CPU budget's 25)")
    parser.add_argument("--n-train", type=positive_int, default=None,
                        help="training cases. Default: 177 (the size of the paper's fetal training set)")
    parser.add_argument("--n-test", type=non_negative_int, default=None,
                        help="test cases (a third per group). Default: 60")
    parser.add_argument("--size", type=positive_int, default=32, help="voxels per side. Default: 32")
    parser.add_argument("--seed", type=non_negative_int, default=0, help="cohort seed. Default: 0")
    parser.add_argument("-device", default="cpu", choices=["cpu", "cuda", "mps"], help="Default: cpu")
    parser.add_argument("--overwrite", action="store_true", help="start from scratch, deleting OUT")
    parser.set_defaults(func=run)


def settings(args: argparse.Namespace) -> dict:
    """The run's budget and cohort size: explicit options over ``--quick`` over the full demo.

    >>> from nnunet_dro.cli import build_parser
    >>> s = settings(build_parser().parse_args(["demo", "--quick"]))
    >>> s["budget"].epochs, s["n_train"], s["n_test"]
    (80, 40, 24)
    >>> s = settings(build_parser().parse_args(["demo", "--quick", "--n-test", "6"]))
    >>> s["budget"].epochs, s["n_train"], s["n_test"]
    (80, 40, 6)
    >>> s = settings(build_parser().parse_args(["demo"]))
    >>> s["budget"].epochs, s["n_train"], s["n_test"]
    (None, 177, 60)
    """
    from nnunet_dro.errors import UserError
    from nnunet_dro.lab.arm_runs import Budget
    from nnunet_dro.lab.budget import CPUBudget
    from nnunet_dro.lab.cohort_folder import Cohort

    if args.budget_scale <= 0:
        raise UserError(f"--budget-scale {args.budget_scale}: must be positive")
    default_epochs = QUICK["epochs"] if args.quick else CPUBudget.budget_epochs
    epochs = args.epochs or (None if args.budget_scale == 1.0 and not args.quick else
                             max(1, round(default_epochs * args.budget_scale)))
    return {"budget": Budget(epochs, args.iterations),
            "n_train": args.n_train or (QUICK["n_train"] if args.quick else Cohort.n_train),
            "n_test": args.n_test if args.n_test is not None else (QUICK["n_test"] if args.quick else Cohort.n_test)}


def require_the_lab() -> None:
    """The demo is the lab's benchmark pipeline, which a wheel does not ship (setup.py
    ``LAB_PACKAGES``): say so in one line instead of an ImportError."""
    from nnunet_dro.errors import UserError

    if importlib.util.find_spec("nnunet_dro.lab") is None:
        raise UserError("the demo runs the lab's benchmark pipeline (nnunet_dro.lab), which is installed only "
                        "from a source checkout: clone the repository and run `make demo` there (or "
                        "`pip install -e .` in it)")


def run(args: argparse.Namespace) -> int:
    require_the_lab()
    from nnunet_dro.lab.cohort_folder import Cohort
    from nnunet_dro.lab.demo import run_demo

    chosen = settings(args)
    run_demo(args.output, chosen["budget"], Cohort(chosen["n_train"], chosen["n_test"], args.size, args.seed),
             device=args.device, overwrite=args.overwrite)
    return 0
