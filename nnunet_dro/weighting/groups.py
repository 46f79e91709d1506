"""Case weighting from what the user knows: fixed per-case sampling weights, group-balanced
sampling, and group DRO (no nnU-Net, no torch).

- :class:`FixedWeighting` draws case ``i`` with probability ``w_i / sum(w)`` (i.i.d., with
  replacement, O(log n) per draw from the same sum tree as the hardness weighted sampler) and
  steps on the plain mean loss. A weight of 0 excludes a case.
- :class:`GroupBalancedWeighting` is the fixed weighting ``w_i = 1 / (G n_g(i))``: every one of
  the ``G`` groups is drawn equally often, cases uniformly within a group.
- :class:`GroupDROWeighting` keeps the group-balanced draws and weights the step by online group
  weights ``q`` (Sagawa et al., "Distributionally Robust Neural Networks for Group Shifts", ICLR
  2020, arXiv:1911.08731, Algorithm 1): for every group ``g`` in the batch,
  ``q_g <- q_g exp(eta * mean loss of g in the batch)``, then ``q`` is renormalised, and case ``i``
  weighs ``G q_g(i)`` in the step. Under group-balanced draws the expected weighted batch mean is
  ``sum_g q_g L_g``, the group DRO objective; the factor ``G`` keeps the average weight at 1 (the
  optimiser's learning rate stays nnU-Net's) instead of shrinking the step by ``1 / G`` whenever
  a batch holds few groups, as nnU-Net's batches of 2 do.

Every scheme keeps the latest loss and the draw count of every case for the hardness report.

>>> scheme = GroupDROWeighting(["a", "a", "a", "b"], eta=0.5, seed=0)
>>> scheme.weights([0, 3], [0.2, 1.0]).round(3).tolist()   # group b had the higher loss
[0.803, 1.197]
>>> scheme.update([0, 3], [0.2, 1.0])
>>> {g: round(q, 3) for g, q in scheme.group_weights().items()}
{'a': 0.401, 'b': 0.599}
>>> scheme.close()
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import logsumexp

from nnunet_dro.sampling.hardness import NO_IMPORTANCE, HardnessWeightedSampler
from nnunet_dro.weighting.base import CaseWeighting, LatestLosses, SumTreeDraws, check_batch

STATE_VERSION = 1
#: Stale "loss" of a case with weight 0 in the sum tree over ``exp(1 * log w)``: exp underflows to 0.
_LOG_ZERO = -1.0e4


def _validated_weights(weights: ArrayLike) -> NDArray[np.float64]:
    w = np.asarray(weights, dtype=np.float64).reshape(-1)
    if w.size == 0:
        raise ValueError("no case weights")
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        bad = int(np.flatnonzero(~np.isfinite(w) | (w < 0))[0])
        raise ValueError(f"case weights must be finite and >= 0; case {bad} has {w[bad]}")
    if not w.max() > 0:
        raise ValueError("every case weight is 0: no case could be drawn")
    return w


class FixedWeighting(SumTreeDraws, LatestLosses, CaseWeighting):
    """Draw case ``i`` with probability ``w_i / sum(w)``; step weights 1.

    Args:
        weights: one finite weight ``>= 0`` per case (0: never drawn), not all 0.
        groups: optional group label per case (reports draws per group).
        seed: seed of the draws (other processes derive their own streams from it).
        shared: keep the draw state in shared memory (for data-loading worker processes).

    >>> w = FixedWeighting([1.0, 3.0, 0.0], seed=0)
    >>> w.probabilities().tolist()
    [0.25, 0.75, 0.0]
    >>> w.close()
    """

    scheme = "case_weights"

    def __init__(self, weights: ArrayLike, groups: Sequence[str] | None = None, seed: int | None = None,
                 shared: bool = False):
        w = _validated_weights(weights)
        super().__init__(w.size)
        if groups is not None and len(groups) != w.size:
            raise ValueError(f"{len(groups)} group labels for {w.size} cases")
        self.case_weights = w
        self.groups = None if groups is None else np.array([str(g) for g in groups])
        self.group_names = [] if groups is None else sorted(set(self.groups.tolist()))
        self._p = w / w.sum()
        # softmax(1 * log w) = w / sum(w): the sum tree of the hardness sampler draws it in O(log n)
        log_w = np.where(w > 0, np.log(np.where(w > 0, w, 1.0) / w.max()), _LOG_ZERO)
        self.sampler = HardnessWeightedSampler(w.size, beta=1.0, init_loss=log_w, importance=NO_IMPORTANCE,
                                               seed=seed, shared=shared)
        self._init_latest(w.size)
        self._epoch_group_draws = {g: 0 for g in self.group_names}

    # -------------------------------------------------------------- the training loop
    def update(self, indices: ArrayLike, losses: ArrayLike, draw_beta: ArrayLike | None = None) -> None:
        idx, fresh = check_batch(indices, losses, self.num_cases)
        finite = self._record_latest(idx, fresh)
        if self.groups is not None:
            for g in self.groups[idx[finite]]:
                self._epoch_group_draws[g] += 1
        self._update_state(idx[finite], fresh[finite])

    def _update_state(self, idx: NDArray[np.int64], fresh: NDArray[np.float64]) -> None:
        """Hook for schemes with state beyond losses and counts."""

    # -------------------------------------------------------------- reports
    def probabilities(self) -> NDArray[np.float64]:
        return self._p.copy()

    def group_draw_counts(self) -> dict[str, int]:
        """Fresh losses received per group since the start of training."""
        if self.groups is None:
            return {}
        return {g: int(self._counts[self.groups == g].sum()) for g in self.group_names}

    def epoch_stats(self, k: int = 5) -> dict[str, Any]:
        stats = super().epoch_stats(k)
        stats["group_draws"] = dict(self._epoch_group_draws) if self.groups is not None else None
        self._epoch_group_draws = {g: 0 for g in self.group_names}
        return stats

    def describe(self) -> str:
        drawn = int(np.count_nonzero(self.case_weights))
        return (f"fixed case weights: draws proportional to the weights ({drawn} of {self.num_cases} cases with a "
                f"weight > 0, max p {self._p.max():.4g}), step weights 1")

    # -------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "scheme": self.scheme, "case_weights": self.case_weights.copy(),
                "groups": None if self.groups is None else self.groups.tolist(),
                "losses": self._losses.copy(), "draw_counts": self._counts.copy(),
                "rng_state": self.sampler.state_dict()["rng_state"]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved_groups = state.get("groups")
        if (saved_groups is None) != (self.groups is None) or \
                (saved_groups is not None and list(saved_groups) != self.groups.tolist()):
            raise ValueError("the checkpoint was trained with other case groups than the subgroup table now gives")
        saved = np.asarray(state["case_weights"], dtype=np.float64)
        if saved.shape != self.case_weights.shape or not np.allclose(saved / saved.sum(), self._p, rtol=1e-12):
            raise ValueError("the checkpoint was trained with other case weights than the table now gives; "
                             "restore the table or start a new training")
        self._losses = np.asarray(state["losses"], dtype=np.float64).copy()
        self._counts = np.asarray(state["draw_counts"], dtype=np.int64).copy()
        sampler_state = self.sampler.state_dict()
        sampler_state["rng_state"] = state["rng_state"]
        self.sampler.load_state_dict(sampler_state)

    def close(self) -> None:
        self.sampler.close()


def group_balanced_weights(groups: Sequence[str]) -> NDArray[np.float64]:
    """``1 / (G n_g)`` per case: each of the ``G`` groups gets probability ``1 / G``.

    >>> group_balanced_weights(["a", "a", "a", "b"]).round(4).tolist()
    [0.1667, 0.1667, 0.1667, 0.5]
    """
    labels = np.array([str(g) for g in groups])
    if labels.size == 0:
        raise ValueError("no cases")
    names, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    return 1.0 / (names.size * counts[inverse].astype(np.float64))


class GroupBalancedWeighting(FixedWeighting):
    """Each group drawn equally often, cases uniformly within a group; step weights 1."""

    scheme = "group_balanced"

    def __init__(self, groups: Sequence[str], seed: int | None = None, shared: bool = False):
        super().__init__(group_balanced_weights(groups), groups=groups, seed=seed, shared=shared)

    def describe(self) -> str:
        sizes = ", ".join(f"{g} ({int(np.count_nonzero(self.groups == g))})" for g in self.group_names)
        return f"group-balanced sampling over {len(self.group_names)} groups: {sizes}; step weights 1"


class GroupDROWeighting(GroupBalancedWeighting):
    """Group-balanced draws; step weights ``G q_g`` from online group DRO (see the module docstring).

    Args:
        groups: group label per case.
        eta: step size of the exponentiated-gradient update of ``q`` (Sagawa et al. used 0.01).
    """

    scheme = "group_dro"

    def __init__(self, groups: Sequence[str], eta: float = 0.01, seed: int | None = None, shared: bool = False):
        if not (math.isfinite(eta) and eta > 0):
            raise ValueError(f"eta must be a finite positive number, got {eta}")
        super().__init__(groups, seed=seed, shared=shared)
        self.eta = float(eta)
        self._group_index = {g: i for i, g in enumerate(self.group_names)}
        self._case_group = np.array([self._group_index[g] for g in self.groups], dtype=np.int64)
        self.log_q = np.full(len(self.group_names), -math.log(len(self.group_names)))

    def _next_log_q(self, idx: NDArray[np.int64], fresh: NDArray[np.float64]) -> NDArray[np.float64]:
        finite = np.isfinite(fresh)
        g = self._case_group[idx[finite]]
        if g.size == 0:
            return self.log_q.copy()
        sums = np.bincount(g, weights=fresh[finite], minlength=self.log_q.size)
        counts = np.bincount(g, minlength=self.log_q.size)
        present = counts > 0
        log_q = self.log_q.copy()
        log_q[present] += self.eta * sums[present] / counts[present]
        return log_q - logsumexp(log_q)

    def weights_before_loss(self, indices: ArrayLike, draw_beta: ArrayLike | None = None) -> None:
        return None  # q moves with the batch's losses before the step

    def weights(self, indices: ArrayLike, losses: ArrayLike, draw_beta: ArrayLike | None = None) -> NDArray[np.float64]:
        idx, fresh = check_batch(indices, losses, self.num_cases)
        q = np.exp(self._next_log_q(idx, fresh))  # as in Sagawa et al.: update q, then step with it
        w = len(self.group_names) * q[self._case_group[idx]]
        return np.where(np.isfinite(fresh), w, 1.0)

    def _update_state(self, idx: NDArray[np.int64], fresh: NDArray[np.float64]) -> None:
        self.log_q = self._next_log_q(idx, fresh)

    def group_weights(self) -> dict[str, float]:
        """The current ``q`` per group (sums to 1)."""
        return {g: float(math.exp(self.log_q[i])) for g, i in self._group_index.items()}

    def robust_loss(self) -> float:
        losses = self.losses
        means = np.array([losses[self._case_group == i].mean() for i in range(self.log_q.size)])
        return float(np.exp(self.log_q) @ means)

    def epoch_stats(self, k: int = 5) -> dict[str, Any]:
        stats = super().epoch_stats(k)
        stats["group_weights"] = self.group_weights()
        return stats

    def describe(self) -> str:
        return (super().describe().replace("; step weights 1", "") +
                f"; group DRO step weights G q_g, eta {self.eta:g} (Sagawa et al. 2020)")

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "log_q": self.log_q.copy(), "group_names": list(self.group_names),
                "eta": self.eta}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if list(state["group_names"]) != list(self.group_names):
            raise ValueError(f"the checkpoint's groups {state['group_names']} differ from {self.group_names}")
        self.log_q = np.asarray(state["log_q"], dtype=np.float64).copy()
