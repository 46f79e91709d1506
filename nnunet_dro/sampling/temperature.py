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

import numpy as np
from numpy.typing import ArrayLike
from scipy.optimize import brentq

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
    n = x.size
    if not (0.0 < fraction <= 1.0):
        raise ValueError(f"fraction must lie in (0, 1], got {fraction}")
    if not (math.isfinite(beta_max) and beta_max > 0):
        raise ValueError(f"beta_max must be a finite positive number, got {beta_max}")
    if n == 0 or not np.all(np.isfinite(x)):
        raise ValueError("losses must be a non-empty vector of finite values")
    x = x - x.max()  # shift invariance; keeps beta * x <= 0
    target = math.log(fraction * n)
    # the entropy of n equal weights rounds to just below log(n): compare with a rounding margin
    if n == 1 or entropy_of_softmax(x, beta_max) >= target - 1e-12 * max(1.0, target):
        return float(beta_max)
    if fraction >= 1.0:
        return 0.0  # only the uniform distribution has perplexity n (the losses differ)

    def excess(log_beta: float) -> float:
        return entropy_of_softmax(x, math.exp(log_beta)) - target

    hi = math.log(beta_max)
    # walk down until the constraint holds; H -> log(n) > target as beta -> 0, so this ends
    spread = float(np.ptp(x))
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


def beta_from_spread(losses: ArrayLike, kappa: float, beta_max: float) -> float:
    """``min(beta_max, kappa / std(losses))`` (``beta_max`` when the losses are equal).

    >>> beta_from_spread([0.0, 0.2], kappa=1.0, beta_max=100.0)
    10.0
    """
    sd = float(np.std(np.asarray(losses, dtype=np.float64)))
    if not (kappa > 0):
        raise ValueError(f"kappa must be positive, got {kappa}")
    return float(beta_max) if sd <= kappa / beta_max else float(kappa / sd)
