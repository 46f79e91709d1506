"""KL-DRO by multiplicative weights on uniform draws (Sow et al., "Doubly Robust
Instance-Reweighted Adversarial Training", ICLR 2024): ``w_i = exp(l_i / r) / u`` with ``u`` a
running mean of ``exp(l / r)`` and ``r = 1 / beta`` annealed on a schedule
(:class:`~nnunet_dro.weighting.kl_reweighter.KLReweighter` holds the arithmetic).

As a :class:`~nnunet_dro.weighting.base.CaseWeighting` it draws uniformly (the trainer keeps
nnU-Net's loader) and keeps the latest loss and the count of every case for the hardness report.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import logsumexp

from nnunet_dro.weighting.base import CaseWeighting, LatestLosses, check_batch
from nnunet_dro.weighting.kl_reweighter import KLReweighter

STATE_VERSION = 2


class KLReweighting(LatestLosses, CaseWeighting):
    """Uniform draws; the step weights ``exp(l_i / r) / u`` (see the module docstring).

    ``weights`` is pure: it computes the running mean that ``update`` will commit with the same
    batch, so a single-process run reproduces the paper's update exactly.

    >>> rw = KLReweighting(3, schedule=((0.0, 1.0),))
    >>> rw.weights([0, 1], [0.5, 0.5]).round(12).tolist()   # equal losses: weights 1
    [1.0, 1.0]
    """

    uniform_draws = True
    scheme = "kl_reweight"

    def __init__(self, num_cases: int, schedule: Sequence[tuple[float, float]] = ((0.0, 1.0),),
                 momentum: float = 0.5, clip: tuple[float, float] | None = None, seed: int | None = None):
        super().__init__(num_cases)
        self.reweighter = KLReweighter(schedule, momentum, clip)
        self._init_latest(self.num_cases)
        self._rng = np.random.default_rng(seed)

    def sample_with_beta(self, batch_size: int) -> tuple[NDArray[np.int64], float]:
        return self._rng.integers(0, self.num_cases, int(batch_size)).astype(np.int64), float("nan")

    def _scratch(self) -> KLReweighter:
        copy = KLReweighter(self.reweighter.schedule, self.reweighter.momentum, self.reweighter.clip)
        copy.load_state_dict(self.reweighter.state_dict())
        return copy

    def weights(self, indices: ArrayLike, losses: ArrayLike, draw_beta: ArrayLike | None = None) -> NDArray[np.float64]:
        _, fresh = check_batch(indices, losses, self.num_cases)
        return self._scratch().weights(fresh, self.progress)

    def update(self, indices: ArrayLike, losses: ArrayLike, draw_beta: ArrayLike | None = None) -> None:
        idx, fresh = check_batch(indices, losses, self.num_cases)
        w = self.reweighter.weights(fresh, self.progress)
        finite = self._record_latest(idx, fresh)
        self.counters.add(w[finite], np.zeros(int(finite.sum()), dtype=bool))

    @property
    def current_beta(self) -> float:
        r = self.reweighter.temperature(self.progress)
        return 1.0 / r

    def probabilities(self) -> NDArray[np.float64]:
        return np.full(self.num_cases, 1.0 / self.num_cases)

    def robust_loss(self) -> float:
        r = self.reweighter.temperature(self.progress)
        x = self.losses / r
        return float(r * (logsumexp(x) - math.log(x.size)))

    def describe(self) -> str:
        rw = self.reweighter
        return (f"KL reweighting: uniform draws, weights exp(l/r)/u, r schedule "
                f"{[(round(s, 3), r) for s, r in rw.schedule]} (start fraction, r), momentum {rw.momentum}, "
                f"clip {rw.clip}")

    def state_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "scheme": self.scheme, "reweighter": self.reweighter.state_dict(),
                "losses": self._losses.copy(), "draw_counts": self._counts.copy(),
                "rng_state": self._rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.reweighter.load_state_dict(state["reweighter"])
        self._losses = np.asarray(state["losses"], dtype=np.float64).copy()
        self._counts = np.asarray(state["draw_counts"], dtype=np.int64).copy()
        if state.get("rng_state") is not None:
            self._rng.bit_generator.state = state["rng_state"]
