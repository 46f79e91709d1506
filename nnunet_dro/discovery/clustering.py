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

Number of groups: every k from 1 to ``max_groups`` is fitted. The BIC's components describe the
cases, not their errors: a large group the network fails on alike is often cut in two by its
volumes, and the well-fitted majority into several by its image features (the record's balanced
set: 6-7 groups, recall 0.53). So the components of a fit are then merged, closest pair first,
while two of them differ by less than ``merge_distance`` (:data:`MERGE_DISTANCE` robust standard
deviations) on *every* error column (their mean standardised Dice, HD95, rank and hardness): a
group is reported apart only if the network fails on it differently. A k whose smallest merged
group (cases assigned by highest probability) has fewer than ``min_size`` cases is refused; of
the rest, the lowest BIC wins. Where the lowest BIC of all was refused, :attr:`Clustering.blocked`
says so with the sizes its groups would have had (the command prints it: a group of 9 zero-Dice
cases below ``--min-size 10`` is named, not hidden behind "no group stands out"). The BIC is that of the fitted mixture on the unweighted columns (the first copy of
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
#: kinds where any departure from 0 is bad (a signed error: both directions are failures)
SIGNED_ERRORS = ("volume_error",)
CLIP = 8.0
#: components whose mean error differs by less than this on every error column (robust SDs) are one
#: group. Chosen on the tuning repeats of scripts/benchmark_discovery.py (seeds apart from those reported).
MERGE_DISTANCE = 1.0
#: how many times the error columns count in the likelihood (was 3; 8 on the tuning repeats)
ERROR_WEIGHT = 8
#: for that comparison the standardised errors are clipped here: beyond it a case fails, and two
#: failing components that differ only in how far out they lie (a large group in the tail, split
#: by the BIC) are one group
MERGE_CLIP = 3.0


def min_size_count(min_size: int | float, n_cases: int) -> int:
    """The smallest group in cases: ``min_size`` itself when it is a count (an int >= 1), else a
    share of the cohort (a float in (0, 1), rounded up, at least 2 cases).

    >>> min_size_count(10, 300), min_size_count(0.05, 300), min_size_count(0.05, 30)
    (10, 15, 2)
    """
    if isinstance(min_size, (int, np.integer)) and not isinstance(min_size, bool):
        if min_size < 1:
            raise UserError(f"--min-size {min_size}: give a count of at least 1 case or a share such as 5%")
        return int(min_size)
    share = float(min_size)
    if not 0.0 < share < 1.0:
        raise UserError(f"--min-size {min_size}: a share must lie strictly between 0 and 1 (0 % and 100 %)")
    return max(2, int(np.ceil(share * n_cases - 1e-9)))


def merge_by_error(labels: np.ndarray, errors: np.ndarray, distance: float = MERGE_DISTANCE) -> np.ndarray:
    """Merge clusters, closest pair first, while two differ by less than ``distance`` on every
    column of ``errors`` (standardised error columns, one row per case); labels renumbered 0..m-1
    in order of first appearance of the kept clusters.

    >>> errors = np.array([[0.0], [0.1], [0.2], [5.0], [5.1]])
    >>> merge_by_error(np.array([0, 0, 1, 2, 2]), errors).tolist()
    [0, 0, 0, 1, 1]
    """
    labels = np.asarray(labels).copy()
    if errors.shape[1] == 0 or distance <= 0:
        return np.unique(labels, return_inverse=True)[1]
    while True:
        present = np.unique(labels)
        if len(present) < 2:
            break
        centroids = np.array([errors[labels == g].mean(axis=0) for g in present])
        gaps = np.abs(centroids[:, None, :] - centroids[None, :, :]).max(axis=2)
        np.fill_diagonal(gaps, np.inf)
        i, j = np.unravel_index(np.argmin(gaps), gaps.shape)
        if gaps[i, j] >= distance:
            break
        labels[labels == present[max(i, j)]] = present[min(i, j)]
    return np.unique(labels, return_inverse=True)[1]


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
    #: the smallest group in cases (``min_size`` resolved against the cohort)
    min_size: int = 1
    #: where the lowest BIC of all was refused by ``min_size``: its ``k`` and merged group ``sizes``
    blocked: dict | None = None


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
    signed = pd.DataFrame({c: standardised[c].abs() if kind_of(c) in SIGNED_ERRORS
                           else standardised[c] if kind_of(c) in HIGH_IS_BAD else -standardised[c] for c in columns})
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


def discover_clusters(table: pd.DataFrame, min_size: int | float = 10, max_groups: int = 8,
                      error_weight: int = ERROR_WEIGHT,
                      seed: int = 0, n_init: int = 5, merge_distance: float = MERGE_DISTANCE) -> Clustering:
    """Cluster the rows of a feature table (:mod:`~nnunet_dro.discovery.features`); see the module
    docstring. ``min_size``: a count of cases or a share of them (:func:`min_size_count`).
    UserError when there are fewer than ``2 * min_size`` cases or no usable feature."""
    from sklearn.mixture import GaussianMixture

    if max_groups < 1 or error_weight < 1:
        raise UserError(f"max_groups and error_weight must be at least 1 (got {max_groups}, {error_weight})")
    size = min_size_count(min_size, len(table))
    if len(table) < 2 * size:
        raise UserError(f"{len(table)} cases: too few to find a group of at least {size} (--min-size) beside "
                        f"the rest; at least {2 * size} are needed")
    data = standardise(table)
    if data.empty:
        raise UserError("no feature varies between the cases: nothing to cluster")
    error_columns = [c for c in data.columns if kind_of(c) in ERROR_KINDS]
    errors = data[error_columns].to_numpy()
    weighted = np.hstack([data.to_numpy()] + [errors] * (error_weight - 1))
    rows, fits = [], []
    for k in range(1, min(max_groups, max(1, len(table) // 2)) + 1):
        model = GaussianMixture(k, covariance_type="diag", reg_covar=1e-2, n_init=n_init, random_state=seed)
        model.fit(weighted)
        components = model.predict(weighted)
        labels = merge_by_error(components, np.clip(errors, -MERGE_CLIP, MERGE_CLIP), merge_distance)
        sizes = np.bincount(labels)
        accepted = bool(sizes.min() >= size)
        bic = unweighted_bic(model, data.to_numpy())
        rows.append({"k": k, "bic": bic, "groups": int(len(sizes)), "smallest_group": int(sizes.min()),
                     "accepted": accepted})
        fits.append((bic, k, labels, model.predict_proba(weighted), components, accepted, sizes))
    # k = 1 is always accepted (len(table) >= min_size); equal BICs: the fewer groups
    best = min((f for f in fits if f[5]), key=lambda f: (f[0], f[1]))
    best_of_all = min(fits, key=lambda f: (f[0], f[1]))
    _, k_fit, merged, component_probabilities, components, _, _ = best
    k = int(merged.max() + 1)
    # membership of a merged group: the summed probabilities of its components
    probabilities = np.zeros((len(table), k))
    for component in range(component_probabilities.shape[1]):
        assigned = merged[components == component]
        if assigned.size:
            probabilities[:, assigned[0]] += component_probabilities[:, component]
    worst_first = np.argsort([-badness(data)[merged == g].mean() for g in range(k)], kind="stable")
    renumber = np.empty(k, int)
    renumber[worst_first] = np.arange(k)
    criterion = pd.DataFrame(rows)
    criterion["chosen"] = criterion["k"] == k_fit
    blocked = None
    if best_of_all is not best and len(best_of_all[6]) > k:
        blocked = {"k": int(best_of_all[1]), "sizes": sorted(int(n) for n in best_of_all[6])}
    return Clustering(k=k, labels=renumber[merged], probabilities=probabilities[:, worst_first], criterion=criterion,
                      columns=list(data.columns), error_columns=error_columns, error_weight=error_weight,
                      min_size=size, blocked=blocked)
