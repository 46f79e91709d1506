"""Class-imbalance toy of the paper (section 4.1) on scikit-learn's bundled handwritten digits.

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
   (Ren et al., arXiv:1803.09050). Each run also records the CPU time of its training steps, so the table gives every method's cost
   relative to ERM.
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

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol, Sequence

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from numpy.typing import NDArray
from torch import nn

from nnunet_dro.atomic import atomic_path, write_text_atomic
from nnunet_dro.errors import UserError
from nnunet_dro.sampling import HardnessWeightedSampler
from nnunet_dro.weighting.learning_to_reweight import learning_to_reweight
from nnunet_dro.weighting.kl_reweighter import DEFAULT_SCHEDULE, KLReweighter

NUM_CLASSES = 10
# Paper, section 4.1: lr 0.01, no momentum, no weight decay, no augmentation. It does not state
# the batch size; 32 is our choice.
DEFAULT_LR = 0.01
DEFAULT_BATCH_SIZE = 32
DEFAULT_RARE_CLASS = 3
# 0.035 of the 146 training threes of the default split = 5 images (the paper kept 1% of MNIST's
# ~6000 threes, i.e. ~60; 1% of 146 would leave a single image).
DEFAULT_RARE_FRACTION = 0.035
DEFAULT_TEST_SIZE = 0.2
DEFAULT_BETAS = (0.1, 1.0, 10.0, 100.0)
DEFAULT_CLIP = (0.1, 10.0)


# ---------------------------------------------------------------------------------- data
@dataclass(frozen=True)
class DigitsSplit:
    """Imbalanced training split and full test split; images are float32 in [0, 1], (N, 8, 8)."""

    x_train: NDArray[np.float32]
    y_train: NDArray[np.int64]
    x_test: NDArray[np.float32]
    y_test: NDArray[np.int64]
    rare_class: int
    rare_fraction: float
    rare_kept: int        # images of the rare class left in the training split
    rare_available: int   # images of the rare class the stratified training split had

    @property
    def num_train(self) -> int:
        return int(self.y_train.size)

    def describe(self) -> str:
        counts = np.bincount(self.y_train, minlength=NUM_CLASSES)
        return (f"training: {self.num_train} images, digit {self.rare_class}: kept {self.rare_kept} "
                f"of {self.rare_available} (fraction {self.rare_fraction:g}); other digits "
                f"{counts[np.arange(NUM_CLASSES) != self.rare_class].min()}-"
                f"{counts[np.arange(NUM_CLASSES) != self.rare_class].max()} each; test: "
                f"{self.y_test.size} images, digit {self.rare_class}: "
                f"{int((self.y_test == self.rare_class).sum())}")


def rare_count(available: int, fraction: float) -> int:
    """Images of the rare class to keep: ``round(fraction * available)``, at least 1.

    >>> rare_count(146, 0.035), rare_count(146, 0.01), rare_count(146, 1.0)
    (5, 1, 146)
    """
    if not (isinstance(fraction, (int, float)) and 0.0 < fraction <= 1.0):
        raise UserError(f"rare fraction must lie in (0, 1], got {fraction!r}")
    return max(1, min(available, int(round(fraction * available))))


def load_imbalanced_digits(rare_class: int = DEFAULT_RARE_CLASS,
                           rare_fraction: float = DEFAULT_RARE_FRACTION,
                           test_size: float = DEFAULT_TEST_SIZE, data_seed: int = 0) -> DigitsSplit:
    """scikit-learn's ``load_digits``, stratified split, rare class thinned in training only.

    The split and the choice of the kept rare images depend on ``data_seed`` only, so every
    method and every training seed sees the same data.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    if rare_class not in range(NUM_CLASSES):
        raise UserError(f"rare class must be a digit 0-9, got {rare_class!r}")
    if not 0.0 < test_size < 1.0:
        raise UserError(f"test size must lie in (0, 1), got {test_size!r}")
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)  # pixel values are 0..16
    labels = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        images, labels, test_size=test_size, stratify=labels, random_state=data_seed)
    rare_idx = np.flatnonzero(y_train == rare_class)
    keep = rare_count(rare_idx.size, rare_fraction)
    kept = np.random.default_rng(data_seed).choice(rare_idx, size=keep, replace=False)
    mask = y_train != rare_class
    mask[kept] = True
    return DigitsSplit(x_train[mask], y_train[mask], x_test, y_test, rare_class, float(rare_fraction),
                       keep, int(rare_idx.size))


# ---------------------------------------------------------------------------------- model
class SmallCNN(nn.Module):
    """conv3x3(1->8)-ReLU, conv3x3(8->16)-ReLU, 2x2 max-pool, linear(256->10). ~3k parameters.

    Small on purpose: the per-iteration cost on one CPU core is dominated by framework overhead,
    and the paper's WRN-16-1 would make 25 runs take far longer than the few minutes allowed.
    """

    def __init__(self, channels: tuple[int, int] = (8, 16)):
        super().__init__()
        c1, c2 = channels
        self.features = nn.Sequential(
            nn.Conv2d(1, c1, 3, padding=1), nn.ReLU(),
            nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2), nn.Flatten())
        self.classifier = nn.Linear(c2 * 4 * 4, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (N, 1, 8, 8) -> (N, 10) logits
        return self.classifier(self.features(x))


# ---------------------------------------------------------------------------------- methods
def per_example_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The loss every method weighs: cross-entropy per example, shape ``(batch,)``."""
    return F.cross_entropy(logits, targets, reduction="none")


@dataclass(frozen=True)
class MethodContext:
    """What a method may know when it is built: the training set size and labels, the seed, and
    (given by :func:`train_run`) the run's length, learning rate, model and training tensors.

    Labels are given for methods that need a clean validation subset (learning to reweight);
    DRO methods must not use them (the paper's point is that the rare group is unknown). The
    model and tensors are the hook for methods whose weights need gradients (learning to
    reweight); ``iterations`` lets annealed methods (KL reweighting) know their progress.
    """

    num_train: int
    labels: NDArray[np.int64]
    seed: int
    iterations: int = 1
    lr: float = DEFAULT_LR
    model: nn.Module | None = None
    inputs: torch.Tensor | None = None    # all training images, (N, 1, 8, 8)
    targets: torch.Tensor | None = None   # all training labels, (N,)
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = per_example_cross_entropy


class TrainingMethod(Protocol):
    """One row of the comparison: chooses the batch and weighs its per-example losses.

    Per iteration the loop calls ``sample(b)``, computes the fresh per-example losses ``l`` of
    those examples, then ``weigh(indices, l)`` (which may update the method's state) and steps
    on ``mean(w * l)``.
    """

    def sample(self, batch_size: int) -> NDArray[np.int64]: ...

    def weigh(self, indices: NDArray[np.int64], losses: NDArray[np.float64]) -> NDArray[np.float64]: ...

    def sampling_probabilities(self) -> NDArray[np.float64] | None:
        """Current distribution over training examples, if the method has one (diagnostics)."""
        ...

    def close(self) -> None: ...


class UniformSampling:
    """ERM with SGD: i.i.d. uniform draws with replacement, every weight 1."""

    def __init__(self, context: MethodContext):
        self._n = context.num_train
        self._rng = np.random.default_rng(context.seed)

    def sample(self, batch_size: int) -> NDArray[np.int64]:
        return self._rng.integers(0, self._n, size=batch_size, dtype=np.int64)

    def weigh(self, indices: NDArray[np.int64], losses: NDArray[np.float64]) -> NDArray[np.float64]:
        return np.ones(len(indices), dtype=np.float64)

    def sampling_probabilities(self) -> NDArray[np.float64]:
        return np.full(self._n, 1.0 / self._n)

    def close(self) -> None:
        pass


class HardnessWeightedSampling:
    """DRO by hardness weighted sampling of the stale losses ``L`` (the sampler core).

    ``divergence="kl"`` is Algorithm 1 (draws from ``softmax(beta * L)``); ``"chi2"`` is paper
    001's Pearson chi-square rule ``p_i = max(0, 1 + beta (L_i - lam)) / n``. With ``warmup``,
    a uniform pass over the examples not yet seen fills ``L`` first (Fidon et al. 2020), importance
    weights are 1 during it. ``L`` starts at ``log(10)`` for every example (the cross-entropy
    of a classifier that knows nothing, plus the sampler's tiny tie-breaking noise), so
    examples not seen yet look hard and are visited early even without a warm-up.
    """

    def __init__(self, context: MethodContext, beta: float, importance_sampling: bool,
                 clip: tuple[float, float] = DEFAULT_CLIP, divergence: str = "kl", warmup: bool = False):
        self.sampler = HardnessWeightedSampler(context.num_train, beta=beta,
                                               init_loss=math.log(NUM_CLASSES),
                                               importance_sampling=importance_sampling,
                                               clip=clip, seed=context.seed, divergence=divergence,
                                               warmup=warmup)

    def sample(self, batch_size: int) -> NDArray[np.int64]:
        return self.sampler.sample(batch_size)

    def weigh(self, indices: NDArray[np.int64], losses: NDArray[np.float64]) -> NDArray[np.float64]:
        weights = self.sampler.importance_weights(indices, losses)  # against the stale losses
        self.sampler.update(indices, losses)
        return weights

    def sampling_probabilities(self) -> NDArray[np.float64]:
        if self.sampler.in_warmup:  # the draws are uniform over the examples not seen yet
            unseen = self.sampler.draw_counts == 0
            return unseen / unseen.sum()
        return self.sampler.probabilities()

    def close(self) -> None:
        self.sampler.close()


class KLReweighting(UniformSampling):
    """KL-DRO by multiplicative weights (Sow et al., arXiv:2308.00311): uniform draws, weights ``exp(l_i / r) / u``.

    ``u`` is the core's log-space running mean of ``exp(l / r)`` over batches (momentum
    ``eta``: ``u <- (1 - eta) u + eta * batch mean``, updated with the batch before it is
    weighed, which bounds a weight by ``batch / eta``); ``r = 1 / beta`` follows ``schedule``
    over the run's iterations. Weights use the fresh in-batch losses, nothing is stale.
    """

    def __init__(self, context: MethodContext, schedule: Sequence[tuple[float, float]], momentum: float):
        super().__init__(context)
        self.reweighter = KLReweighter(schedule=schedule, momentum=momentum)
        self._iterations = max(1, int(context.iterations))
        self._step = 0

    def weigh(self, indices: NDArray[np.int64], losses: NDArray[np.float64]) -> NDArray[np.float64]:
        progress = self._step / self._iterations
        self._step += 1
        return self.reweighter.weights(losses, progress)


def balanced_validation_indices(labels: NDArray[np.int64], per_class: int, seed: int) -> NDArray[np.int64]:
    """``per_class`` training examples of every class present (fewer if a class has fewer).

    >>> balanced_validation_indices(np.array([0, 1, 1, 0, 2]), 1, seed=0).size
    3
    """
    rng = np.random.default_rng(seed)
    chosen = [rng.choice(np.flatnonzero(labels == c), size=min(per_class, int((labels == c).sum())),
                         replace=False) for c in np.unique(labels)]
    return np.sort(np.concatenate(chosen)).astype(np.int64)


class LearningToReweight(UniformSampling):
    """Learning to reweight (Ren et al., arXiv:1803.09050): uniform draws, per-batch weights from the look-ahead
    core :func:`~nnunet_dro.weighting.learning_to_reweight.learning_to_reweight`.

    The clean validation set is ``per_class`` examples of each digit drawn (per training seed)
    from the *training split*, so the method sees no extra data: with 1 per class that is 10
    images, one of them one of the 5 kept threes. They stay in the training set: the paper
    assumes the training set contains its small clean balanced set (and took its 10 MNIST
    validation images from the training data); removing one of 5 threes would also change the
    data all other rows see. This uses the labels, which the DRO rows do not.

    The core returns weights summing to 1 (or all 0: the step does nothing); the step is
    ``sum_i w_i l_i``, returned here as ``w * b`` for the loop's ``mean(w * l)``. The look-ahead
    uses the training learning rate (it only scales the weights before normalisation).
    """

    def __init__(self, context: MethodContext, per_class: int = 1):
        super().__init__(context)
        if context.model is None or context.inputs is None or context.targets is None:
            raise ValueError("learning to reweight needs the model and the training tensors in its context")
        self.context = context
        self.validation = balanced_validation_indices(context.labels, per_class, seed=context.seed + 7919)
        val = torch.from_numpy(self.validation)
        self._x_val, self._y_val = context.inputs[val], context.targets[val]

    def weigh(self, indices: NDArray[np.int64], losses: NDArray[np.float64]) -> NDArray[np.float64]:
        ctx, batch = self.context, torch.from_numpy(indices)
        w = learning_to_reweight(ctx.model, ctx.loss_fn, ctx.inputs[batch], ctx.targets[batch],
                                 self._x_val, self._y_val, inner_lr=ctx.lr)
        return w.double().numpy() * len(indices)


@dataclass(frozen=True)
class MethodSpec:
    """A registry row: how to build the method, its settings shown in the results table, and a
    one-line description (printed as the table's legend)."""

    name: str
    build: Callable[[MethodContext], TrainingMethod]
    settings: dict[str, Any] = field(default_factory=dict)
    description: str = ""


_CLIP_TEXT = f"[{DEFAULT_CLIP[0]:g}, {DEFAULT_CLIP[1]:g}]"

#: Chi-square DRO (Fidon et al. 2020) on the cross-entropy scale. ``p_i = max(0, 1 + beta (L_i - lam))/n``
#: is linear in the loss, so beta is "probability gain per nat": with beta = 1 a digit at 3 nats
#: when the rest sit near 0 gets ~4x the uniform probability and almost nothing is clipped (the
#: mean-variance regime); with beta = 10 it gets ~30x and every example more than 0.1 nat below
#: the threshold is not drawn at all. (KL's softmax is exponential in the loss: beta = 10 there
#: is exp(30) for the same 3 nats, hence the need for importance weights and a clip.)
CHI2_BETAS = (1.0, 10.0)
CHI2_WARMUP_BETA = 10.0
#: KL-DRO by multiplicative weights (Sow et al., arXiv:2308.00311): r = 1 / beta annealed over thirds of training,
#: r = 10 -> 1 -> 0.1 (the paper's default). On the cross-entropy scale of the digits (0 to ~5
#: nats) this is near-ERM for the first third (beta 0.1: weights within ~exp(0.5) of each
#: other), mild in the second (beta 1) and ends at beta 10, the setting of the KL-DRO sampling
#: rows; ``kl-reweight-beta10`` keeps r = 0.1 throughout, the weighting counterpart of
#: ``dro-is-beta10``. Momentum of the running mean u: eta = 0.5, the low end of the range
#: [1/2, 1) of Sow et al.'s convergence theorem. The core's default 0.1 collapsed training in
#: 2 of 2 seeds here: one hard batch lifts u by up to exp(5 nats / r), and at eta = 0.1 u then
#: forgets only 0.1 nat per step, so every batch gets a weight near 0 for thousands of steps
#: (weights also reach batch / eta = 320 before that). At 0.5 a spike fades ~7x faster and a
#: weight is at most 64. No weight clip, as in the paper.
KL_REWEIGHT_SCHEDULE = DEFAULT_SCHEDULE
KL_REWEIGHT_MOMENTUM = 0.5
#: Learning to reweight: clean balanced validation set of this many training images per class.
L2RW_PER_CLASS = 1


def _dro_spec(beta: float, importance_sampling: bool) -> MethodSpec:
    prefix = "dro-is" if importance_sampling else "dro"
    return MethodSpec(
        name=f"{prefix}-beta{beta:g}",
        build=lambda ctx: HardnessWeightedSampling(ctx, beta, importance_sampling),
        settings={"beta": beta, "importance_sampling": importance_sampling,
                  "clip": _CLIP_TEXT if importance_sampling else "-"},
        description=f"KL-DRO, hardness weighted sampling softmax(beta L), importance sampling "
                    f"{'on' if importance_sampling else 'off'} (Algorithm 1)")


def _schedule_text(schedule: Sequence[tuple[float, float]]) -> str:
    """The beta = 1 / r values of a schedule, e.g. ``0.1→1→10``."""
    return "→".join(f"{1.0 / r:g}" for _, r in schedule)


def _related_specs() -> list[MethodSpec]:
    """The related methods of docs/methods.md, built on the package's cores."""
    specs = [MethodSpec(
        "dro-warmup-beta10",
        lambda ctx: HardnessWeightedSampling(ctx, 10.0, importance_sampling=False, warmup=True),
        {"beta": 10.0, "importance_sampling": False, "clip": "-"},
        "KL-DRO sampling as dro-beta10, after a uniform warm-up pass that gives every example a "
        "fresh loss (Fidon et al. 2020's warm-up)")]
    for beta in CHI2_BETAS:
        specs.append(MethodSpec(
            f"dro-chi2-beta{beta:g}",
            lambda ctx, beta=beta: HardnessWeightedSampling(ctx, beta, importance_sampling=False,
                                                            divergence="chi2"),
            {"beta": beta, "importance_sampling": False, "clip": "-"},
            "chi-square DRO sampling max(0, 1 + beta (L - lam)) / n, no importance sampling (Fidon et al. 2020)"))
    specs.append(MethodSpec(
        "dro-chi2-warmup",
        lambda ctx: HardnessWeightedSampling(ctx, CHI2_WARMUP_BETA, importance_sampling=False,
                                             divergence="chi2", warmup=True),
        {"beta": CHI2_WARMUP_BETA, "importance_sampling": False, "clip": "-"},
        f"chi-square DRO sampling (beta {CHI2_WARMUP_BETA:g}) after a uniform warm-up pass: "
        f"Fidon et al. 2020's full setting"))
    specs.append(MethodSpec(
        "kl-reweight",
        lambda ctx: KLReweighting(ctx, KL_REWEIGHT_SCHEDULE, KL_REWEIGHT_MOMENTUM),
        {"beta": _schedule_text(KL_REWEIGHT_SCHEDULE), "importance_sampling": False, "clip": "-"},
        f"KL-DRO by multiplicative weights exp(l/r)/u, uniform draws, r = 1/beta annealed over "
        f"thirds, running-mean momentum {KL_REWEIGHT_MOMENTUM:g} (Sow et al., arXiv:2308.00311)"))
    specs.append(MethodSpec(
        "kl-reweight-beta10",
        lambda ctx: KLReweighting(ctx, ((0.0, 0.1),), KL_REWEIGHT_MOMENTUM),
        {"beta": 10.0, "importance_sampling": False, "clip": "-"},
        "as kl-reweight with r = 0.1 (beta 10) throughout: weighting instead of sampling at the "
        "beta of dro-is-beta10"))
    specs.append(MethodSpec(
        "l2rw",
        lambda ctx: LearningToReweight(ctx, per_class=L2RW_PER_CLASS),
        {"beta": "-", "importance_sampling": False, "clip": "-"},
        f"learning to reweight: look-ahead weights from a clean balanced set of {L2RW_PER_CLASS} "
        f"training image(s) per digit, uniform draws (Ren et al., arXiv:1803.09050)"))
    return specs


def _build_registry() -> dict[str, MethodSpec]:
    specs = [MethodSpec("erm", UniformSampling, {"beta": 0.0, "importance_sampling": False, "clip": "-"},
                        "plain SGD, uniform draws with replacement, weights 1")]
    for importance_sampling in (True, False):
        specs += [_dro_spec(beta, importance_sampling) for beta in DEFAULT_BETAS]
    specs += _related_specs()
    return {spec.name: spec for spec in specs}


#: name -> method. The loop, table and plots pick new rows up by name.
METHODS: dict[str, MethodSpec] = _build_registry()
#: Without --methods: ERM; KL-DRO sampling at beta 10 with importance sampling (clip [0.1, 10])
#: and without (the paper's toy setting), and with a warm-up; and the related methods. The
#: beta sweep of KL-DRO (dro-is-beta0.1/1/100, in the first version of this experiment) stays
#: selectable but left the default to keep the full run near ten minutes.
DEFAULT_METHODS: tuple[str, ...] = ("erm", "dro-is-beta10", "dro-beta10", "dro-warmup-beta10",
                                    *(f"dro-chi2-beta{b:g}" for b in CHI2_BETAS), "dro-chi2-warmup",
                                    "kl-reweight", "kl-reweight-beta10", "l2rw")


def check_method_names(names: Iterable[str]) -> list[str]:
    names = list(names)
    unknown = [n for n in names if n not in METHODS]
    if unknown:
        raise UserError(f"unknown method(s) {', '.join(unknown)}; known: {', '.join(METHODS)}")
    if not names:
        raise UserError("no method given")
    return names


# ---------------------------------------------------------------------------------- training
@dataclass
class RunResult:
    """One training run. Curves are sampled at ``iterations`` (0 = before the first step)."""

    method: str
    seed: int
    iterations: NDArray[np.int64]
    accuracy: NDArray[np.float64]        # overall test accuracy
    rare_accuracy: NDArray[np.float64]   # test accuracy on the rare class (its recall)
    train_loss: NDArray[np.float64]      # mean cross-entropy over the whole training split
    rare_mass: NDArray[np.float64]       # sampling probability on the rare training images
    seconds: float                       # wall clock
    cpu_seconds: float                   # CPU time of this process (wall time lies on a busy machine)
    step_seconds: float = math.nan       # wall clock of the training steps only (no evaluation)
    step_cpu_seconds: float = math.nan   # CPU time of the training steps only
    rare_weight_share: float = math.nan  # sum of the rare images' loss weights / sum of all weights

    @property
    def num_steps(self) -> int:
        return int(self.iterations[-1])

    @property
    def final_accuracy(self) -> float:
        return float(self.accuracy[-1])

    @property
    def final_rare_accuracy(self) -> float:
        return float(self.rare_accuracy[-1])


def _accuracies(model: nn.Module, x: torch.Tensor, y: torch.Tensor, rare: torch.Tensor) -> tuple[float, float]:
    """Overall accuracy and accuracy on the rare class (no dropout/batch norm: mode is moot)."""
    with torch.no_grad():
        correct = model(x).argmax(dim=1) == y
    return float(correct.float().mean()), float(correct[rare].float().mean())


def _mean_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float(F.cross_entropy(model(x), y))


def train_run(split: DigitsSplit, method: str, seed: int, iterations: int,
              batch_size: int = DEFAULT_BATCH_SIZE, lr: float = DEFAULT_LR,
              eval_every: int = 100) -> RunResult:
    """Train a fresh :class:`SmallCNN` with ``method`` for ``iterations`` SGD steps.

    The seed fixes the network initialisation (identical across methods, so differences
    between methods are paired) and the method's draws.
    """
    if iterations < 1 or batch_size < 1 or eval_every < 1:
        raise UserError(f"iterations, batch size and eval interval must be >= 1, got "
                        f"{iterations}, {batch_size}, {eval_every}")
    if not (math.isfinite(lr) and lr > 0):
        raise UserError(f"learning rate must be a positive number, got {lr!r}")
    spec = METHODS[check_method_names([method])[0]]
    start, cpu_start = time.perf_counter(), time.process_time()
    torch.manual_seed(seed)
    model = SmallCNN()
    optimiser = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.0, weight_decay=0.0)
    x_train = torch.from_numpy(split.x_train).unsqueeze(1)
    y_train = torch.from_numpy(split.y_train)
    x_test = torch.from_numpy(split.x_test).unsqueeze(1)
    y_test = torch.from_numpy(split.y_test)
    rare_test = y_test == split.rare_class
    rare_train = split.y_train == split.rare_class

    curve: dict[str, list[float]] = {k: [] for k in ("it", "acc", "rare", "loss", "mass")}

    def record(iteration: int, probabilities) -> None:
        acc, rare_acc = _accuracies(model, x_test, y_test, rare_test)
        curve["it"].append(iteration)
        curve["acc"].append(acc)
        curve["rare"].append(rare_acc)
        curve["loss"].append(_mean_loss(model, x_train, y_train))
        curve["mass"].append(float(probabilities[rare_train].sum()) if probabilities is not None else math.nan)

    context = MethodContext(split.num_train, split.y_train, seed, iterations=iterations, lr=lr,
                            model=model, inputs=x_train, targets=y_train)
    training = spec.build(context)
    step_wall = step_cpu = 0.0
    weight_total = weight_rare = 0.0
    try:
        record(0, training.sampling_probabilities())
        for iteration in range(1, iterations + 1):
            wall0, cpu0 = time.perf_counter(), time.process_time()
            indices = training.sample(batch_size)
            batch = torch.from_numpy(indices)
            losses = context.loss_fn(model(x_train[batch]), y_train[batch])
            fresh = losses.detach().double().numpy()
            w = training.weigh(indices, fresh)
            weights = torch.from_numpy(w).to(losses.dtype)
            optimiser.zero_grad(set_to_none=True)
            (weights * losses).mean().backward()  # (1/b) sum_i w_i grad l_i, Algorithm 1 line 12
            optimiser.step()
            step_wall += time.perf_counter() - wall0
            step_cpu += time.process_time() - cpu0
            weight_total += float(w.sum())
            weight_rare += float(w[rare_train[indices]].sum())
            if iteration % eval_every == 0 or iteration == iterations:
                record(iteration, training.sampling_probabilities())
    finally:
        training.close()
    return RunResult(method, seed, np.asarray(curve["it"], dtype=np.int64), np.asarray(curve["acc"]),
                     np.asarray(curve["rare"]), np.asarray(curve["loss"]), np.asarray(curve["mass"]),
                     time.perf_counter() - start, time.process_time() - cpu_start, step_wall, step_cpu,
                     weight_rare / weight_total if weight_total > 0 else math.nan)


def run_experiment(split: DigitsSplit, methods: Sequence[str], seeds: Sequence[int], iterations: int,
                   batch_size: int = DEFAULT_BATCH_SIZE, lr: float = DEFAULT_LR, eval_every: int = 100,
                   progress: Callable[[int, int, RunResult], None] | None = None) -> list[RunResult]:
    """Every method x every seed, sequentially (one CPU thread each)."""
    methods = check_method_names(methods)
    if not seeds:
        raise UserError("no seed given")
    total = len(methods) * len(seeds)
    results = []
    for seed in seeds:
        for method in methods:
            result = train_run(split, method, int(seed), iterations, batch_size, lr, eval_every)
            results.append(result)
            if progress is not None:
                progress(len(results), total, result)
    return results


# ---------------------------------------------------------------------------------- reporting
def _std(values: np.ndarray) -> float:
    return float(np.std(values, ddof=1)) if values.size > 1 else math.nan


def runs_table(results: Sequence[RunResult]) -> pd.DataFrame:
    """One row per run: final overall and rare-class accuracy (in %)."""
    return pd.DataFrame([{"method": r.method, "seed": r.seed, "iterations": int(r.iterations[-1]),
                          "rare_accuracy": 100 * r.final_rare_accuracy,
                          "accuracy": 100 * r.final_accuracy, "seconds": r.seconds,
                          "cpu_seconds": r.cpu_seconds,
                          "step_ms": 1e3 * r.step_seconds / max(1, r.num_steps),
                          "step_cpu_ms": 1e3 * r.step_cpu_seconds / max(1, r.num_steps),
                          "rare_weight_share": 100 * r.rare_weight_share}
                         for r in results])


def summarise(results: Sequence[RunResult], baseline: str = "erm") -> pd.DataFrame:
    """Per method: mean and std (ddof=1) over seeds of the final accuracies, in %.

    ``rare_gain_vs_erm`` is the mean over seeds of (method - ERM) on the rare class for the same
    seed (same initialisation): a paired difference. ``rare_mass`` is the sampling probability
    on the rare training images, averaged over the evaluation points and seeds;
    ``rare_weight_share`` (in %) the share of all loss weight the rare images received in the
    steps (draws x weights: the emphasis a method actually put on them, comparable between
    sampling and reweighting methods). ``step_cpu_ms`` is the mean CPU time of one training
    step (evaluation excluded) and ``step_time_vs_erm`` its ratio to ERM's in the same run.
    """
    runs = runs_table(results)
    base = runs[runs.method == baseline].set_index("seed")["rare_accuracy"]
    mass = {m: float(np.nanmean([r.rare_mass for r in results if r.method == m]))
            for m in runs.method.unique()}
    base_step = runs.loc[runs.method == baseline, "step_cpu_ms"].mean()
    rows = []
    for method, group in runs.groupby("method", sort=False):
        settings = METHODS[method].settings if method in METHODS else {}
        paired = group.set_index("seed")["rare_accuracy"] - base
        paired = paired.dropna().to_numpy()
        rows.append({
            "method": method,
            "beta": settings.get("beta", math.nan),
            "importance_sampling": settings.get("importance_sampling", ""),
            "clip": settings.get("clip", ""),
            "seeds": len(group),
            "rare_acc_mean": group.rare_accuracy.mean(), "rare_acc_std": _std(group.rare_accuracy.to_numpy()),
            "rare_acc_min": group.rare_accuracy.min(),
            "acc_mean": group.accuracy.mean(), "acc_std": _std(group.accuracy.to_numpy()),
            "rare_gain_vs_erm": float(paired.mean()) if paired.size and baseline in set(runs.method) else math.nan,
            "rare_mass": mass[method],
            "rare_weight_share": group.rare_weight_share.mean(),
            "step_ms": group.step_ms.mean(),
            "step_cpu_ms": group.step_cpu_ms.mean(),
            "step_time_vs_erm": group.step_cpu_ms.mean() / base_step if base_step > 0 else math.nan,
        })
    return pd.DataFrame(rows)


def format_markdown(summary: pd.DataFrame, rare_class: int) -> str:
    """The summary as a markdown table (accuracies in %, mean ± std over seeds)."""
    header = (f"| method | beta | IS | clip | seeds | digit {rare_class} acc | overall acc | "
              f"digit {rare_class} gain vs ERM (paired) | min digit {rare_class} acc | "
              f"sampling mass on digit {rare_class} | weight share of digit {rare_class} | "
              f"CPU ms / step | step time vs ERM |")
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for row in summary.itertuples(index=False):
        beta = f"{row.beta:g}" if isinstance(row.beta, (int, float)) else str(row.beta)
        lines.append(
            f"| {row.method} | {beta} | {'on' if row.importance_sampling else 'off'} | {row.clip} | "
            f"{row.seeds} | {row.rare_acc_mean:.1f} ± {row.rare_acc_std:.1f} | "
            f"{row.acc_mean:.1f} ± {row.acc_std:.1f} | {row.rare_gain_vs_erm:+.1f} | "
            f"{row.rare_acc_min:.1f} | {100 * row.rare_mass:.1f}% | {row.rare_weight_share:.1f}% | "
            f"{row.step_cpu_ms:.2f} | {row.step_time_vs_erm:.2f}x |")
    return "\n".join(lines) + "\n"


def format_legend(methods: Iterable[str]) -> str:
    """One line per method: its description from the registry."""
    return "\n".join(f"- {name}: {METHODS[name].description}" for name in methods if name in METHODS) + "\n"


def curves_table(results: Sequence[RunResult]) -> pd.DataFrame:
    """Long format: one row per (method, seed, iteration)."""
    frames = [pd.DataFrame({"method": r.method, "seed": r.seed, "iteration": r.iterations,
                            "accuracy": 100 * r.accuracy, "rare_accuracy": 100 * r.rare_accuracy,
                            "train_loss": r.train_loss, "rare_mass": r.rare_mass}) for r in results]
    return pd.concat(frames, ignore_index=True)


def plot_learning_curves(results: Sequence[RunResult], path: str | Path, rare_class: int,
                         title: str = "") -> None:
    """PNG: test accuracy on the rare digit, overall test accuracy and training loss vs
    iteration, mean over seeds (shaded: min-max over seeds for the accuracies)."""
    seeds = sorted({r.seed for r in results})
    subtitle = f"curves: mean over {len(seeds)} seed(s); shaded: min-max over seeds"
    title = f"{title}\n{subtitle}" if title else subtitle
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = curves_table(results)
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    panels = [("rare_accuracy", f"test accuracy on digit {rare_class} (%)"),
              ("accuracy", "overall test accuracy (%)"),
              ("train_loss", "training loss (mean CE over the training split)")]
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, (method, group) in enumerate(curves.groupby("method", sort=False)):
        stats = group.groupby("iteration")
        colour = colours[k % len(colours)]
        # solid: ERM and KL-DRO with importance sampling; dashed: other sampling; dash-dot: reweighting
        style = ("-" if method == "erm" or method.startswith("dro-is") else
                 "--" if method.startswith("dro") else "-.")
        for ax, (column, _) in zip(axes, panels):
            mean = stats[column].mean()
            ax.plot(mean.index, mean.to_numpy(), style, color=colour, label=method,
                    linewidth=2.2 if method == "erm" else 1.4)
            if column != "train_loss":
                ax.fill_between(mean.index, stats[column].min().to_numpy(), stats[column].max().to_numpy(),
                                color=colour, alpha=0.08)
    for ax, (column, label) in zip(axes, panels):
        ax.set_xlabel("iteration")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[2].set_yscale("log")
    axes[0].legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)


def write_outputs(results: Sequence[RunResult], summary: pd.DataFrame, output: str | Path,
                  split: DigitsSplit, header: str) -> dict[str, Path]:
    """Write summary.csv, summary.md, runs.csv, curves.csv and learning_curves.png (atomically)."""
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    paths = {name: output / name for name in
             ("summary.csv", "summary.md", "runs.csv", "curves.csv", "learning_curves.png")}
    write_text_atomic(paths["summary.csv"], summary.to_csv(index=False, float_format="%.4f"))
    write_text_atomic(paths["summary.md"], f"{header}\n\n{format_markdown(summary, split.rare_class)}\n"
                                           f"{format_legend(summary.method)}")
    write_text_atomic(paths["runs.csv"], runs_table(results).to_csv(index=False, float_format="%.4f"))
    write_text_atomic(paths["curves.csv"], curves_table(results).to_csv(index=False, float_format="%.5g"))
    plot_learning_curves(results, paths["learning_curves.png"], split.rare_class,
                         title="; ".join(header.split("; ")[:2]))  # the setting, without "mean ± std"
    return paths
