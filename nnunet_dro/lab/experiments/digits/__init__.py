"""Class-imbalance toy of the paper (section 4.1) on scikit-learn's bundled handwritten digits.

Modules by concern: :mod:`.data` (the split), :mod:`.model` (the CNN), :mod:`.methods` (the
methods and their registry), :mod:`.training` (runs), :mod:`.reporting` (tables, plots, files).

The paper trains on MNIST with only 1% of the digit 3 kept and compares plain SGD (ERM, uniform
sampling) with SGD + hardness weighted sampling (KL-DRO, Algorithm 1) on the untouched test set.
Here the data are the 1797 real 8x8 digits that ship with scikit-learn (``load_digits``: no
download), so the whole comparison runs on one CPU core in minutes:

1. :func:`load_imbalanced_digits`: stratified train/test split with a fixed seed, then all but a
   handful of the rare digit are removed from the training split only.
2. :class:`SmallCNN`: two 3x3 convolutions and a linear layer, trained by :func:`train_run` with
   plain SGD (no momentum, no weight decay, no augmentation) on per-example cross-entropy
   ``l_i`` weighted as in Algorithm 1: the step is on ``mean_i(w_i * l_i)``.
3. Methods are rows of a registry, :data:`METHODS` (name -> :class:`MethodSpec`). A method
   decides which examples form a batch and how their losses are weighted
   (:class:`TrainingMethod`): ERM, the hardness weighted sampler (KL-DRO, with or without
   importance sampling, with or without a uniform warm-up pass), and the related methods of
   docs/methods.md built on the package's cores: chi-square DRO sampling (Fidon et al. 2020),
   KL-DRO by multiplicative weights (Sow et al., arXiv:2308.00311) and learning to reweight
   (Ren et al., arXiv:1803.09050). Each run also records the CPU time of its training steps, so
   the table gives every method's cost relative to ERM.
4. :func:`run_experiment`, :func:`summarise`, :func:`plot_learning_curves` and
   :func:`write_outputs` produce the table (mean and std over seeds) and learning curves.

Example (a few seconds):

>>> split = load_imbalanced_digits(rare_fraction=0.035)
>>> split.rare_kept, split.rare_available
(5, 146)
>>> runs = run_experiment(split, ["erm", "dro-is-beta10"], seeds=[0], iterations=20,
...                       eval_every=10)
>>> sorted(summarise(runs)["method"])
['dro-is-beta10', 'erm']
"""
from __future__ import annotations

from nnunet_dro.lab.experiments.digits.data import (
                                                DEFAULT_BATCH_SIZE,
                                                DEFAULT_BETAS,
                                                DEFAULT_CLIP,
                                                DEFAULT_LR,
                                                DEFAULT_RARE_CLASS,
                                                DEFAULT_RARE_FRACTION,
                                                DEFAULT_TEST_SIZE,
                                                NUM_CLASSES,
                                                DigitsSplit,
                                                load_imbalanced_digits,
                                                rare_count,
)
from nnunet_dro.lab.experiments.digits.methods import (
                                                CHI2_BETAS,
                                                CHI2_WARMUP_BETA,
                                                DEFAULT_METHODS,
                                                KL_REWEIGHT_MOMENTUM,
                                                KL_REWEIGHT_SCHEDULE,
                                                L2RW_PER_CLASS,
                                                METHODS,
                                                HardnessWeightedSampling,
                                                KLReweighting,
                                                LearningToReweight,
                                                MethodContext,
                                                MethodSpec,
                                                TrainingMethod,
                                                UniformSampling,
                                                balanced_validation_indices,
                                                check_method_names,
                                                per_example_cross_entropy,
)
from nnunet_dro.lab.experiments.digits.model import SmallCNN
from nnunet_dro.lab.experiments.digits.reporting import (
                                                curves_table,
                                                format_legend,
                                                format_markdown,
                                                plot_learning_curves,
                                                runs_table,
                                                summarise,
                                                write_outputs,
)
from nnunet_dro.lab.experiments.digits.training import RunResult, run_experiment, train_run

__all__ = [
    # data
    "NUM_CLASSES", "DEFAULT_LR", "DEFAULT_BATCH_SIZE", "DEFAULT_RARE_CLASS", "DEFAULT_RARE_FRACTION",
    "DEFAULT_TEST_SIZE", "DEFAULT_BETAS", "DEFAULT_CLIP", "DigitsSplit", "rare_count", "load_imbalanced_digits",
    # model
    "SmallCNN",
    # methods
    "per_example_cross_entropy", "MethodContext", "TrainingMethod", "UniformSampling", "HardnessWeightedSampling",
    "KLReweighting", "balanced_validation_indices", "LearningToReweight", "MethodSpec", "CHI2_BETAS",
    "CHI2_WARMUP_BETA", "KL_REWEIGHT_SCHEDULE", "KL_REWEIGHT_MOMENTUM", "L2RW_PER_CLASS", "METHODS",
    "DEFAULT_METHODS", "check_method_names",
    # training and reporting
    "RunResult", "train_run", "run_experiment", "runs_table", "summarise", "format_markdown", "format_legend",
    "curves_table", "plot_learning_curves", "write_outputs",
]
