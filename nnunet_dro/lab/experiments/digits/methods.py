"""The training methods of the digits experiment (ERM, KL-DRO sampling, the related methods) and their registry."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Protocol, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from numpy.typing import NDArray
from torch import nn

from nnunet_dro.errors import UserError
from nnunet_dro.lab.experiments.digits.data import DEFAULT_BETAS, DEFAULT_CLIP, DEFAULT_LR, NUM_CLASSES
from nnunet_dro.sampling import HardnessWeightedSampler, ImportanceClip
from nnunet_dro.weighting.kl_reweighter import DEFAULT_SCHEDULE, KLReweighter
from nnunet_dro.weighting.learning_to_reweight import learning_to_reweight


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
                                               importance=ImportanceClip(importance_sampling, clip),
                                               seed=context.seed, divergence=divergence,
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
