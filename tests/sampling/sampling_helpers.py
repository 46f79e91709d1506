"""Statistical helpers shared by the sampler and case-weighting tests."""
from __future__ import annotations

from scipy import stats


def chi_square_pvalue(observed, expected):
    """Pearson chi-square p-value; cells expecting fewer than 5 draws are pooled into one."""
    keep = expected >= 5
    obs, exp = list(observed[keep]), list(expected[keep])
    if (~keep).any():
        obs.append(observed[~keep].sum())
        exp.append(expected[~keep].sum())
    return stats.chisquare(obs, exp).pvalue
