"""Error-aware clustering of the cases: a diagonal Gaussian mixture, the error up-weighted.

Slice discovery (Domino, Eyuboglu et al., ICLR 2022, arXiv 2203.14960) fits a mixture over the
embedding and the model's error, the error's likelihood raised to a power so that the groups found
are groups the model fails on, not merely groups that look alike. Here, with a diagonal
covariance, a column repeated ``w`` times enters the likelihood ``w`` times: the error columns
(:data:`~nnunet_dro.discovery.features.ERROR_KINDS`) are repeated ``error_weight`` times, which is
that power, with scikit-learn's :class:`~sklearn.mixture.GaussianMixture` unchanged.

Preparation: volumes and HD95 on a log scale; each column centred on its median and scaled by its
interquartile range (/1.349, a standard deviation for normal data; the standard deviation where the
range is 0), clipped at +-8 so that one absurd value cannot take a component alone; a missing value
is the column's median (0 after centring); constant columns are dropped.

Number of groups: every k from 1 to ``max_groups`` is fitted; a k whose smallest group (cases
assigned by highest probability) has fewer than ``min_size`` cases is refused; of the rest, the
lowest BIC wins. The BIC is that of the fitted mixture on the unweighted columns (the first copy of
each column: a diagonal mixture in its own right), so that the repeated error columns weigh in
the fit but do not count as independent evidence for more groups. k = 1 means no subgroup stands out.

Groups are numbered from the hardest (highest mean badness: low Dice, high HD95, high hardness,
each column standardised) to the easiest.

>>> rng = np.random.default_rng(0)
>>> table = pd.DataFrame({"dice:wm": np.r_[rng.normal(90, 1, 40), rng.normal(60, 3, 10)],
...                       "ref_volume:wm": rng.normal(10, 1, 50)})
>>> found = discover_clusters(table, min_size=5, max_groups=4, seed=0)
>>> found.k, int((found.labels[40:] == 0).sum()), int((found.labels[:40] == 0).sum())
(2, 10, 0)
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from nnunet_dro.discovery.features import ERROR_KINDS, kind_of
from nnunet_dro.errors import UserError

LOG_KINDS = ("ref_volume", "pred_volume", "hd95")
#: kinds whose high values are bad (the others of ERROR_KINDS: low values are bad)
HIGH_IS_BAD = ("hd95", "hardness")
CLIP = 8.0


@dataclass
class Clustering:
    """The chosen mixture: ``labels[i]`` is case i's group (0 = hardest), ``probabilities`` its
    membership probabilities (columns in group order); ``criterion`` one row per k tried."""

    k: int
    labels: np.ndarray
    probabilities: np.ndarray
    criterion: pd.DataFrame
    columns: list[str] = field(default_factory=list)
    error_columns: list[str] = field(default_factory=list)
    error_weight: int = 1


def standardise(table: pd.DataFrame) -> pd.DataFrame:
    """The preparation of the module docstring (log scale, median/IQR, clip, fill, drop constants).

    >>> standardise(pd.DataFrame({"dice:a": [1.0, 2, 3, np.nan], "c": [1.0, 1, 1, 1]})).round(2).values.T.tolist()
    [[-1.35, 0.0, 1.35, 0.0]]
    """
    out = {}
    for column in table.columns:
        values = pd.to_numeric(table[column], errors="coerce").astype(float)
        if kind_of(column) in LOG_KINDS:
            values = np.log1p(values.clip(lower=0))
        known = values.dropna()
        if known.empty or known.nunique() < 2:
            continue
        q1, median, q3 = np.percentile(known, [25, 50, 75])
        scale = (q3 - q1) / 1.349
        if scale <= 0:
            scale = float(known.std()) or 1.0
        out[column] = ((values - median) / scale).clip(-CLIP, CLIP).fillna(0.0)
    return pd.DataFrame(out, index=table.index)


def badness(standardised: pd.DataFrame) -> pd.Series:
    """Per case: the mean over error columns of their standardised value, signed so that higher
    is worse (low Dice, high HD95, high hardness); 0 where there is no error column."""
    columns = [c for c in standardised.columns if kind_of(c) in ERROR_KINDS]
    if not columns:
        return pd.Series(0.0, index=standardised.index)
    signed = pd.DataFrame({c: standardised[c] if kind_of(c) in HIGH_IS_BAD else -standardised[c] for c in columns})
    return signed.mean(axis=1)


def unweighted_bic(model, data: np.ndarray) -> float:
    """BIC of a fitted diagonal mixture restricted to the first ``data.shape[1]`` columns."""
    from scipy.special import logsumexp

    d = data.shape[1]
    means, variances = model.means_[:, :d], model.covariances_[:, :d]
    log_density = -0.5 * (np.log(2 * np.pi * variances).sum(axis=1)[None, :]
                          + (((data[:, None, :] - means[None]) ** 2) / variances[None]).sum(axis=2))
    log_likelihood = float(logsumexp(log_density + np.log(model.weights_)[None, :], axis=1).sum())
    k = len(model.weights_)
    return -2.0 * log_likelihood + (k * 2 * d + k - 1) * np.log(len(data))


def discover_clusters(table: pd.DataFrame, min_size: int = 10, max_groups: int = 8, error_weight: int = 3,
                      seed: int = 0, n_init: int = 5) -> Clustering:
    """Cluster the rows of a feature table (:mod:`~nnunet_dro.discovery.features`); see the module
    docstring. UserError when there are fewer than ``2 * min_size`` cases or no usable feature."""
    from sklearn.mixture import GaussianMixture

    if min_size < 1 or max_groups < 1 or error_weight < 1:
        raise UserError(f"min_size, max_groups and error_weight must be at least 1 (got {min_size}, {max_groups}, "
                        f"{error_weight})")
    if len(table) < 2 * min_size:
        raise UserError(f"{len(table)} cases: too few to find a group of at least {min_size} (--min-size) beside "
                        f"the rest; at least {2 * min_size} are needed")
    data = standardise(table)
    if data.empty:
        raise UserError("no feature varies between the cases: nothing to cluster")
    error_columns = [c for c in data.columns if kind_of(c) in ERROR_KINDS]
    weighted = np.hstack([data.to_numpy()] + [data[error_columns].to_numpy()] * (error_weight - 1))
    rows, best = [], None
    for k in range(1, min(max_groups, len(table) // min_size) + 1):
        model = GaussianMixture(k, covariance_type="diag", reg_covar=1e-2, n_init=n_init, random_state=seed)
        model.fit(weighted)
        labels = model.predict(weighted)
        sizes = np.bincount(labels, minlength=k)
        accepted = bool(sizes.min() >= min_size)
        bic = unweighted_bic(model, data.to_numpy())
        rows.append({"k": k, "bic": bic, "smallest_group": int(sizes.min()), "accepted": accepted})
        if accepted and (best is None or bic < best[0]):
            best = (bic, k, labels, model.predict_proba(weighted))
    _, k, labels, probabilities = best  # k = 1 is always accepted (len(table) >= min_size)
    worst_first = np.argsort([-badness(data)[labels == g].mean() for g in range(k)], kind="stable")
    renumber = np.empty(k, int)
    renumber[worst_first] = np.arange(k)
    criterion = pd.DataFrame(rows)
    criterion["chosen"] = criterion["k"] == k
    return Clustering(k=k, labels=renumber[labels], probabilities=probabilities[:, worst_first], criterion=criterion,
                      columns=list(data.columns), error_columns=error_columns, error_weight=error_weight)
