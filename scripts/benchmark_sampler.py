#!/usr/bin/env python
"""Cost of one draw (+ update) of the hardness weighted sampler vs the paper's method.

The paper's Table 4 setting: batch 2, beta 100, n = 1e2 ... 1e7 volumes. Its method draws with
``numpy.random.choice(n, 2, p=softmax(beta * L))``, O(n) per iteration. Ours draws from a sum
tree and writes the two fresh losses back, O(log n). Both run here, in one process, side by side:

    python scripts/benchmark_sampler.py [--max-exp 7] [--batch 2] [--beta 100]

Timing: the fastest of several blocks of calls, for both methods alike (robust to other load on
the machine). Columns: seconds per draw for the baseline (choice alone, given p; and softmax + choice, which is
what an iteration really costs since L changes every step), seconds per draw + update for ours,
the ratio baseline(choice alone) / ours, and bytes of state.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from nnunet_dro.sampling import HardnessWeightedSampler, kl_dro_probabilities


def seconds_per_call(fn, min_seconds: float, min_blocks: int = 5) -> float:
    """Seconds per call of ``fn``: blocks of calls long enough for the timer, the fastest block.

    The minimum (not the mean) estimates the cost without the machine's other load; both
    methods are measured the same way in the same process.
    """
    fn()  # warm-up
    calls = 1
    while True:  # calls per block: at least ~2 ms per block
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        if time.perf_counter() - t0 >= 2e-3:
            break
        calls *= 2
    best, spent, blocks = float("inf"), 0.0, 0
    while spent < min_seconds or blocks < min_blocks:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        dt = time.perf_counter() - t0
        best, spent, blocks = min(best, dt / calls), spent + dt, blocks + 1
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-exp", type=int, default=7, help="largest n is 10**max_exp")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--beta", type=float, default=100.0)
    parser.add_argument("--seconds", type=float, default=0.5, help="time budget per measurement")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    b = args.batch
    print(f"batch {b}, beta {args.beta}; baseline = numpy.random.choice over the full softmax")
    header = (f"{'n':>9} | {'choice s/draw':>13} | {'softmax+choice':>14} | {'ours draw+upd':>13} | "
              f"{'ratio':>8} | {'baseline bytes':>14} | {'ours bytes':>11}")
    print(header)
    print("-" * len(header))
    worst_ratio = np.inf
    for exp in range(2, args.max_exp + 1):
        n = 10 ** exp
        losses = rng.uniform(0.0, 0.1, n)
        p = kl_dro_probabilities(losses, args.beta)
        blocks = 3 if n >= 10 ** 6 else 5
        t_choice = seconds_per_call(lambda: np.random.choice(n, b, p=p), args.seconds, blocks)
        t_full = seconds_per_call(
            lambda: np.random.choice(n, b, p=kl_dro_probabilities(losses, args.beta)),
            args.seconds, blocks)
        sampler = HardnessWeightedSampler(n, beta=args.beta, init_loss=losses, seed=0)
        fresh = rng.uniform(0.0, 0.1, (4096, b))
        step = iter(range(10 ** 9))

        def ours():
            idx = sampler.sample(b)
            sampler.update(idx, fresh[next(step) % 4096])

        t_ours = seconds_per_call(ours, args.seconds)
        ratio = t_choice / t_ours
        worst_ratio = min(worst_ratio, ratio)
        print(f"{n:>9.0e} | {t_choice:>13.2e} | {t_full:>14.2e} | {t_ours:>13.2e} | "
              f"{ratio:>7.1f}x | {8 * n:>14,d} | {sampler.state_nbytes:>11,d}")
        sampler.close()
    print(f"\nours is {worst_ratio:.1f}x faster than the baseline's draw alone at worst "
          f"(target: >= 1x at every n, <= 5e-05 s per draw + update at n = 1e7)")


if __name__ == "__main__":
    main()
