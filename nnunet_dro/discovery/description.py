"""What sets a discovered group apart, in words, and its Dice tail against the rest.

**Distinguishing features.** For each feature, the group's median against the other cases',
measured in the cohort's robust spread (:func:`~nnunet_dro.discovery.clustering.standardise`):
``effect = (median in group - median in rest)`` in those units. The features with the largest
``|effect|`` (at least :data:`MIN_EFFECT`) are put in words (:func:`describe_feature`): volumes as a
multiple of the cohort median ("reference ventricles volume 2.3x the cohort median"), contrast and
intensity as low/high around or in a region, errors as low Dice or high HD95.

**Tail statistics** (:func:`tail_table`): per region, the group's and the rest's Dice mean, p10
(numpy's linear interpolation, as ``nnunet_dro evaluate``) and CVaR10 (the mean of the worst
``ceil(10 %)`` of the cases, at least one; a small helper here until the evaluation has one), and
the differences group - rest with a 95 % case-resampling bootstrap interval: the cases of the group
and of the rest are resampled with replacement, each on its own. It measures how sure the gap is
*for these cases*; it says nothing of another training run (run-to-run variance).

**Suspect labels** (:func:`suspect_labels`): the label audit of ``nnunet_dro audit-labels``
(:func:`nnunet_dro.data.label_audit.audit_volumes`) run on the reference volumes; a group where at
least half of the cases carry an audit flag (a structure missing, a volume beyond the far-out
fences) is named "suspect labels" (its errors may be the references' fault, not the network's)
unless one flag is shared by most of them and none is a missing structure: that is a real
anatomy seen by a cohort-wide audit (the audit's own caveat), reported as such.

>>> cvar([50.0, 90, 80, 70, 60, 95, 85, 75, 65, 55, 99])  # the evaluation's CVaR10: worst ceil(1.1) = 2 cases
52.5
>>> describe_feature("ref_volume:intra_axial_csf", 4.2, 2.0, effect=1.5)
'reference intra axial csf volume 2.1x the cohort median (4.2 vs 2 mL)'
>>> describe_feature("contrast:cerebellum", 0.1, 0.6, effect=-2.0)
'low image contrast around the cerebellum (0.1 vs 0.6 SD of the brain)'
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd

from nnunet_dro.discovery.clustering import standardise
from nnunet_dro.discovery.features import kind_of, region_of
from nnunet_dro.evaluation.stats import cvar

#: smallest |effect| (in robust standard deviations of the cohort) worth naming
MIN_EFFECT = 0.5
#: how many features a group's description names at most
MAX_FEATURES = 4
#: share of a group's cases with a label-audit flag that makes it "suspect labels"
SUSPECT_SHARE = 0.5
#: share of the flagged cases sharing one flag that reads as a real anatomy, not label faults
SHARED_PATTERN = 2 / 3


def tail_stats(values: Sequence[float]) -> dict[str, float]:
    """``mean``, ``p10`` and ``cvar10`` of the known values (NaN when there are none)."""
    array = np.asarray(values, dtype=float)
    array = array[~np.isnan(array)]
    if array.size == 0:
        return {"mean": math.nan, "p10": math.nan, "cvar10": math.nan}
    return {"mean": float(array.mean()), "p10": float(np.percentile(array, 10)), "cvar10": cvar(array)}


def tail_table(dice: pd.DataFrame, in_group: np.ndarray, n_bootstrap: int = 1000, seed: int = 0) -> pd.DataFrame:
    """One row per region (``dice`` columns are regions, rows cases): n, the group's and the rest's
    mean/p10/CVaR10, the differences group - rest and their 95 % case-resampling bootstrap
    intervals (``*_low``/``*_high``; NaN with ``n_bootstrap=0``)."""
    rng = np.random.default_rng(seed)
    rows = []
    for region in dice.columns:
        group = dice[region].to_numpy(float)[in_group]
        rest = dice[region].to_numpy(float)[~in_group]
        group, rest = group[~np.isnan(group)], rest[~np.isnan(rest)]
        mine, theirs = tail_stats(group), tail_stats(rest)
        row = {"region": region, "n_group": int(group.size), "n_rest": int(rest.size)}
        for stat in ("mean", "p10", "cvar10"):
            row[f"group_{stat}"], row[f"rest_{stat}"] = mine[stat], theirs[stat]
            row[f"diff_{stat}"] = mine[stat] - theirs[stat]
        draws = {stat: [] for stat in ("mean", "p10", "cvar10")}
        if group.size and rest.size:
            for _ in range(n_bootstrap):
                a = tail_stats(rng.choice(group, group.size))
                b = tail_stats(rng.choice(rest, rest.size))
                for stat in draws:
                    draws[stat].append(a[stat] - b[stat])
        for stat, values in draws.items():
            low, high = np.percentile(values, [2.5, 97.5]) if values else (math.nan, math.nan)
            row[f"diff_{stat}_low"], row[f"diff_{stat}_high"] = float(low), float(high)
        rows.append(row)
    return pd.DataFrame(rows)


def _name(region: str) -> str:
    return region.replace("_", " ")


def _number(value: float) -> str:
    return f"{value:.3g}"


def describe_feature(column: str, group_median: float, cohort_median: float, effect: float) -> str:
    """One feature's difference in words (see the module docstring)."""
    kind, region = kind_of(column), _name(region_of(column))
    higher = effect > 0
    values = f"({_number(group_median)} vs {_number(cohort_median)}"
    if kind in ("ref_volume", "pred_volume"):
        which = "reference" if kind == "ref_volume" else "predicted"
        if cohort_median > 0 and group_median > 0:
            ratio = group_median / cohort_median
            size = f"{ratio:.1f}x" if ratio >= 1 else f"{ratio:.2f}x"
            return f"{which} {region} volume {size} the cohort median {values} mL)"
        return f"{which} {region} volume {'larger' if higher else 'smaller'} than the cohort's {values} mL)"
    if kind == "contrast":
        return f"{'high' if higher else 'low'} image contrast around the {region} {values} SD of the brain)"
    if kind == "intensity":
        return f"{'bright' if higher else 'dark'} {region} in the image {values} SD from the brain mean)"
    if kind == "volume_error":
        return f"{region} {'over' if higher else 'under'}-segmented (predicted volume {group_median:+.3g} % vs " \
               f"{cohort_median:+.3g} % of the reference)"
    if kind == "dice":
        return f"{'high' if higher else 'low'} {region} Dice {values} %)"
    if kind == "dice_rank":
        return f"{region} Dice {'ranked high' if higher else 'among the worst'} in the cohort (percentile rank " \
               f"{_number(group_median)} vs {_number(cohort_median)})"
    if kind == "hd95":
        return f"{'high' if higher else 'low'} {region} HD95 {values} mm)"
    if column == "hardness:stale_loss":
        return f"{'high' if higher else 'low'} training loss under DRO (stale loss {_number(group_median)} vs " \
               f"{_number(cohort_median)})"
    if column == "hardness:draw_share":
        return f"drawn {'more' if higher else 'less'} often by the DRO sampler (share of draws " \
               f"{_number(group_median)} vs {_number(cohort_median)})"
    return f"{column} {'high' if higher else 'low'} {values})"


def distinguishing_features(features: pd.DataFrame, in_group: np.ndarray, limit: int = MAX_FEATURES,
                            skip_kinds: Sequence[str] = ("dice_rank",)) -> list[dict]:
    """The features that set the group apart most: column, effect, medians and the words, sorted by
    ``|effect|`` (only those of at least :data:`MIN_EFFECT`, at most ``limit``)."""
    scaled = standardise(features)
    found = []
    for column in scaled.columns:
        if kind_of(column) in skip_kinds:
            continue
        effect = float(scaled[column][in_group].median() - scaled[column][~in_group].median())
        if abs(effect) < MIN_EFFECT:
            continue
        raw = pd.to_numeric(features[column], errors="coerce")
        group_median, cohort_median = float(raw[in_group].median()), float(raw.median())
        if _number(group_median) == _number(cohort_median):
            continue  # equal as shown: "high Dice (66.7 vs 66.7 %)" would read as a difference that is not there
        found.append({"feature": column, "effect": effect, "group_median": group_median,
                      "cohort_median": cohort_median,
                      "text": describe_feature(column, group_median, cohort_median, effect)})
    found.sort(key=lambda f: -abs(f["effect"]))
    return found[:limit]


def audit_flags(features: pd.DataFrame) -> pd.Series:
    """Per case (index of ``features``): the label audit's flags on its reference volumes, as text
    (``"cerebellum missing; csf large"``), ``""`` for an unflagged case."""
    from nnunet_dro.data.label_audit import audit_volumes

    columns = [c for c in features.columns if kind_of(c) == "ref_volume"]
    flags = pd.Series("", index=features.index, dtype=object)
    if not columns:
        return flags
    volumes = features[columns].rename(columns=region_of).reset_index(names="case")
    volumes["case"] = volumes["case"].astype(str)
    found = audit_volumes(volumes.fillna(0.0))
    for case, rows in found.groupby("case"):
        flags[case] = "; ".join(f"{label} {flag}" for label, flag in zip(rows["label"], rows["flag"]))
    return flags


def shared_flag(flags: pd.Series, in_group: np.ndarray) -> tuple[str, float]:
    """The most common single flag (``"csf large"``) among the group's flagged cases and the share of
    those cases that carry it (``("", 0.0)`` when none is flagged)."""
    items = [set(text.split("; ")) for text in flags[in_group] if text]
    if not items:
        return "", 0.0
    counts = pd.Series([item for case in items for item in case]).value_counts()
    return str(counts.index[0]), float(counts.iloc[0]) / len(items)


def suspect_labels(flags: pd.Series, in_group: np.ndarray) -> bool:
    """Whether the group's errors look like label faults: at least :data:`SUSPECT_SHARE` of its cases
    carry a label-audit flag, and either a structure is missing in one of them or no single flag is
    shared by :data:`SHARED_PATTERN` of the flagged cases. One flag that most of them share
    ("intra axial csf large" throughout) is what a real anatomy does to a cohort-wide audit (an
    enlarged ventricle group); label faults (an erased structure, swapped labels) do not repeat."""
    members = flags[in_group]
    if not len(members) or float((members != "").mean()) < SUSPECT_SHARE:
        return False
    if any("missing" in text for text in members):
        return True
    return shared_flag(flags, in_group)[1] < SHARED_PATTERN
