"""The one interface every case-weighting scheme implements (no nnU-Net, no torch).

A training loop that weights cases does, each iteration::

    idx, beta = scheme.sample_with_beta(b)     # in the data-loading process (shared state)
    fresh = per_case_losses(idx)               # forward pass
    w = scheme.weights(idx, fresh, beta)       # pure: reads the state, changes nothing
    step on mean(w * fresh)
    scheme.update(idx, fresh, beta)            # all ranks' (idx, fresh, beta): the state moves

``weights`` is pure so that every rank of a distributed run can weight its own part of the
batch, while ``update`` receives the gathered batch of all ranks and keeps the state identical
everywhere. ``epoch_stats`` returns the figures a log shows once per epoch and resets the
per-epoch counters; ``state_dict``/``load_state_dict`` carry everything a resumed run needs.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from nnunet_dro.sampling.distributions import clip_log_weights, effective_sample_size, entropy, hardest
from nnunet_dro.sampling.hardness import check_batch  # noqa: F401  (the schemes validate batches with it)


@dataclass(frozen=True)
class ImportanceWeights:
    """How the step weights of the sampled cases are formed (the stability levers).

    Attributes:
        enabled: the paper's importance weights ``exp(beta * (l - L_i))`` (clipped); off: 1.
        clip: ``(w_min, w_max)``, applied in log space (never overflows).
        first_draw_one: a case drawn for the first time still has the stale loss ``L_init``,
            which is no loss at all: its weight would be the clipped minimum. Give it 1 instead.
        self_normalise: divide every weight by a running mean of the raw weights so that the
            average weight stays 1 and the effective learning rate stays the optimiser's
            (clipped weights alone move it by up to 10x either way from one step to the next).
        momentum: of that running mean, ``m <- momentum * m + (1 - momentum) * mean(batch)``;
            0.98 averages over about the last 50 updates.

    >>> ImportanceWeights().enabled, ImportanceWeights().clip
    (True, (0.1, 10.0))
    """

    enabled: bool = True
    clip: tuple[float, float] = (0.1, 10.0)
    first_draw_one: bool = False
    self_normalise: bool = False
    momentum: float = 0.98

    def __post_init__(self):
        w_min, w_max = float(self.clip[0]), float(self.clip[1])
        if not (0 < w_min <= w_max < math.inf):
            raise ValueError(f"clip must satisfy 0 < w_min <= w_max < inf, got {self.clip}")
        if not (0.0 <= self.momentum < 1.0):
            raise ValueError(f"momentum must lie in [0, 1), got {self.momentum}")
        object.__setattr__(self, "clip", (w_min, w_max))

    def clip_log(self, log_w: NDArray[np.float64]) -> NDArray[np.float64]:
        """``clip(exp(log_w))`` computed in log space (:func:`~nnunet_dro.sampling.distributions.clip_log_weights`)."""
        return clip_log_weights(log_w, self.clip)

    def is_clipped(self, log_w: NDArray[np.float64]) -> NDArray[np.bool_]:
        return (log_w <= math.log(self.clip[0])) | (log_w >= math.log(self.clip[1]))


@dataclass
class EpochCounters:
    """What ``update`` counts between two ``epoch_stats`` calls."""

    num_weights: int = 0
    num_clipped: int = 0
    weight_sum: float = 0.0
    weight_max: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def add(self, raw_weights: NDArray[np.float64], clipped: NDArray[np.bool_]) -> None:
        if raw_weights.size:
            self.num_weights += int(raw_weights.size)
            self.num_clipped += int(np.count_nonzero(clipped))
            self.weight_sum += float(raw_weights.sum())
            self.weight_max = max(self.weight_max, float(raw_weights.max()))

    def summary(self) -> dict[str, float]:
        n = self.num_weights
        return {"clipped_fraction": self.num_clipped / n if n else float("nan"),
                "mean_raw_weight": self.weight_sum / n if n else float("nan"),
                "max_raw_weight": self.weight_max if n else float("nan"),
                "num_weights": n}


class CaseWeighting(ABC):
    """Decides which training cases are drawn and how much each drawn case counts in the step.

    Subclasses: :class:`~nnunet_dro.weighting.hardness.HardnessWeighting` (KL, fixed beta:
    Algorithm 1), :class:`~nnunet_dro.weighting.hardness.AdaptiveHardnessWeighting` (KL with a
    scale-free beta), :class:`~nnunet_dro.weighting.hardness.Chi2HardnessWeighting` (Pearson
    chi-square DRO), :class:`~nnunet_dro.weighting.reweighting.KLReweighting` (uniform draws,
    multiplicative weights).
    """

    #: True if draws are uniform: the trainer keeps nnU-Net's own data loader.
    uniform_draws: bool = False
    #: Short name of the scheme (logs, checkpoints).
    scheme: str = "abstract"
    #: True while the scheme samples uniformly until released (the adaptive scheme's ERM phase).
    held_uniform: bool = False
    #: Each case's group name, for schemes that know groups (None: none).
    groups: NDArray[np.str_] | None = None

    def __init__(self, num_cases: int):
        num_cases = int(num_cases)
        if num_cases < 1:
            raise ValueError(f"num_cases must be >= 1, got {num_cases}")
        self.num_cases = num_cases
        self.counters = EpochCounters()
        self.progress = 0.0

    # -------------------------------------------------------------- the training loop
    def sample(self, batch_size: int) -> NDArray[np.int64]:
        """Indices of the next batch (i.i.d. with replacement)."""
        return self.sample_with_beta(batch_size)[0]

    @abstractmethod
    def sample_with_beta(self, batch_size: int) -> tuple[NDArray[np.int64], float]:
        """Indices of the next batch and the inverse temperature the draw used (NaN if none)."""

    @abstractmethod
    def weights(self, indices: ArrayLike, losses: ArrayLike, draw_beta: ArrayLike | None = None
                ) -> NDArray[np.float64]:
        """Step weights of a batch (before :meth:`update`); pure. Non-finite losses get 1."""

    def weights_before_loss(self, indices: ArrayLike, draw_beta: ArrayLike | None = None
                            ) -> NDArray[np.float64] | None:
        """The step weights of a batch when they cannot depend on its fresh losses, else None.

        Whenever it is not None it equals :meth:`weights` for any losses. A trainer that gets
        them queues the backward pass without first copying the losses to the host: on a GPU,
        one wait for the forward pass less per step (the losses are copied after the step, when
        nnU-Net itself copies its loss).
        """
        return None

    @abstractmethod
    def update(self, indices: ArrayLike, losses: ArrayLike, draw_beta: ArrayLike | None = None) -> None:
        """Fold the fresh losses of a batch (all ranks) into the state."""

    def group_weights(self) -> dict[str, float] | None:
        """The scheme's weight per group (group DRO's ``q``); None for schemes without one."""
        return None

    def set_progress(self, fraction: float) -> None:
        """Fraction of training done (0..1); schemes with a schedule use it."""
        self.progress = float(fraction)

    # -------------------------------------------------------------- what logs and reports show
    @abstractmethod
    def probabilities(self) -> NDArray[np.float64]:
        """The current draw probability of every case."""

    @property
    @abstractmethod
    def losses(self) -> NDArray[np.float64]:
        """The latest (stale) loss of every case."""

    @property
    @abstractmethod
    def draw_counts(self) -> NDArray[np.int64]:
        """Fresh losses received per case."""

    def epoch_stats(self, k: int = 5) -> dict[str, Any]:
        """Per-epoch figures (and reset the per-epoch counters). Keys every scheme provides:
        ``entropy, max_entropy, perplexity_fraction, effective_sample_size, ess_fraction,
        max_probability, beta, clipped_fraction, mean_raw_weight, max_raw_weight, num_weights,
        robust_loss, mean_stale_loss, num_skipped, hardest`` (``hardest``: ``(index, loss)``)."""
        p = self.probabilities()
        losses = np.array(self.losses)
        n = self.num_cases
        h = entropy(p)
        ess = effective_sample_size(p)
        stats = {
            "entropy": h, "max_entropy": math.log(n), "perplexity_fraction": math.exp(h) / n,
            "effective_sample_size": ess, "ess_fraction": ess / n, "max_probability": float(p.max()),
            "beta": self.current_beta, "robust_loss": self.robust_loss(),
            "mean_stale_loss": float(np.mean(losses)), "num_skipped": self.num_skipped,
            "hardest": hardest(losses, k),
            **self.counters.summary(),
        }
        self.counters = EpochCounters()
        return stats

    @property
    def current_beta(self) -> float:
        """The inverse temperature in force (NaN for schemes without one)."""
        return float("nan")

    def robust_loss(self) -> float:
        """The scheme's robust objective at the stale losses (mean for ERM-like schemes)."""
        return float(np.mean(self.losses))

    @property
    def num_skipped(self) -> int:
        return 0

    def describe(self) -> str:
        """One line for the training log."""
        return self.scheme

    # -------------------------------------------------------------- state and resources
    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs (plain numpy/python objects)."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; also accepts the state layouts of earlier releases."""

    def close(self) -> None:
        """Release shared memory (idempotent)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class LatestLosses:
    """For schemes whose draws keep no per-case state (uniform or fixed): the latest finite loss and
    the number of fresh losses of every case, for the hardness report. Call :meth:`_init_latest`
    in ``__init__`` and :meth:`_record_latest` in ``update``."""

    def _init_latest(self, num_cases: int) -> None:
        self._losses = np.full(num_cases, np.nan)
        self._counts = np.zeros(num_cases, dtype=np.int64)

    def _record_latest(self, idx: NDArray[np.int64], fresh: NDArray[np.float64]) -> NDArray[np.bool_]:
        """Record the finite losses of a batch; returns the mask of finite ones."""
        finite = np.isfinite(fresh)
        self._losses[idx[finite]] = fresh[finite]
        np.add.at(self._counts, idx[finite], 1)
        return finite

    @property
    def losses(self) -> NDArray[np.float64]:
        """Latest loss per case (cases never drawn: the mean of the others, or 0)."""
        seen = np.isfinite(self._losses)
        fill = float(self._losses[seen].mean()) if seen.any() else 0.0
        return np.where(seen, self._losses, fill)

    @property
    def draw_counts(self) -> NDArray[np.int64]:
        return self._counts.copy()



class SumTreeDraws:
    """For schemes that draw from the weights held in ``self.sampler``'s sum tree (log weights as its
    losses at beta 1; shared memory reaches the data-loading workers) and weight every step 1: the
    fixed case weights, the group-balanced draws, JTT's error set."""

    def sample_with_beta(self, batch_size: int) -> tuple[NDArray[np.int64], float]:
        return self.sampler.sample_with_beta(batch_size)[0], float("nan")

    def weights(self, indices: ArrayLike, losses: ArrayLike, draw_beta: ArrayLike | None = None) -> NDArray[np.float64]:
        idx, _ = check_batch(indices, losses, self.num_cases)
        return np.ones(idx.shape, dtype=np.float64)

    def weights_before_loss(self, indices: ArrayLike, draw_beta: ArrayLike | None = None
                            ) -> NDArray[np.float64] | None:
        idx, _ = check_batch(indices, np.zeros(np.asarray(indices).size), self.num_cases)
        return np.ones(idx.shape, dtype=np.float64)

def draw_betas(draw_beta: ArrayLike | None, size: int, default: float) -> NDArray[np.float64]:
    """The per-sample beta of a batch: the given value(s), or ``default`` where missing/NaN."""
    if draw_beta is None:
        return np.full(size, default, dtype=np.float64)
    b = np.broadcast_to(np.asarray(draw_beta, dtype=np.float64).reshape(-1) if np.ndim(draw_beta) else
                        np.asarray(draw_beta, dtype=np.float64), (size,)).astype(np.float64)
    return np.where(np.isfinite(b) & (b > 0), b, default)
