"""Statistical helpers shared by the sampler and case-weighting tests."""
from __future__ import annotations

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st
from scipy import stats


def chi_square_pvalue(observed, expected):
    """Pearson chi-square p-value; cells expecting fewer than 5 draws are pooled into one."""
    keep = expected >= 5
    obs, exp = list(observed[keep]), list(expected[keep])
    if (~keep).any():
        obs.append(observed[~keep].sum())
        exp.append(expected[~keep].sum())
    return stats.chisquare(obs, exp).pvalue


@st.composite
def loss_vectors(draw, min_n=2, max_n=2000):
    """Per-case losses: realistic nnU-Net shapes (Dice + CE in 0..3) and extreme spreads
    (1e-6 .. 1e3), n from 2 to 2000. Built from a seed so that large vectors stay cheap."""
    n = draw(st.integers(min_n, max_n))
    shape = draw(st.sampled_from(["uniform", "exponential", "one_outlier", "two_clusters", "ties"]))
    spread = draw(st.sampled_from([1e-6, 1e-3, 0.1, 1.0, 3.0, 1e3]) | st.floats(1e-6, 1e3))
    offset = draw(st.floats(0.0, 3.0))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    if shape == "uniform":
        base = rng.uniform(0.0, 1.0, n)
    elif shape == "exponential":
        base = rng.exponential(1.0, n)
        base /= base.max()
    elif shape == "one_outlier":  # one very hard case, the rest nearly equal
        base = rng.uniform(0.0, 1e-3, n)
        base[rng.integers(n)] = 1.0
    elif shape == "two_clusters":
        base = np.where(rng.random(n) < 0.2, 1.0, 0.0) + rng.normal(0.0, 0.01, n)
    else:  # many exact ties
        base = rng.integers(0, 4, n) / 3.0
    base = base - base.min()
    assume(np.ptp(base) > 0)
    return offset + spread * base / np.ptp(base)
