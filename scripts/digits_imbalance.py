#!/usr/bin/env python
"""The paper's class-imbalance toy (section 4.1) on scikit-learn's 8x8 handwritten digits.

Only a handful of the digit 3 are kept in the training split (the test split keeps every
class); a small CNN is trained with plain SGD (lr 0.01, no momentum, no augmentation) by ERM
(uniform sampling), by DRO with the hardness weighted sampler (KL, beta 10, importance sampling
on/off, warm-up) and by the related methods of docs/methods.md (chi-square DRO sampling,
KL-DRO by multiplicative weights, learning to reweight), over several seeds. Prints the table of
test accuracy on the digit 3 and overall (mean ± std over seeds), the share of loss weight each
method gave the rare digit, and each method's CPU time per training step relative to ERM
(measured in the same run), and writes it with the learning curves to the output folder:

    summary.md, summary.csv   the table
    runs.csv                  final accuracies of every run
    curves.csv                accuracy / loss vs iteration of every run
    learning_curves.png       the curves, mean over seeds

Usage:
    python scripts/digits_imbalance.py                  # the full run (~15 min on 1 CPU core)
    python scripts/digits_imbalance.py --quick -o /tmp/digits    # smoke test, seconds
    python scripts/digits_imbalance.py --methods erm dro-is-beta10 --iterations 12000
    python scripts/digits_imbalance.py --methods erm dro-is-beta0.1 dro-is-beta1 dro-is-beta10 \
        dro-is-beta100 dro-beta10                       # the KL-DRO beta sweep

The paper reports DRO with beta = 10 beating ERM by more than 15 points on the rare class.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from nnunet_dro.errors import UserError  # noqa: E402
from nnunet_dro.lab.experiments import digits  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="ERM vs hardness weighted sampling (KL-DRO) and related robust training methods "
                    "on class-imbalanced 8x8 digits (the paper's MNIST toy, section 4.1).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("-o", "--output", default="results/digits/", help="output folder")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4],
                        help="training seeds (network initialisation and draws; paired across methods)")
    parser.add_argument("--iterations", type=int, default=4000, help="SGD iterations per run")
    parser.add_argument("--eval-every", type=int, default=100, help="iterations between test evaluations")
    parser.add_argument("--batch-size", type=int, default=digits.DEFAULT_BATCH_SIZE,
                        help="examples per SGD step (the paper does not state its batch size)")
    parser.add_argument("--lr", type=float, default=digits.DEFAULT_LR, help="SGD learning rate (no momentum)")
    parser.add_argument("--rare-fraction", type=float, default=digits.DEFAULT_RARE_FRACTION,
                        help="fraction of the training images of the rare digit that are kept")
    parser.add_argument("--rare-class", type=int, default=digits.DEFAULT_RARE_CLASS, choices=range(10),
                        metavar="DIGIT", help="the under-represented digit")
    parser.add_argument("--data-seed", type=int, default=0,
                        help="seed of the train/test split and of the kept rare images")
    parser.add_argument("--methods", nargs="+", default=list(digits.DEFAULT_METHODS),
                        choices=list(digits.METHODS), metavar="METHOD",
                        help=f"rows of the table; known: {', '.join(digits.METHODS)}")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: 2 seeds, 150 iterations (overrides --seeds/--iterations)")
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.iterations, args.eval_every = [0, 1], 150, 50
    for name in ("iterations", "eval_every", "batch_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not 0.0 < args.rare_fraction <= 1.0:
        parser.error(f"--rare-fraction must lie in (0, 1], got {args.rare_fraction}")
    if args.lr <= 0:
        parser.error(f"--lr must be > 0, got {args.lr}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    try:
        split = digits.load_imbalanced_digits(args.rare_class, args.rare_fraction, data_seed=args.data_seed)
    except UserError as error:
        print(f"digits_imbalance: error: {error}", file=sys.stderr)
        return 2
    print(split.describe())
    print(f"kept {split.rare_kept} of {split.rare_available} training images of digit {split.rare_class} "
          f"(fraction {args.rare_fraction:g})")
    print(f"SGD lr {args.lr:g}, no momentum, batch {args.batch_size}, {args.iterations} iterations "
          f"(~{args.iterations * args.batch_size / split.num_train:.0f} epochs), seeds {args.seeds}; "
          f"DRO: init loss log(10), 'dro-is' = importance sampling on, clip {list(digits.DEFAULT_CLIP)}; "
          f"'dro' = off (the paper's toy setting)", flush=True)
    print("methods:")
    print(digits.format_legend(args.methods), end="", flush=True)

    def progress(done: int, total: int, run: digits.RunResult) -> None:
        print(f"[{done}/{total}] {run.method:<20} seed {run.seed}: digit {split.rare_class} "
              f"{100 * run.final_rare_accuracy:5.1f}%  overall {100 * run.final_accuracy:5.1f}%  "
              f"({run.seconds:.1f} s, CPU {run.cpu_seconds:.1f} s)", file=sys.stderr, flush=True)

    start, cpu_start = time.perf_counter(), time.process_time()
    results = digits.run_experiment(split, args.methods, args.seeds, args.iterations, args.batch_size,
                                    args.lr, args.eval_every, progress=progress)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    summary = digits.summarise(results)
    header = (f"Digits with {split.rare_kept}/{split.rare_available} training images of digit "
              f"{split.rare_class}; {args.iterations} SGD iterations (lr {args.lr:g}, batch "
              f"{args.batch_size}); final test accuracy in %, mean ± std over {len(args.seeds)} seeds")
    table = digits.format_markdown(summary, split.rare_class)
    print()
    print(header)
    print(table)
    print(digits.format_legend(args.methods))
    if "erm" in set(summary.method):
        print("time per training step (evaluation excluded), mean over seeds, ratio to ERM in this run:")
        erm = summary.loc[summary.method == "erm"].iloc[0]
        for row in summary.itertuples(index=False):
            print(f"  {row.method:<20} CPU {row.step_cpu_ms:6.2f} ms ({row.step_cpu_ms / erm.step_cpu_ms:5.2f}x)"
                  f"   wall {row.step_ms:6.2f} ms ({row.step_ms / erm.step_ms:5.2f}x)")
    paths = digits.write_outputs(results, summary, args.output, split, header)
    print(f"total {elapsed:.0f} s wall, {cpu:.0f} s CPU for {len(results)} runs; wrote {', '.join(str(p) for p in paths.values())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
