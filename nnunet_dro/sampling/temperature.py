"""Scale-free choice of the inverse temperature beta of KL-DRO.

Only ``beta * (L_i - L_j)`` matters to ``p = softmax(beta * L)``, so a fixed beta means different
things for different loss scales: nnU-Net's per-case Dice + CE spreads over an order of magnitude
less late in training than early, and differently on every dataset. Two scale-free rules:

- **Perplexity constraint** (:func:`solve_beta_for_perplexity`): the largest ``beta <= beta_max``
  whose hardness distribution keeps a perplexity ``exp(H(p))`` of at least ``fraction * n``
  cases. ``log(n) - H(p) = KL(p || uniform)``, so this is the KL-*constrained* form of the DRO
  problem, ``max_q <q, L>`` subject to ``KL(q || uniform) <= log(1 / fraction)``, whose maximiser
  is ``softmax(beta* L)`` with ``beta*`` the multiplier of the constraint (the penalised form
  with a fixed beta is Algorithm 1 of Fidon et al., "Distributionally Robust Deep Learning using
  Hardness Weighted Sampling", arXiv:2001.02658). ``fraction = 1`` is ERM; ``fraction -> 0``
  is the worst case.
- **Spread rule** (:func:`beta_from_spread`): ``beta = kappa / std(L)``, the rule of thumb from
  the discussion of that paper (beta of the order of one over the spread of the stale losses).

A cap on every case's probability (:func:`loss_ceiling`, :func:`solve_capped_beta_for_perplexity`):
``q_i <= max_weight / n``. The perplexity bounds the spread of ``p`` but not its largest entry:
one case can hold a large share while the rest stay spread (with the rest uniform, one case at
``p`` leaves a perplexity of ``0.5 n`` for ``p`` = 0.24 when n = 177, 42 times uniform). The
maximiser of ``<q, L> - KL(q || uniform) / beta`` over the capped simplex is
``softmax(beta * min(L, tau))``: the cases above a loss ceiling ``tau`` share the cap exactly (the
KL ball intersected with a CVaR box), so a capped scheme is still a softmax over stale losses, only
of losses clipped at ``tau``.

Why the solver is cheap and exact: the entropy of ``softmax(beta * L)`` never increases with beta
(``dH/dbeta = -beta * Var_p(L) <= 0``), so the constraint holds on an interval ``[0, beta*]`` and a
bracketing root finder on ``log(beta)`` converges in a few dozen O(n) evaluations.

>>> losses = [0.1, 0.2, 0.3, 0.9]
>>> beta = solve_beta_for_perplexity(losses, fraction=0.5, beta_max=1e3)
>>> round(perplexity(losses, beta) / len(losses), 6)
0.5
>>> solve_beta_for_perplexity([0.5, 0.5, 0.5], fraction=0.5, beta_max=100.0)  # equal losses
100.0
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.optimize import brentq

from nnunet_dro.sampling.distributions import kl_dro_objective, kl_dro_probabilities

#: Relative tolerance on beta of the root finder (the perplexity is then within about 1e-7 of target).
BETA_RTOL = 1e-9


def entropy_of_softmax(losses: ArrayLike, beta: float) -> float:
    """Entropy (nats) of ``softmax(beta * losses)``, overflow-free.

    >>> round(entropy_of_softmax([1.0, 1.0], 5.0), 6) == round(math.log(2), 6)
    True
    """
    x = beta * np.asarray(losses, dtype=np.float64)
    # plain numpy, not scipy's logsumexp: this runs a dozen times per solve, every few training
    # iterations, and scipy's array-API dispatch costs far more than the arithmetic for small n
    shifted = x - x.max()
    e = np.exp(shifted)
    total = e.sum()
    log_p = shifted - math.log(total)
    return float(max(0.0, -(e @ log_p) / total))


def perplexity(losses: ArrayLike, beta: float) -> float:
    """``exp(H(softmax(beta * losses)))``: the number of cases the distribution is spread over
    (n for uniform sampling, 1 when one case takes all the probability)."""
    return math.exp(entropy_of_softmax(losses, beta))


def solve_beta_for_perplexity(losses: ArrayLike, fraction: float, beta_max: float) -> float:
    """The largest ``beta`` in ``(0, beta_max]`` with ``perplexity(losses, beta) >= fraction * n``.

    Args:
        losses: the stale per-case losses (finite).
        fraction: ``f`` in ``(0, 1]``: the hardness distribution must stay spread over at least
            ``f * n`` cases. ``f = 1`` gives ``beta = 0`` (uniform sampling) unless all losses are
            equal, where every beta gives the uniform distribution and ``beta_max`` is returned.
        beta_max: the cap (returned when even ``beta_max`` keeps the perplexity above target,
            e.g. when the losses are nearly equal).

    Invariances (tested): adding a constant to every loss changes nothing; scaling the losses by
    ``a > 0`` together with ``beta_max / a`` scales the result by ``1 / a``.
    """
    x = np.asarray(losses, dtype=np.float64).reshape(-1)
    _check_solver_arguments(x, fraction, beta_max)
    x = x - x.max()  # shift invariance; keeps beta * x <= 0
    return _largest_feasible_beta(lambda beta: entropy_of_softmax(x, beta), x.size, fraction, beta_max,
                                  float(np.ptp(x)))


def _check_solver_arguments(x: NDArray[np.float64], fraction: float, beta_max: float) -> None:
    if not (0.0 < fraction <= 1.0):
        raise ValueError(f"fraction must lie in (0, 1], got {fraction}")
    if not (math.isfinite(beta_max) and beta_max > 0):
        raise ValueError(f"beta_max must be a finite positive number, got {beta_max}")
    if x.size == 0 or not np.all(np.isfinite(x)):
        raise ValueError("losses must be a non-empty vector of finite values")


def _largest_feasible_beta(entropy_at: Callable[[float], float], n: int, fraction: float, beta_max: float,
                           spread: float) -> float:
    """The largest ``beta <= beta_max`` with ``entropy_at(beta) >= log(fraction * n)``, for an
    entropy that never increases with beta and tends to ``log(n)`` as beta -> 0."""
    target = math.log(fraction * n)
    # the entropy of n equal weights rounds to just below log(n): compare with a rounding margin
    if n == 1 or entropy_at(beta_max) >= target - 1e-12 * max(1.0, target):
        return float(beta_max)
    if fraction >= 1.0:
        return 0.0  # only the uniform distribution has perplexity n (the losses differ)

    def excess(log_beta: float) -> float:
        return entropy_at(math.exp(log_beta)) - target

    hi = math.log(beta_max)
    # walk down until the constraint holds; H -> log(n) > target as beta -> 0, so this ends
    floor = math.log(1e-12 / spread)
    lo = hi - 2.0
    while excess(lo) < 0.0:
        hi, lo = lo, lo - 4.0
        if lo < floor:
            return math.exp(floor)
    log_beta = brentq(excess, lo, hi, xtol=BETA_RTOL, rtol=BETA_RTOL, maxiter=200)
    # the root may sit a rounding error on the infeasible side: step to the feasible side
    while excess(log_beta) < 0.0 and log_beta > lo:
        log_beta -= BETA_RTOL
    return float(math.exp(log_beta))


def loss_ceiling(losses: ArrayLike, beta: float, max_weight: float) -> float:
    """The ceiling ``tau`` for which ``softmax(beta * min(L, tau))`` gives no case more than
    ``max_weight / n`` (``inf`` when ``softmax(beta * L)`` already respects the cap).

    Exact, O(n log n): the largest probability grows with ``tau``; on the segment where the ``k``
    hardest cases are capped, ``exp(beta tau) (n - k c) = c * sum_{i > k} exp(beta L_(i))`` (``c``
    = ``max_weight``, losses sorted hardest first) has a closed form, and the first ``k`` whose
    solution lies at or above the next loss is the one.

    >>> tau = loss_ceiling([0.0, 0.0, 0.0, 5.0], beta=10.0, max_weight=2.0)
    >>> q = np.exp(10.0 * np.minimum([0.0, 0.0, 0.0, 5.0], tau)); round(float(q.max() / q.sum()), 6)
    0.5
    >>> loss_ceiling([0.1, 0.2], beta=1.0, max_weight=2.0)  # uniform enough already
    inf
    """
    x = np.sort(np.asarray(losses, dtype=np.float64).reshape(-1))[::-1]
    check_max_weight(max_weight)
    if not (math.isfinite(beta) and beta > 0):
        raise ValueError(f"beta must be a finite positive number, got {beta}")
    if x.size == 0 or not np.all(np.isfinite(x)):
        raise ValueError("losses must be a non-empty vector of finite values")
    return _ceiling_of_sorted(x, beta, max_weight)


def check_max_weight(max_weight: float) -> None:
    """A cap must be a number ``c > 1`` (a multiple of the uniform probability ``1 / n``)."""
    if not (max_weight > 1.0):
        raise ValueError(f"max_weight must be > 1 (a multiple of the uniform probability 1/n), got {max_weight}")


def _ceiling_of_sorted(x: NDArray[np.float64], beta: float, max_weight: float) -> float:
    """:func:`loss_ceiling` of finite losses already sorted hardest first (the root finder sorts once)."""
    n = x.size
    if max_weight >= n:
        return math.inf
    z = beta * (x - x[0])  # descending, z[0] = 0
    # tail[k] = log sum_{i >= k} exp(z_i), accumulated from the smallest up (no overflow: z <= 0)
    tail = np.logaddexp.accumulate(z[::-1])[::-1]
    log_c, log_cap = math.log(max_weight), math.log(max_weight / n)
    if z[0] - tail[0] <= log_cap:
        return math.inf
    k = np.arange(1, n)
    room = n - k * max_weight
    valid = room > 0
    z_tau = np.full(n - 1, -np.inf)
    z_tau[valid] = log_c + tail[1:][valid] - np.log(room[valid])
    # first k (capped cases) whose ceiling lies at or above the (k+1)-th loss
    hits = np.flatnonzero(valid & (z_tau >= z[1:]))
    if hits.size == 0:  # only reachable through rounding when the hardest losses tie
        return float(x[0])
    return float(x[0] + z_tau[hits[0]] / beta)


#: no outlier trim: ``(trim_above, trim_to)`` with nothing above ``inf``
NO_TRIM = (math.inf, 0.0)


def effective_losses(losses: ArrayLike, ceiling: float = math.inf,
                     trim: tuple[float, float] = NO_TRIM) -> NDArray[np.float64]:
    """The losses the hardness distribution is a softmax of: ``min(L, ceiling)``, except that a loss
    above ``trim[0]`` counts as ``trim[1]`` (an outlier left out of the hardness distribution,
    see :func:`outlier_trim`). NaN and inf pass through (the callers decide what they weigh).

    >>> effective_losses([0.1, 0.5, 0.9], ceiling=0.6).tolist()
    [0.1, 0.5, 0.6]
    >>> effective_losses([0.1, 0.5, 0.9], trim=(0.5, 0.3)).tolist()
    [0.1, 0.5, 0.3]
    """
    x = np.asarray(losses, dtype=np.float64)
    if trim[0] != math.inf:
        x = np.where((x > trim[0]) & np.isfinite(x), trim[1], x)
    return np.minimum(x, ceiling)


def capped_softmax(losses: ArrayLike, beta: float, ceiling: float,
                   trim: tuple[float, float] = NO_TRIM) -> NDArray[np.float64]:
    """``softmax(beta * min(L, ceiling))`` (the plain softmax for ``ceiling = inf``), with the
    losses above ``trim[0]`` counted as ``trim[1]``."""
    return kl_dro_probabilities(effective_losses(losses, ceiling, trim), beta)


def trim_count(num_cases: int, trim_fraction: float) -> int:
    """How many of ``num_cases`` an outlier trim of ``trim_fraction`` leaves out: the fraction
    rounded up, and never every case (0 for ``trim_fraction = 0``).

    >>> trim_count(177, 0.05), trim_count(40, 0.05), trim_count(1, 0.05), trim_count(40, 0.0)
    (9, 2, 0, 0)
    """
    if not (0.0 <= trim_fraction < 1.0):
        raise ValueError(f"trim_fraction must lie in [0, 1), got {trim_fraction}")
    return min(math.ceil(trim_fraction * num_cases - 1e-9), num_cases - 1) if trim_fraction > 0 else 0


def outlier_trim(losses: ArrayLike, count: int, beta: float, ceiling: float = math.inf) -> tuple[float, float]:
    """``(trim_above, trim_to)`` that leave the ``count`` largest losses out of the hardness
    distribution (the idea of DORO, Zhai et al., "DORO: Distributional and Outlier Robust
    Optimization", ICML 2021, arXiv:2106.06142, which drops the top fraction of losses from the DRO
    objective).

    A wrongly labelled case keeps a high loss however well the network learns, so a softmax over
    stale losses would draw it at the cap for the whole training. Here each of the ``count``
    hardest cases is drawn at the uniform rate ``1 / n`` instead (neither chased nor dropped: it
    still takes part in training as under ERM), and the other cases share the remaining
    ``(n - count) / n`` as ``softmax(beta * min(L, ceiling))`` among themselves. ``trim_above`` is
    the largest loss kept; ``trim_to`` is the loss whose weight is the mean weight of the kept cases,
    ``log(mean(exp(beta * min(L_kept, ceiling)))) / beta``, which gives a trimmed case exactly ``1 / n``.

    >>> losses = [0.1, 0.2, 0.3, 5.0]
    >>> trim = outlier_trim(losses, 1, beta=10.0)
    >>> trim[0]
    0.3
    >>> p = capped_softmax(losses, 10.0, math.inf, trim); round(float(p[3]), 12)
    0.25
    >>> outlier_trim(losses, 0, beta=10.0) == NO_TRIM
    True
    """
    x = np.asarray(losses, dtype=np.float64).reshape(-1)
    count = int(count)
    if count <= 0:
        return NO_TRIM
    if count >= x.size:
        raise ValueError(f"cannot trim {count} of {x.size} cases: at least one must stay")
    if not (math.isfinite(beta) and beta > 0):
        raise ValueError(f"beta must be a finite positive number, got {beta}")
    kept = np.partition(x, x.size - count - 1)[: x.size - count]
    above = float(kept.max())
    to = kl_dro_objective(np.minimum(kept, ceiling), beta)  # log(mean(exp(beta L))) / beta, overflow-free
    return above, min(to, above)


def solve_capped_beta_for_perplexity(losses: ArrayLike, fraction: float, beta_max: float,
                                     max_weight: float) -> tuple[float, float]:
    """``(beta, ceiling)``: the largest ``beta <= beta_max`` whose *capped* distribution
    ``softmax(beta * min(L, ceiling(beta)))`` (no case above ``max_weight / n``) keeps a perplexity
    of at least ``fraction * n``, and the ceiling of :func:`loss_ceiling` at that beta.

    The cap only ever raises the entropy, so the beta is at least that of
    :func:`solve_beta_for_perplexity`; the entropy of the capped maximiser still falls as beta grows
    (it is a KL-penalised maximiser over a convex set), so the same bracketing root finder applies.

    >>> beta, tau = solve_capped_beta_for_perplexity([0.0] * 9 + [1.0], 0.5, 1e3, max_weight=3.0)
    >>> q = capped_softmax([0.0] * 9 + [1.0], beta, tau)
    >>> round(float(q.max()) * 10, 6), round(float(np.exp(-(q * np.log(q)).sum())) / 10, 6) >= 0.5
    (3.0, True)
    """
    x = np.asarray(losses, dtype=np.float64).reshape(-1)
    _check_solver_arguments(x, fraction, beta_max)
    check_max_weight(max_weight)
    if max_weight >= x.size:
        # no probability exceeds 1: the cap cannot bind, the problem is the uncapped one. Solved by
        # the same code, since where the perplexity is flat in beta (two hardest losses tied) the
        # root finders on shifted, sorted losses and on the raw ones stop at different betas
        return solve_beta_for_perplexity(x, fraction, beta_max), math.inf
    shift = float(x.max())
    x = x - shift  # shift invariance; the ceiling is returned in the losses' own units
    n = x.size
    x = np.sort(x)[::-1]  # once: every evaluation below needs the hardest-first order

    def entropy_at(beta: float) -> float:
        return entropy_of_softmax(np.minimum(x, _ceiling_of_sorted(x, beta, max_weight)), beta)

    beta = _largest_feasible_beta(entropy_at, n, fraction, beta_max, float(np.ptp(x)))
    ceiling = _ceiling_of_sorted(x, beta, max_weight)
    return beta, ceiling + shift


def beta_from_spread(losses: ArrayLike, kappa: float, beta_max: float) -> float:
    """``min(beta_max, kappa / std(losses))`` (``beta_max`` when the losses are equal).

    >>> beta_from_spread([0.0, 0.2], kappa=1.0, beta_max=100.0)
    10.0
    """
    sd = float(np.std(np.asarray(losses, dtype=np.float64)))
    if not (kappa > 0):
        raise ValueError(f"kappa must be positive, got {kappa}")
    return float(beta_max) if sd <= kappa / beta_max else float(kappa / sd)
