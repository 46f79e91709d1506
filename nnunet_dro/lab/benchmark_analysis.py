"""The robustness benchmark's analysis: per-seed statistics, paired differences to ERM, bootstrap
intervals of p10 differences, the targets check, the markdown and terminal reports and the
trade-off plot, from per-case Dice tables and run summaries. Nothing here trains or predicts
(that is :mod:`nnunet_dro.lab.benchmark` with :mod:`nnunet_dro.lab.pipeline`), so
``--report-only`` and the tests use it on stored tables alone."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from nnunet_dro.atomic import atomic_path
from nnunet_dro.errors import UserError
from nnunet_dro.evaluation.stats import bootstrap_percentile_difference, holm, paired_wilcoxon
from nnunet_dro.lab.arm_runs import ARM_TRAINERS, BASELINE_ARM
from nnunet_dro.lab.cohort_folder import GROUP_COLUMN, MAJORITY_GROUP, MINORITY_GROUPS
from nnunet_dro.lab.run_summary import CONVERGED_DICE
from nnunet_dro.training.stability import budget_is_tight

#: ERM, the paper's fixed beta, the default scale-free trainer (f 0.5, no importance weights, cap 5 / n)
#: and the uncapped trainer at three constraints (the grid of docs/evidence.md; with importance weights
#: every screened f did worse)
DEFAULT_ARMS = ("ERM", "DRO", "DROAdaptive", "DROAdaptive_noIS", "DROAdaptive_f75_noIS",
                "DROAdaptive_f90_noIS")
BASELINE = BASELINE_ARM
STATISTICS = ("mean", "median", "p25", "p10", "p5", "iqr")
#: targets (issue: adaptive DRO lifts the minority's hardest structure, controls unchanged)
TARGET_LIFT = 5.0
MAJORITY_TOLERANCE = 1.0


def parse_seeds(text: str) -> list[int]:
    """``"3"`` -> ``[0, 1, 2]``; ``"4,7,9"`` -> ``[4, 7, 9]``; one seed alone is ``"2,"``.

    >>> parse_seeds("3"), parse_seeds("4,7"), parse_seeds("2,")
    ([0, 1, 2], [4, 7], [2])
    """
    try:
        if "," in text:
            seeds = [int(part) for part in text.split(",") if part.strip()]
        else:
            seeds = list(range(int(text)))
    except ValueError:
        raise UserError(f"--seeds {text!r}: expected a count (3) or a comma-separated list (0,1,2)") from None
    if text.strip() == "0":
        raise UserError("--seeds '0': a bare number is a count of seeds (3 = seeds 0, 1, 2); "
                        "for seed 0 alone write --seeds 0,")
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise UserError(f"--seeds {text!r}: need at least one seed, non-negative and without repeats")
    return seeds


def parse_arms(text: str) -> list[str]:
    """Comma-separated arm names (see ``arm_runs.ARM_TRAINERS``); ERM first if present.

    >>> parse_arms("DROAdaptive_f50,ERM")
    ['ERM', 'DROAdaptive_f50']
    """
    arms = [a.strip() for a in text.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARM_TRAINERS]
    if not arms or unknown or len(set(arms)) != len(arms):
        raise UserError(f"--arms {text!r}: expected distinct names among {', '.join(ARM_TRAINERS)}")
    return sorted(arms, key=lambda a: a != BASELINE)


# ---------------------------------------------------------------------------------------- statistics
def _statistics(values: np.ndarray) -> dict[str, float]:
    values = values[~np.isnan(values)]
    if values.size == 0:
        return {s: np.nan for s in STATISTICS}
    p5, p10, p25, p50, p75 = np.percentile(values, [5, 10, 25, 50, 75])
    return {"mean": float(values.mean()), "median": float(p50), "p25": float(p25), "p10": float(p10),
            "p5": float(p5), "iqr": float(p75 - p25)}


def _group_order(per_case: pd.DataFrame) -> list[str]:
    present = list(dict.fromkeys(per_case[GROUP_COLUMN].dropna()))
    known = [g for g in (MAJORITY_GROUP, *MINORITY_GROUPS) if g in present]
    return ["all"] + known + [g for g in present if g not in known]


def _groups_of(per_case: pd.DataFrame):
    for group in _group_order(per_case):
        yield group, per_case if group == "all" else per_case[per_case[GROUP_COLUMN] == group]


def summary_by_seed(per_case: pd.DataFrame) -> pd.DataFrame:
    """One row per seed, arm (``method``), group and region: n and the Dice statistics (numpy
    percentiles with linear interpolation, as ``nnunet_dro evaluate``)."""
    rows = []
    for group, frame in _groups_of(per_case):
        for (seed, method, region), part in frame.groupby(["seed", "method", "region"], sort=False):
            values = part["value"].to_numpy(float)
            rows.append({"seed": seed, "method": method, "group": group, "region": region,
                         "n": int(np.isfinite(values).sum()), **_statistics(values)})
    return pd.DataFrame(rows)


def hd95_worst_tenth(per_case: pd.DataFrame) -> pd.DataFrame:
    """One row per seed, arm, group and region of per-case HD95 rows (mm; lower is better): n, mean,
    median and ``p90``, the worst tenth's boundary (the HD95 counterpart of the Dice p10; numpy's
    linear interpolation, as :func:`summary_by_seed`).

    >>> rows = pd.DataFrame({"seed": 1, "method": "ERM", "region": "csf", "condition": "other",
    ...                      "value": [float(v) for v in range(1, 11)]})
    >>> print(hd95_worst_tenth(rows)[["group", "n", "p90"]].to_string(index=False))
    group  n  p90
      all 10  9.1
    other 10  9.1
    """
    rows = []
    for group, frame in _groups_of(per_case):
        for (seed, method, region), part in frame.groupby(["seed", "method", "region"], sort=False):
            values = part["value"].to_numpy(float)
            values = values[~np.isnan(values)]
            rows.append({"seed": seed, "method": method, "group": group, "region": region, "n": int(values.size),
                         "mean": float(values.mean()) if values.size else np.nan,
                         "median": float(np.median(values)) if values.size else np.nan,
                         "p90": float(np.percentile(values, 90)) if values.size else np.nan})
    return pd.DataFrame(rows)


def summary_over_seeds(by_seed: pd.DataFrame, arms: Sequence[str] | None = None) -> pd.DataFrame:
    """Each statistic averaged over seeds, with its sd across seeds (``<stat>_sd``)."""
    keys = ["method", "group", "region"]
    grouped = by_seed.groupby(keys, sort=False)
    table = grouped[list(STATISTICS)].mean()
    spread = grouped[list(STATISTICS)].std(ddof=1).add_suffix("_sd")
    out = pd.concat([table, spread], axis=1).reset_index()
    out.insert(3, "n_seeds", grouped.size().to_numpy())
    out.insert(4, "n_cases_per_seed", grouped["n"].mean().to_numpy())
    ordered = ["method", "group", "region", "n_seeds", "n_cases_per_seed"]
    for s in STATISTICS:
        ordered += [s, f"{s}_sd"]
    arm_order = list(arms) if arms else list(dict.fromkeys(by_seed["method"]))
    rank = {name: i for i, name in enumerate(dict.fromkeys(by_seed["group"]))}
    regions = {name: i for i, name in enumerate(dict.fromkeys(by_seed["region"]))}
    out = out.assign(_g=out["group"].map(rank), _r=out["region"].map(regions),
                     _m=out["method"].map(lambda m: arm_order.index(m) if m in arm_order else len(arm_order)))
    return out.sort_values(["_g", "_r", "_m"], kind="stable")[ordered].reset_index(drop=True)


def paired_comparison(per_case: pd.DataFrame, by_seed: pd.DataFrame, baseline: str = BASELINE) -> pd.DataFrame:
    """Every arm minus ``baseline``, per group and region, paired by seed (and by case).

    ``d_<stat>``: the per-seed difference averaged over seeds; ``d_<stat>_sd`` its sd;
    ``d_<stat>_signs``: its sign in each seed (``+``/``-``/``0``, seeds in order);
    ``d_<stat>_seeds_up``: how many seeds have it > 0. ``pooled_*``: per-case differences pooled
    over seeds (mean, share improved, two-sided Wilcoxon signed-rank p, Holm over all rows).
    """
    rows = []
    arms = [m for m in dict.fromkeys(per_case["method"]) if m != baseline]
    for arm in arms:
        for group, frame in _groups_of(per_case):
            for region in dict.fromkeys(per_case["region"]):
                row = {"method": arm, "group": group, "region": region}
                part = by_seed[(by_seed["group"] == group) & (by_seed["region"] == region)]
                seeds = part.pivot(index="seed", columns="method", values=list(STATISTICS)).sort_index()
                for s in STATISTICS:
                    both = (s, arm) in seeds and (s, baseline) in seeds
                    diff = (seeds[(s, arm)] - seeds[(s, baseline)]).dropna() if both else pd.Series(dtype=float)
                    values = diff.to_numpy(float)
                    row[f"d_{s}"] = float(values.mean()) if values.size else np.nan
                    row[f"d_{s}_sd"] = float(np.std(values, ddof=1)) if values.size > 1 else np.nan
                    row[f"d_{s}_seeds_up"] = int((values > 0).sum())
                    row[f"d_{s}_signs"] = "".join("+" if v > 0 else "-" if v < 0 else "0" for v in values)
                    if s == "mean":  # seeds where this arm and the baseline both ran (other arms may lack some)
                        row["n_seeds"] = int(values.size)
                pairs = (frame[(frame["region"] == region) & frame["method"].isin([arm, baseline])]
                         .pivot_table(index=["seed", "case"], columns="method", values="value", aggfunc="first"))
                if {arm, baseline} <= set(pairs.columns):
                    a, b = pairs[arm].to_numpy(float), pairs[baseline].to_numpy(float)
                else:
                    a = b = np.array([])
                keep = ~(np.isnan(a) | np.isnan(b))
                difference = a[keep] - b[keep]
                row.update(pooled_n=int(keep.sum()),
                           pooled_mean=float(difference.mean()) if difference.size else np.nan,
                           pooled_share_improved=float((difference > 0).mean()) if difference.size else np.nan,
                           pooled_wilcoxon_p=paired_wilcoxon(a, b))
                rows.append(row)
    # ERM alone (e.g. to see which seeds have a tight budget before running DRO): no rows, same columns
    columns = (["method", "group", "region", "n_seeds"]
               + [f"d_{s}{suffix}" for s in STATISTICS for suffix in ("", "_sd", "_seeds_up", "_signs")]
               + ["pooled_n", "pooled_mean", "pooled_share_improved", "pooled_wilcoxon_p"])
    table = pd.DataFrame(rows, columns=columns)
    table["pooled_holm_p"] = holm(table["pooled_wilcoxon_p"].tolist()) if len(table) else []
    return table


def p10_intervals(per_case: pd.DataFrame, hardest: dict[str, str], baseline: str = BASELINE,
                  n_bootstrap: int = 2000, confidence: float = 0.95) -> pd.DataFrame:
    """Each arm's paired p10 difference to ``baseline`` on each minority group's hardest structure,
    per seed, with a percentile-bootstrap interval over the test cases (pairs resampled together,
    fixed bootstrap seed). The interval covers which test cases were drawn, with both trained
    networks fixed; a second training run of the same arm adds its own noise on top (``ERM_repeat``).

    One row per (arm, seed, group): ``d_p10``, ``low``, ``high``, ``n`` (cases paired) and
    ``resolved``: ``+`` when the whole interval is above 0, ``-`` when below, ``0`` when it holds 0.
    """
    rows = []
    for arm in [m for m in dict.fromkeys(per_case["method"]) if m != baseline]:
        for group, region in hardest.items():
            part = per_case[(per_case[GROUP_COLUMN] == group) & (per_case["region"] == region)
                            & per_case["method"].isin([arm, baseline])]
            pairs = part.pivot_table(index=["seed", "case"], columns="method", values="value", aggfunc="first")
            if not {arm, baseline} <= set(pairs.columns):
                continue
            for seed, table in pairs.groupby(level="seed"):
                a, b = table[arm].to_numpy(float), table[baseline].to_numpy(float)
                keep = ~(np.isnan(a) | np.isnan(b))
                if not keep.any():
                    continue
                low, high = bootstrap_percentile_difference(a[keep], b[keep], [10], n_bootstrap, confidence)[10]
                rows.append({"method": arm, "seed": int(seed), "group": group, "region": region,
                             "n": int(keep.sum()),
                             "d_p10": float(np.percentile(a[keep], 10) - np.percentile(b[keep], 10)),
                             "low": low, "high": high,
                             "resolved": "+" if low > 0 else "-" if high < 0 else "0"})
    return pd.DataFrame(rows, columns=["method", "seed", "group", "region", "n", "d_p10", "low", "high", "resolved"])


def p10_interval_section(intervals: pd.DataFrame, confidence: float = 0.95, baseline: str = BASELINE,
                         title: str = "## Is a seed's p10 difference more than the draw of test cases?") -> list[str]:
    """The markdown section of :func:`p10_intervals` (made with the same ``baseline``); empty without rows."""
    if intervals.empty:
        return []
    rows = [[r["method"], r["group"], r["region"], str(r["seed"]), str(r["n"]), f"{r['d_p10']:+.1f}",
             f"[{r['low']:+.1f}, {r['high']:+.1f}]", r["resolved"]] for _, r in intervals.iterrows()]
    return _table_section(
        title,
        f"Each arm's paired p10 difference to {baseline} on each minority group's hardest structure, per seed, with "
        f"its {confidence:.0%} bootstrap interval over the test cases (pairs resampled together; both trained "
        "networks fixed, so a second training run adds more noise). Resolved: + or - when the whole interval is on "
        "that side of 0, 0 when it holds 0.",
        ["arm", "group", "region", "seed", "n", "Δp10", "interval", "resolved"],
        ["---", "---", "---", "---:", "---:", "---:", "---", ":---:"], rows)


def against_section(intervals: pd.DataFrame, baseline: str, large_intervals: pd.DataFrame | None = None,
                    confidence: float = 0.95) -> list[str]:
    """``--also-against ARM``: every arm's p10 difference to ``baseline`` (an arm trained under the
    same conditions as the arms it is read against, e.g. ``ERM_repeat``), per seed with bootstrap
    intervals, on the test cases and, if scored, on the larger test set; only seeds where both ran.
    The hardest structures stay ERM's, so nothing is chosen against ``baseline``.

    >>> rows = pd.DataFrame([{"method": "JTT", "seed": 13, "group": "other", "region": "intra_axial_csf",
    ...                       "n": 100, "d_p10": 4.7, "low": 1.0, "high": 7.5, "resolved": "+"}])
    >>> against_section(rows, "DROAdaptive_repeat")[0]
    '## Against DROAdaptive_repeat, paired like ERM'
    >>> against_section(rows.iloc[:0], "DROAdaptive_repeat")
    []
    """
    lines = []
    for table, where in ((intervals, "the test cases"), (large_intervals, "the larger test set")):
        if table is None or table.empty:
            continue
        lines += p10_interval_section(table, confidence, baseline, f"### On {where}")
    if not lines:
        return []
    return [f"## Against {baseline}, paired like ERM", "",
            f"Every arm against {baseline} instead of ERM, on the seeds where both ran: read an arm's gain against "
            f"a run trained under the same conditions (`--also-against {baseline}`).", "", *lines]


def _table_section(title: str, text: str, columns: Sequence[str], align: Sequence[str],
                   rows: Sequence[Sequence[str]]) -> list[str]:
    """A markdown section: title, one paragraph, one table."""
    return [title, "", text, "", "| " + " | ".join(columns) + " |", "|" + "|".join(align) + "|",
            *("| " + " | ".join(row) + " |" for row in rows), ""]


def hardest_regions(summary: pd.DataFrame, baseline: str = BASELINE) -> dict[str, str]:
    """Each minority group's hardest structure: the region with the lowest mean Dice under the
    baseline (ERM), so the choice never depends on the DRO arms' results."""
    out = {}
    for group in MINORITY_GROUPS:
        rows = summary[(summary["method"] == baseline) & (summary["group"] == group)]
        if len(rows):
            out[group] = str(rows.sort_values("mean", kind="stable").iloc[0]["region"])
    return out


def _dice_verdicts(arm: str, paired: pd.DataFrame, hardest: dict[str, str]) -> list[str]:
    """The Dice targets of one arm, from its rows of the paired table."""
    p = paired[paired["method"] == arm].set_index(["group", "region"])
    lines = []
    for group, region in hardest.items():
        if (group, region) not in p.index:
            continue
        r = p.loc[(group, region)]
        ok = r["d_p10"] >= TARGET_LIFT and r["d_p10_seeds_up"] == r["n_seeds"] and r["n_seeds"] > 0
        lines.append(f"{arm}: {group} p10 on its hardest structure ({region}) {r['d_p10']:+.1f} vs ERM "
                     f"[{r['d_p10_signs']}] -> {'MET' if ok else 'not met'} (target >= +{TARGET_LIFT:g}, "
                     f"better in every seed)")
    if MAJORITY_GROUP in p.index.get_level_values(0):
        majority = p.loc[MAJORITY_GROUP]
        ok = majority["d_mean"].min() >= -MAJORITY_TOLERANCE
        lines.append(f"{arm}: controls' region means vs ERM " + ", ".join(
            f"{reg} {d:+.1f} [{s}]" for reg, d, s in zip(majority.index, majority["d_mean"], majority["d_mean_signs"]))
            + f" -> {'MET' if ok else 'not met'} (target: every region within {MAJORITY_TOLERANCE:g} point)")
    return lines


def _training_verdicts(arm: str, runs: pd.DataFrame, baseline: str) -> list[str]:
    """The stability targets of one arm (collapsed and lost epochs against the baseline's, per seed)."""
    arm_runs = runs[runs["arm"] == arm].set_index("seed")
    base_runs = runs[runs["arm"] == baseline].set_index("seed")
    common = sorted(set(arm_runs.index) & set(base_runs.index))
    if not common:
        return []
    mine = [int(arm_runs.loc[s, "collapsed_epochs"]) for s in common]
    erm = [int(base_runs.loc[s, "collapsed_epochs"]) for s in common]
    ok = all(a <= b for a, b in zip(mine, erm))
    lines = [f"{arm}: collapsed epochs per seed {mine} vs ERM {erm} -> {'MET' if ok else 'not met'} "
             f"(target: no more than ERM in each seed)"]
    if "lost_epochs" in arm_runs:
        lost = [int(arm_runs.loc[s, "lost_epochs"]) for s in common]
        lost_erm = [int(base_runs.loc[s, "lost_epochs"]) for s in common]
        lines.append(f"{arm}: epochs with a learned structure lost per seed {lost} vs ERM {lost_erm} -> "
                     f"{'MET' if not any(lost) else 'not met'} (target: no structure lost in any seed)")
    return lines


def _paired_arms(paired: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(paired["method"])) if len(paired) else []


def dice_targets_check(paired: pd.DataFrame, hardest: dict[str, str]) -> list[str]:
    """The Dice targets alone, one sentence per arm and target (for further test sets: the stability
    targets are properties of the training runs, not of the cases they are scored on)."""
    return [line for arm in _paired_arms(paired) for line in _dice_verdicts(arm, paired, hardest)]


def targets_check(by_seed: pd.DataFrame, paired: pd.DataFrame, runs: pd.DataFrame, hardest: dict[str, str],
                  baseline: str = BASELINE) -> list[str]:
    """One sentence per arm and target, by the rules stated in each sentence."""
    lines = []
    for arm in _paired_arms(paired):
        lines += _dice_verdicts(arm, paired, hardest)
        lines += _training_verdicts(arm, runs, baseline)
    return lines


# ---------------------------------------------------------------------------------------- reports
def _pm(value: float, sd: float) -> str:
    if np.isnan(value):
        return "n/a"
    return f"{value:.1f}" if np.isnan(sd) else f"{value:.1f} ± {sd:.1f}"


def _signed(value: float, sd: float, signs: str = "") -> str:
    if np.isnan(value):
        return "n/a"
    return f"{value:+.1f}" + ("" if np.isnan(sd) else f" ± {sd:.1f}") + (f" [{signs}]" if signs else "")


REPORT_STATISTICS = ("mean", "p10", "p5", "iqr")


def learning_split(runs: pd.DataFrame, baseline: str = BASELINE) -> tuple[list[int], list[int]]:
    """The seeds whose ERM run learned every structure (pseudo-Dice >= 0.2) within the first half
    of its epochs, and the others (later, never, or unknown): how tight the budget is for that
    seed, known from ERM alone.

    >>> runs = pd.DataFrame({"arm": ["ERM"] * 3 + ["X"], "seed": [0, 1, 2, 0], "epochs": [120] * 4,
    ...                      "all_learned_epoch": [33, 80, None, 5]})
    >>> learning_split(runs)
    ([0], [1, 2])
    """
    early, late = [], []
    for _, run in runs[runs["arm"] == baseline].sort_values("seed").iterrows():
        (late if budget_is_tight(run.get("all_learned_epoch"), int(run["epochs"])) else early).append(int(run["seed"]))
    return early, late


def learning_time_section(per_case: pd.DataFrame, runs: pd.DataFrame, hardest: dict[str, str],
                          arms: Sequence[str], baseline: str = BASELINE) -> list[str]:
    """The headline table again, once for the seeds on which ERM learned every structure within
    the first half of the budget and once for the others (:func:`learning_split`). Drawing hard
    cases more means fewer draws for what every case still lacks: where ERM itself needs most of
    the budget, a DRO arm can end less converged than ERM, and the difference then measures
    convergence more than robustness. Empty without the ERM runs' learning epochs."""
    if "all_learned_epoch" not in runs:
        return []
    lines = ["## By how early ERM learned every structure", "",
             "The headline table for two sets of seeds, split by ERM alone: the seeds on which ERM's "
             "pseudo-Dice was >= 0.2 for every structure within the first half of the epochs, and the "
             "others (later or never: a budget that is tight for that seed). Each run's epoch is in the "
             "runs table.", ""]
    for title, seeds in zip(("within the first half", "later or never"), learning_split(runs, baseline)):
        lines += [f"### ERM learned every structure {title}: seeds {', '.join(map(str, seeds)) or 'none'}", ""]
        if not seeds:
            continue
        part = per_case[per_case["seed"].isin(seeds)]
        by_seed = summary_by_seed(part)
        lines += headline_table(summary_over_seeds(by_seed, arms), paired_comparison(part, by_seed),
                                runs[runs["seed"].isin(seeds)], hardest) + [""]
    return lines


#: How the report names each further test set: (its section heading, where as in "Dice targets
#: <where>", what its cases are, its flag).
FURTHER_TEST_TEXT = {
    "large_test": ("On a larger test set", "on the larger test set", "a further independent draw of the generator",
                   "--large-test"),
    "shifted_test": ("At the new centre", "at the new centre", "the larger test set's anatomies and labels acquired "
                     "at site_C, a centre no training case comes from: thick slices, more noise and bias field, a "
                     "flatter grey/white contrast", "--shifted-test"),
}


def further_test_section(cases: str, table: pd.DataFrame, runs: pd.DataFrame, hardest: dict[str, str],
                         arms: Sequence[str], intervals: pd.DataFrame) -> list[str]:
    """The headline table and the p10 intervals again, on a further test set (``cases`` a key of
    ``FURTHER_TEST_TEXT``): the same trained networks, more test cases per group, at the cohort's
    sites or a new centre. The hardest structures stay those of the main test set, so nothing is
    chosen on these cases."""
    heading, where, what, flag = FURTHER_TEST_TEXT[cases]
    by_seed = summary_by_seed(table)
    counts = by_seed.groupby("group")["n"].max().reindex([g for g in _group_order(table) if g != "all"])
    seeds = sorted(set(table["seed"]))
    scored = runs[runs.set_index(["arm", "seed"]).index.isin(list(zip(table["method"], table["seed"])))]
    paired = paired_comparison(table, by_seed)
    lines = [f"## {heading} (the same trained networks)", "",
             f"Seeds {', '.join(map(str, seeds))}: every arm's final network scored on {what} ("
             + ", ".join(f"{g} {n}" for g, n in counts.items()) + f" cases; `{flag}`). ERM in Dice, the other "
             "arms as paired differences, as in the headline.", "",
             *headline_table(summary_over_seeds(by_seed, arms), paired, scored, hardest), ""]
    section = p10_interval_section(intervals)
    if section:
        lines += ["#" + section[0], *section[1:]]  # one heading level down: a part of this section
    # The Dice targets judged again on these cases; the stability targets stay in "Targets".
    verdicts = dice_targets_check(paired, hardest)
    if verdicts:
        lines += [f"### Dice targets {where}", "", *(f"- {v}" for v in verdicts), ""]
    return lines


def training_fit(training: pd.DataFrame, test: pd.DataFrame, hardest: dict[str, str]) -> pd.DataFrame:
    """Per arm, seed and minority group: its hardest structure's Dice mean and p10 on the network's
    own training cases beside those on the test cases."""
    rows = []
    for (arm, seed), part in training.groupby(["method", "seed"], sort=False):
        for group, region in hardest.items():
            fitted = part[(part[GROUP_COLUMN] == group) & (part["region"] == region)]["value"].to_numpy(float)
            tested = test[(test["method"] == arm) & (test["seed"] == seed) & (test[GROUP_COLUMN] == group)
                          & (test["region"] == region)]["value"].to_numpy(float)
            if fitted.size and tested.size:
                train_stats, test_stats = _statistics(fitted), _statistics(tested)
                rows.append({"method": arm, "seed": int(seed), "group": group, "region": region,
                             "n_training": int(np.isfinite(fitted).sum()), "training_mean": train_stats["mean"],
                             "training_p10": train_stats["p10"], "test_mean": test_stats["mean"],
                             "test_p10": test_stats["p10"]})
    return pd.DataFrame(rows, columns=["method", "seed", "group", "region", "n_training", "training_mean",
                                       "training_p10", "test_mean", "test_p10"])


def training_fit_curve(curve: pd.DataFrame) -> pd.DataFrame:
    """Per arm, seed, epoch of a kept network, group and region: the Dice mean and p10 over the
    network's own training cases (:meth:`~nnunet_dro.lab.arm_runs.ArmRuns.score_training_curve`).

    >>> rows = [{"method": "ERM", "seed": 1, "epoch": e, "case": c, GROUP_COLUMN: "other", "region": "csf",
    ...          "value": v} for e, c, v in ((400, "a", 70.0), (400, "b", 80.0), (800, "a", 90.0), (800, "b", 90.0))]
    >>> training_fit_curve(pd.DataFrame(rows))[["epoch", "mean"]].values.tolist()
    [[400.0, 75.0], [800.0, 90.0]]
    """
    rows = []
    keys = ["method", "seed", "epoch", GROUP_COLUMN, "region"]
    for (arm, seed, epoch, group, region), part in curve.groupby(keys, sort=True):
        values = part["value"].to_numpy(float)
        stats = _statistics(values)
        rows.append({"method": arm, "seed": int(seed), "epoch": int(epoch), "group": group, "region": region,
                     "n": int(np.isfinite(values).sum()), "mean": stats["mean"], "p10": stats["p10"]})
    return pd.DataFrame(rows, columns=["method", "seed", "epoch", "group", "region", "n", "mean", "p10"])


def training_fit_section(fit: pd.DataFrame) -> list[str]:
    """The markdown section of :func:`training_fit`; empty without rows."""
    if fit.empty:
        return []
    rows = [[r["method"], str(r["seed"]), r["group"], r["region"], str(r["n_training"]),
             *(f"{r[c]:.1f}" for c in ("training_mean", "training_p10", "test_mean", "test_p10"))]
            for _, r in fit.iterrows()]
    return _table_section(
        "## Fit on the training cases",
        "Each minority group's hardest structure scored by the same network on its own training cases "
        "(`--training-fit`) and on the test cases. Where an arm that draws the group more often raises its "
        "training Dice, and the test Dice with it, the group was under-fitted for being rare; a structure "
        "that stays about as low on its own training cases under every arm is limited by something that "
        "more draws do not change.",
        ["arm", "seed", "group", "region", "training cases", "training mean", "training p10", "test mean",
         "test p10"], ["---", "---:", "---", "---", "---:", "---:", "---:", "---:", "---:"], rows)


def markdown_report(summary: pd.DataFrame, paired: pd.DataFrame, runs: pd.DataFrame, settings: dict,
                    hardest: dict[str, str], targets: list[str], sections: Sequence[str] = ()) -> str:
    # the trainer each arm's runs were stored with (an arm name can outlive its trainer's name)
    trained = (runs.groupby("arm")["trainer"].agg(lambda t: ", ".join(sorted(set(map(str, t)))))
               if "trainer" in runs else pd.Series(dtype=str))
    lines = [
        "# Robustness benchmark: ERM vs DRO arms on the synthetic fetal-brain-like cohort",
        "",
        f"Seeds (cohort seed = training seed): {', '.join(map(str, settings['seeds']))}. Cohort per seed: "
        f"{settings['cohort']['n_train']} training cases (control/spina bifida/other about 80/12/8 %), "
        f"{settings['cohort']['n_test']} test cases (a third each), {settings['cohort']['size']}^3 voxels. "
        f"Arms: " + ", ".join(f"{a} (`{trained.get(a, ARM_TRAINERS[a])}`)" for a in settings["arms"]) + ". "
        f"Budget: {settings['budget']}.",
        "",
        "Dice in percent per test case; statistics per seed (numpy percentiles, IQR = p75 - p25), then "
        "mean ± sd across seeds. A region empty in both reference and prediction scores 100.",
        "",
        "## Headline",
        "",
        "ERM: Dice, mean ± sd over seeds. Every other arm: its paired difference to ERM (same cohort and "
        "initial weights per seed), mean ± sd over seeds [sign in each seed]. Hardest structure of a "
        "minority group: its lowest ERM mean.",
        "",
        *headline_table(summary, paired, runs, hardest),
        "",
        *sections,
        "## Runs: convergence and stability",
        "",
        "| arm | seed | controls' mean Dice per region | every structure learned at epoch | collapsed epochs | "
        "lost epochs | train s | DRO beta (last) | perplexity/n (mean) | ESS/n (mean) | clipped (mean) | "
        "minorities' share of draws | minority hardness AUC | busiest case's draws (x uniform) |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for _, r in runs.iterrows():
        means = ", ".join(f"{k} {v:.1f}" for k, v in (r["control_mean_dice"] or {}).items())
        lines.append(f"| {r['arm']} | {r['seed']} | {means} | {_epoch(r.get('all_learned_epoch'))} | "
                     f"{r['collapsed_epochs']} of {max(0, r['epochs'] - 10)} | "
                     f"{r.get('lost_epochs', '-')} | "
                     f"{r['train_seconds']:.0f} | {_fmt(r.get('dro_beta_last'))} | {_fmt(r.get('dro_perplexity_fraction_mean'))} | "
                     f"{_fmt(r.get('dro_ess_fraction_mean'))} | {_fmt(r.get('dro_clipped_fraction_mean'))} | "
                     f"{_minority_share(r)} | {_fmt(r.get('minority_hardness_auc'))} | "
                     f"{_fmt(r.get('busiest_case_draws'))} |")
    lines += ["", f"(Converged means every region's mean Dice of the controls >= {CONVERGED_DICE:g}; "
                  "every structure learned at epoch: the first epoch with every structure's pseudo-Dice >= 0.2, "
                  "'never' if none had; "
                  "collapsed epochs: epochs >= 10 in which some structure's pseudo-Dice was < 0.05, including "
                  "structures not learned yet; lost epochs: epochs in which a structure whose pseudo-Dice had "
                  "reached 0.5 was < 0.05 again; minorities' share of draws: the training draws that went to "
                  f"{' and '.join(MINORITY_GROUPS)} cases, counted by the sampler, or their share of the training "
                  "cases for nnU-Net's uniform sampling; minority hardness AUC: the probability that a minority "
                  "training case ends with a higher stale loss than a control, 0.5 = chance; busiest case's draws: the "
                  "most-drawn training case's draws over the uniform expectation, from the sampler's counts.)", "",
              "## Dice per group and region (mean ± sd over seeds)", "",
              "| group | region | arm | n/seed | " + " | ".join(REPORT_STATISTICS) + " |",
              "|---|---|---|---:|" + "---:|" * len(REPORT_STATISTICS)]
    for _, r in summary.iterrows():
        lines.append(f"| {r['group']} | {r['region']} | {r['method']} | {r['n_cases_per_seed']:.0f} | "
                     + " | ".join(_pm(r[s], r[f'{s}_sd']) for s in REPORT_STATISTICS) + " |")
    lines += ["", "## Paired differences to ERM", "",
              "Per-seed difference of each statistic: mean ± sd over seeds [sign in each seed]. Pooled: per-case "
              "differences of all seeds (mean; two-sided Wilcoxon signed-rank p, Holm-adjusted over all rows).", "",
              "| arm | group | region | Δmean | Δp10 | Δp5 | ΔIQR | pooled Δ | Holm p |",
              "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for _, r in paired.iterrows():
        cells = [_signed(r[f"d_{s}"], r[f"d_{s}_sd"], r[f"d_{s}_signs"]) for s in REPORT_STATISTICS]
        lines.append(f"| {r['method']} | {r['group']} | {r['region']} | " + " | ".join(cells)
                     + f" | {r['pooled_mean']:+.1f} | {r['pooled_holm_p']:.3g} |")
    lines += ["", "(ΔIQR < 0: less spread out than ERM.)", "",
              "## Targets", "",
              "Hardest structure per minority group (lowest ERM mean): "
              + ", ".join(f"{g}: {r}" for g, r in hardest.items()) + ".", ""]
    lines += [f"- {t}" for t in targets]
    lines += ["", f"Figure: `robustness_tradeoff.png`. Total time of this invocation {settings['seconds']:.0f} s. "
                  f"Runs: `{settings['runs']}`.", ""]
    return "\n".join(lines)


def headline_table(summary: pd.DataFrame, paired: pd.DataFrame, runs: pd.DataFrame,
                   hardest: dict[str, str]) -> list[str]:
    """One row per arm with what the claim is judged on: each minority group's p10 on its hardest
    structure and the controls' region means, ERM's row in Dice (mean ± sd over seeds), every other
    arm's as its paired difference to ERM [sign in each seed]; stability (lost epochs per seed) and
    the minorities' share of the training draws (mean over seeds)."""
    controls = list(dict.fromkeys(summary.loc[summary["group"] == MAJORITY_GROUP, "region"]))
    cells = [(g, r, "p10") for g, r in hardest.items()] + [(MAJORITY_GROUP, r, "mean") for r in controls]
    lines = ["| arm | seeds | " + " | ".join(f"{g} {r} {s}" for g, r, s in cells)
             + " | lost epochs per seed | minorities' share of draws |",
             "|---|---:|" + "---:|" * len(cells) + "---|---:|"]
    for arm in dict.fromkeys(runs["arm"]):
        mine = runs[runs["arm"] == arm].sort_values("seed")
        if arm == BASELINE:
            rows = summary[summary["method"] == arm].set_index(["group", "region"])
            values = [_pm(rows.loc[(g, r), s], rows.loc[(g, r), f"{s}_sd"]) if (g, r) in rows.index else "n/a"
                      for g, r, s in cells]
        else:
            rows = paired[paired["method"] == arm].set_index(["group", "region"])
            values = [_signed(rows.loc[(g, r), f"d_{s}"], rows.loc[(g, r), f"d_{s}_sd"], rows.loc[(g, r), f"d_{s}_signs"])
                      if (g, r) in rows.index else "n/a" for g, r, s in cells]
        lost = ", ".join(str(int(v)) for v in mine["lost_epochs"]) if "lost_epochs" in mine else "-"
        shares = [v for v in (_minority_share_value(r) for _, r in mine.iterrows()) if not np.isnan(v)]
        share = f"{np.mean(shares):.2f}" if shares else "-"
        lines.append(f"| {arm} | {len(mine)} | " + " | ".join(values) + f" | {lost} | {share} |")
    return lines


def _minority_share_value(run: pd.Series) -> float:
    """The minority groups' share of a run's training draws (sum of its ``draw_share_<group>``
    columns); NaN when unknown."""
    shares = [run.get(f"draw_share_{group}") for group in MINORITY_GROUPS]
    known = [share for share in shares if share is not None and np.isfinite(share)]
    return float(sum(known)) if known else float("nan")


def _minority_share(run: pd.Series) -> str:
    """:func:`_minority_share_value` as a table cell, e.g. ``0.26``; ``-`` when unknown."""
    share = _minority_share_value(run)
    return "-" if np.isnan(share) else f"{share:.2f}"


def _epoch(value) -> str:
    """An epoch number as a table cell; ``never`` for None / NaN (no epoch qualified).

    >>> _epoch(33.0), _epoch(None), _epoch(float("nan"))
    ('33', 'never', 'never')
    """
    try:
        value = float(value)
    except (TypeError, ValueError):
        return "never"
    return "never" if not np.isfinite(value) else f"{value:.0f}"


def _fmt(value) -> str:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return "-"
    return "-" if not np.isfinite(value) else f"{value:.3g}"


def terminal_report(summary: pd.DataFrame, paired: pd.DataFrame, targets: list[str]) -> str:
    header = "".join(f"{s:>14}" for s in REPORT_STATISTICS)
    # the arm column fits the longest arm name (e.g. DROAdaptive_noIS_smooth25) plus a space
    width = max([18] + [len(str(m)) + 1 for m in list(summary["method"]) + list(paired["method"])])
    lines = ["Dice (%) per group and region, mean ± sd over seeds",
             f"{'group':<13}{'region':<17}{'arm':<{width}}{'n':>4}" + header]
    previous = None
    for _, r in summary.iterrows():
        key = (r["group"], r["region"])
        left = f"{r['group']:<13}{r['region']:<17}" if key != previous else " " * 30
        previous = key
        lines.append(left + f"{r['method']:<{width}}{r['n_cases_per_seed']:>4.0f}"
                     + "".join(f"{_pm(r[s], r[f'{s}_sd']):>14}" for s in REPORT_STATISTICS))
    lines += ["", "Paired arm - ERM: per-seed difference mean ± sd [sign per seed]",
              f"{'arm':<{width}}{'group':<13}{'region':<17}" + "".join(f"{'Δ' + s:>22}" for s in REPORT_STATISTICS)]
    for _, r in paired.iterrows():
        if r["group"] == "all":
            continue
        lines.append(f"{r['method']:<{width}}{r['group']:<13}{r['region']:<17}"
                     + "".join(f"{_signed(r[f'd_{s}'], r[f'd_{s}_sd'], r[f'd_{s}_signs']):>22}"
                               for s in REPORT_STATISTICS))
    lines += ["", "Targets:"] + ["  " + t for t in targets]
    return "\n".join(lines)


def plot_tradeoff(path: Path, by_seed: pd.DataFrame, hardest: dict[str, str], arms: Sequence[str]) -> None:
    """Minority p10 on its hardest structure (y) against the controls' mean Dice over regions (x),
    one point per arm and seed, one panel per minority group; arm means as large markers."""
    import matplotlib
    matplotlib.use("agg")
    import matplotlib.pyplot as plt

    majority = (by_seed[by_seed["group"] == MAJORITY_GROUP].groupby(["method", "seed"])["mean"].mean())
    groups = [g for g in MINORITY_GROUPS if g in hardest]
    with plt.style.context("default"):
        fig, axes = plt.subplots(1, max(1, len(groups)), figsize=(6.5 * max(1, len(groups)), 5.2), squeeze=False)
        colours = plt.get_cmap("tab10")
        for ax, group in zip(axes[0], groups):
            region = hardest[group]
            tail = by_seed[(by_seed["group"] == group) & (by_seed["region"] == region)].set_index(["method", "seed"])["p10"]
            for k, arm in enumerate(arms):
                keys = [key for key in tail.index if key[0] == arm and key in majority.index]
                if not keys:
                    continue
                x = np.array([majority[key] for key in keys])
                y = np.array([tail[key] for key in keys])
                ax.scatter(x, y, color=colours(k), alpha=0.55, s=30)
                ax.scatter(x.mean(), y.mean(), color=colours(k), s=140, marker="D", edgecolor="black",
                           label=f"{arm} (mean of {len(keys)})")
            ax.set_xlabel("controls: mean Dice over regions (%)")
            ax.set_ylabel(f"{group}: p10 Dice of {region} (%)")
            ax.set_title(f"{group}: worst cases vs the majority")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8, loc="best")
        fig.suptitle("Robustness trade-off: one small point per arm and seed; up = better worst cases, "
                     "right = better majority", fontsize=10)
        fig.tight_layout()
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png", dpi=110)
        plt.close(fig)


def label_noise_section(runs: pd.DataFrame, n_train: int) -> list[str]:
    """With ``--label-noise``: each arm's share of the training draws on the noisy cases against
    uniform sampling's (their share of the training cases: ``n_train``, or the runs'
    ``training_cases`` where the audit took some out), mean over seeds; nothing otherwise.

    >>> runs = pd.DataFrame({"arm": ["ERM", "DRO"], "seed": [0, 0], "noisy_cases": [4, 4],
    ...                      "noisy_draw_share": [0.1, 0.3]})
    >>> print("\\n".join(label_noise_section(runs, 40)[2:-1]))
    | arm | seeds | noisy cases | share of draws on them | x uniform |
    |---|---:|---:|---:|---:|
    | ERM | 1 | 4 | 0.100 | 1.0 |
    | DRO | 1 | 4 | 0.300 | 3.0 |
    """
    if "noisy_draw_share" not in runs or not (runs.get("noisy_cases", pd.Series(dtype=float)) > 0).any():
        return []
    lines = ["## Label noise: are the noisy cases chased?", "",
             "| arm | seeds | noisy cases | share of draws on them | x uniform |", "|---|---:|---:|---:|---:|"]
    for arm, rows in runs.groupby("arm", sort=False):
        share = float(np.nanmean(rows["noisy_draw_share"].astype(float)))
        cases = int(rows["noisy_cases"].max())
        trained = float(np.nanmean(rows["training_cases"].astype(float))) if "training_cases" in rows else n_train
        uniform = cases / trained
        times = f"{share / uniform:.1f}" if uniform > 0 else "-"  # every noisy case taken out by the audit
        lines.append(f"| {arm} | {len(rows)} | {cases} | {share:.3f} | {times} |")
    return lines + [""]

