"""Robustness benchmark: ERM vs DRO arms on the synthetic fetal-brain-like cohort, paired over seeds.

A thin entry point: the runner is :mod:`nnunet_dro.lab.benchmark` (its docstring says what
each step does and what is reported), the analysis :mod:`nnunet_dro.lab.benchmark_analysis`.

    python scripts/benchmark_robustness.py                                  # 3 seeds x 6 arms
    python scripts/benchmark_robustness.py --arms ERM,DROAdaptive_f50 --seeds 0,1,2
    python scripts/benchmark_robustness.py --report-only                    # tables from stored runs
"""
import sys

from nnunet_dro.lab.benchmark import main

if __name__ == "__main__":
    sys.exit(main())
