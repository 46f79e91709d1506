"""KL-DRO by multiplicative weights instead of sampling (Sow et al., arXiv:2308.00311; see docs/methods.md).

Volumes are drawn uniformly; each example of a batch gets the weight ``exp(l_i / r) / u`` where
``u`` is a running mean, over batches, of ``exp(l / r)`` and ``r = 1 / beta``. This is the
stochastic compositional gradient of the same KL-DRO objective ``r * log(mean(exp(L / r)))`` that
hardness weighted sampling optimises: weighting instead of sampling. Everything is in log space
(``exp(l / r)`` with ``r = 0.1`` and a loss of 80 would overflow float64).

``r`` is annealed on a schedule (default 10 -> 1 -> 0.1 over thirds of training, as in the
paper); ``u`` restarts from the current batch whenever ``r`` changes, since a running mean of
``exp(l / r)`` for another ``r`` is meaningless.

>>> rw = KLReweighter(schedule=((0.0, 1.0),), momentum=0.5)
>>> w = rw.weights([0.0, 0.0], progress=0.0)   # equal losses: weights 1
>>> w.tolist()
[1.0, 1.0]
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import logsumexp

DEFAULT_SCHEDULE = ((0.0, 10.0), (1 / 3, 1.0), (2 / 3, 0.1))

__all__ = ["DEFAULT_SCHEDULE", "KLReweighter"]


class KLReweighter:
    """Per-example weights ``exp(l_i / r) / u`` with a log-space running mean ``u``.

    Args:
        schedule: ``(start fraction of training, r)`` pairs, sorted; ``r = 1 / beta``.
        momentum: ``eta`` of ``u <- (1 - eta) u + eta * mean_batch(exp(l / r))``. Default 0.5, the
            low end of the range of Sow et al.'s convergence result: with 0.1 the digits experiment
            diverged (one spike of the loss kept ``u`` so high that every weight was ~1e-67 for
            1000 steps).
        clip: optional ``(w_min, w_max)`` for the weights (the paper has none; None keeps it so).
    """

    def __init__(self, schedule: Sequence[tuple[float, float]] = DEFAULT_SCHEDULE, momentum: float = 0.5,
                 clip: tuple[float, float] | None = None):
        schedule = tuple((float(start), float(r)) for start, r in schedule)
        if not schedule or schedule[0][0] != 0.0 or any(r <= 0 for _, r in schedule) or \
                any(a[0] >= b[0] for a, b in zip(schedule, schedule[1:])):
            raise ValueError(f"schedule must start at 0.0, increase, and have r > 0: {schedule}")
        if not 0 < momentum <= 1:
            raise ValueError(f"momentum must lie in (0, 1], got {momentum}")
        self.schedule = schedule
        self.momentum = float(momentum)
        self.clip = clip
        self.log_u: float | None = None
        self.r: float | None = None

    def temperature(self, progress: float) -> float:
        """``r`` at ``progress`` (fraction of training done, 0..1)."""
        r = self.schedule[0][1]
        for start, value in self.schedule:
            if progress >= start:
                r = value
        return r

    def weights(self, losses: ArrayLike, progress: float) -> NDArray[np.float64]:
        """Weights for one batch of per-example losses; updates the running mean first.

        Non-finite losses get weight 1 and do not enter ``u``.
        """
        fresh = np.asarray(losses, dtype=np.float64).reshape(-1)
        finite = np.isfinite(fresh)
        r = self.temperature(progress)
        if r != self.r:  # new temperature: restart the running mean
            self.r, self.log_u = r, None
        if not finite.any():
            return np.ones_like(fresh)
        scaled = fresh[finite] / r
        log_batch_mean = float(logsumexp(scaled) - math.log(scaled.size))
        if self.log_u is None:
            self.log_u = log_batch_mean
        else:
            self.log_u = float(np.logaddexp(math.log1p(-self.momentum) + self.log_u if self.momentum < 1
                                            else -math.inf, math.log(self.momentum) + log_batch_mean))
        w = np.ones_like(fresh)
        w[finite] = np.exp(np.minimum(scaled - self.log_u, 700.0))
        if self.clip is not None:
            w = np.clip(w, *self.clip)
        return w

    def state_dict(self) -> dict:
        return {"log_u": self.log_u, "r": self.r}

    def load_state_dict(self, state: dict) -> None:
        self.log_u, self.r = state.get("log_u"), state.get("r")
