"""``nnunet_dro make-synthetic``: a seeded synthetic cohort with hidden stratification."""
from __future__ import annotations

import argparse
import time

from nnunet_dro.commands.arg_types import non_negative_int, positive_int
from nnunet_dro.commands.dataset_options import add_dataset_arguments, dataset_target

KINDS = ("fetal", "brats")
DEFAULT_NAMES = {"fetal": "SyntheticFetal", "brats": "SyntheticBraTS"}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "make-synthetic", help="write a synthetic stratified cohort as an nnU-Net raw dataset",
        description="Generate a small, seeded cohort (train + held-out test with labelsTs) and "
                    "its subgroups.tsv under $nnUNet_raw/DatasetXXX_NAME. fetal: T2-like fetal "
                    "brains with FeTA labels, conditions control / spina_bifida / other "
                    "(minorities rare in train, a third each in test). brats: 4-channel "
                    "BraTS-like tumours, sites site_A / site_B / site_C (site_C rare in train).")
    parser.add_argument("--kind", choices=KINDS, default="fetal",
                        help="which cohort (default: fetal)")
    add_dataset_arguments(parser, None, name_default_text="SyntheticFetal or SyntheticBraTS, by --kind")
    parser.add_argument("--n-train", type=positive_int, default=40, help="training cases (default 40)")
    parser.add_argument("--n-test", type=non_negative_int, default=30, help="test cases (default 30)")
    parser.add_argument("--size", type=positive_int, default=32,
                        help="voxels per side of each cubic volume (default 32)")
    parser.add_argument("--seed", type=non_negative_int, default=0, help="random seed (default 0)")
    parser.add_argument("--train-mix", metavar="GROUP=FRACTION,...",
                        help="group shares in training, e.g. control=0.8,spina_bifida=0.12,"
                             "other=0.08 (fetal default) or site_A=0.55,site_B=0.4,site_C=0.05 "
                             "(brats default); normalised to sum to 1")
    parser.add_argument("--test-mix", metavar="GROUP=FRACTION,...",
                        help="group shares in test (default: equal shares)")
    parser.add_argument("--site", choices=("site_A", "site_B", "site_C"), default=None,
                        help="fetal only: every case acquired at this site instead of site_A or site_B "
                             "drawn per case; site_C is a new centre no default cohort has (thick slices, "
                             "more noise and bias, flatter grey/white contrast). The same --seed keeps "
                             "each case's anatomy and labels. Default: drawn per case")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from nnunet_dro.data import synthetic_brats, synthetic_fetal
    from nnunet_dro.data.synthetic_common import CohortSpec, parse_fractions
    from nnunet_dro.errors import UserError

    if args.site is not None and args.kind != "fetal":
        raise UserError(f"--site {args.site}: only --kind fetal renders every case at one site "
                        "(brats draws its sites with --train-mix / --test-mix)")
    groups = synthetic_fetal.CONDITIONS if args.kind == "fetal" else synthetic_brats.SITES
    # no --train-mix / --test-mix: None, the kind's default shares
    cohort = CohortSpec(args.n_train, args.n_test, args.size, args.seed,
                        train_fractions=parse_fractions(args.train_mix, groups) if args.train_mix else None,
                        test_fractions=parse_fractions(args.test_mix, groups) if args.test_mix else None)
    target = dataset_target(args, args.name or DEFAULT_NAMES[args.kind])
    started = time.perf_counter()
    if args.kind == "fetal":
        folder = synthetic_fetal.make_fetal_dataset(target, cohort, site=args.site)
    else:
        folder = synthetic_brats.make_brats_dataset(target, cohort)
    print(f"wrote {folder} ({args.n_train} train, {args.n_test} test, {args.size}^3, "
          f"seed {args.seed}{', ' + args.site if args.site else ''}) in {time.perf_counter() - started:.1f} s")
    return 0
