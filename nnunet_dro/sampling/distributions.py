"""Closed forms of the KL-DRO problem (Fidon et al., arXiv:2001.02658), in float64 and overflow-free.

For per-volume losses ``L`` and a robustness parameter ``beta > 0``::

    R(L) = max_q  <q, L> - KL(q || uniform) / beta  =  log(mean(exp(beta * L))) / beta
    argmax = softmax(beta * L)

These are the reference the sampler is tested against; they are O(n) and meant for queries
(once per epoch), not for every draw.
"""
from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import logsumexp, softmax


def kl_dro_probabilities(losses: ArrayLike, beta: float) -> NDArray[np.float64]:
    """Hardness weights ``softmax(beta * losses)`` (sums to 1).

    >>> kl_dro_probabilities([0.0, 0.0], beta=100.0)
    array([0.5, 0.5])
    >>> kl_dro_probabilities([1e3, 0.0], beta=1e4).round(6)  # no overflow
    array([1., 0.])
    """
    return softmax(beta * np.asarray(losses, dtype=np.float64))


def kl_dro_objective(losses: ArrayLike, beta: float) -> float:
    """The robust loss ``log(mean(exp(beta * L))) / beta``; lies in ``[mean(L), max(L)]``.

    >>> kl_dro_objective([1.0, 1.0, 1.0], beta=10.0)
    1.0
    """
    x = np.asarray(losses, dtype=np.float64)
    return float((logsumexp(beta * x) - np.log(x.size)) / beta)


def entropy(p: ArrayLike) -> float:
    """Shannon entropy in nats; ``0 log 0 = 0``. ``log(n)`` for the uniform distribution."""
    p = np.asarray(p, dtype=np.float64)
    nz = p[p > 0]
    return float(-(nz * np.log(nz)).sum())


def effective_sample_size(p: ArrayLike) -> float:
    """``1 / sum(p^2)``: n for uniform sampling, 1 when all mass is on one volume."""
    p = np.asarray(p, dtype=np.float64)
    return float(1.0 / np.square(p).sum())


def hardest(losses: ArrayLike, k: int) -> list[tuple[int, float]]:
    """The ``k`` largest losses as ``(index, loss)``, largest first (ties keep the index order).

    O(n) selection then O(k log k): fine once per epoch for millions of volumes.

    >>> hardest([0.2, 0.9, 0.5], 2)
    [(1, 0.9), (2, 0.5)]
    """
    x = np.asarray(losses, dtype=np.float64).reshape(-1)
    k = min(int(k), x.size)
    if k <= 0:
        return []
    top = np.argpartition(-x, k - 1)[:k]
    top = top[np.argsort(-x[top], kind="stable")]
    return [(int(i), float(x[i])) for i in top]


def chi2_dro_probabilities(losses: ArrayLike, beta: float) -> NDArray[np.float64]:
    """Maximiser of the Pearson chi-square DRO problem (Fidon et al. 2020, eq. 21, with its threshold):

        p_i = max(0, 1 + beta * (L_i - lam)) / n,   lam such that sum(p) = 1

    i.e. the maximiser of ``<q, L> - chi2(q || uniform) / (2 beta)`` over the simplex, where
    ``chi2(q || u) = n * sum((q_i - 1/n)^2)``. If no volume is clipped, ``lam = mean(L)`` and
    this is the paper's closed form. The threshold is solved exactly by sorting (O(n log n)).

    >>> chi2_dro_probabilities([0.0, 0.0, 0.0], beta=10.0)
    array([0.33333333, 0.33333333, 0.33333333])
    >>> chi2_dro_probabilities([1.0, 0.0], beta=10.0)  # the easy volume is clipped to 0
    array([1., 0.])
    """
    x = np.asarray(losses, dtype=np.float64)
    n = x.size
    order = np.sort(x)[::-1]
    k = np.arange(1, n + 1)
    # with the k largest losses active: lam_k = (sum_top_k + (k - n) / beta) / k; the active set
    # is the largest k whose smallest member stays active: 1 + beta * (x_(k) - lam_k) > 0
    lam = (np.cumsum(order) + (k - n) / beta) / k
    active = 1.0 + beta * (order - lam) > 0
    kk = int(np.flatnonzero(active)[-1]) + 1 if active.any() else 1
    p = np.maximum(0.0, 1.0 + beta * (x - lam[kk - 1])) / n
    return p / p.sum()  # removes the last rounding error


def chi2_dro_objective(losses: ArrayLike, beta: float) -> float:
    """``max_q <q, L> - chi2(q || uniform) / (2 beta)``, evaluated at its maximiser."""
    x = np.asarray(losses, dtype=np.float64)
    q = chi2_dro_probabilities(x, beta)
    return float(q @ x - x.size * np.square(q - 1.0 / x.size).sum() / (2.0 * beta))


def clip_log_weights(log_w: ArrayLike, clip: tuple[float, float]) -> NDArray[np.float64]:
    """``clip(exp(log_w), w_min, w_max)`` computed in log space (no overflow for any finite or
    infinite ``log_w``), then clipped once more so that exp's rounding stays inside the bounds.
    The one clipping of importance weights: the sampler and the case-weighting schemes use it.

    >>> clip_log_weights([-10.0, 0.0, 10.0, float("inf")], (0.1, 10.0)).round(12).tolist()
    [0.1, 1.0, 10.0, 10.0]
    """
    w_min, w_max = clip
    log_w = np.asarray(log_w, dtype=np.float64)
    return np.clip(np.exp(np.clip(log_w, math.log(w_min), math.log(w_max))), w_min, w_max)
