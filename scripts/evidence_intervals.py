"""Paired gains over seeds, with their 95 % interval over seeds and the ERM-vs-ERM noise floor,
from the stored benchmark record: the one table the README's and docs/evidence.md's evidence
lines are checked against (tests/test_figures.py).

Usage (reads only data_docs/benchmark_record/, trains nothing; a few seconds)::

    python scripts/evidence_intervals.py            # rewrites data_docs/benchmark_record/evidence_intervals.csv
    python scripts/evidence_intervals.py --check    # exit 1 if the stored table is not what the record gives
    python scripts/evidence_intervals.py --markdown decision40_24_200 --cases shifted_test   # at the new centre
    python scripts/evidence_intervals.py --decision   # issue 78's rule on the decision regime's counting seeds
    python scripts/evidence_intervals.py --decision decision40_24_200_issue79   # issue 79's arms in its family
    python scripts/evidence_intervals.py --dose       # issue 78's dose-response, read by its registered rule

Per record, seed and run, five statistics of the Dice (in percent) on the larger test set (100
further test cases per group): the spina bifida cerebellum p10, the "other" intra-axial CSF p10
(numpy's linear percentile) and each control region's mean. A method's value on a seed is the
mean over its runs on that seed (two runs where the record has a rerun: ``ERM_repeat`` is a second
ERM run, ``DROAdaptive_repeat`` a second run of the default); its gain on a seed is that value
minus ERM's value on the same seed (same cohort, same initial weights), so a seed where ERM was
trained twice is compared with the mean of both ERM runs. The gain over seeds: mean, 95 %
t-interval over seeds (k - 1 degrees of freedom; none with one seed) and the signs per seed. The
noise floor is ERM's second run minus its first on the seeds that have both: what a gain looks
like when there is no method at all.

The decision regime's record is tabled twice: over every seed, and (``decision40_24_200_erm_learned``,
which the decision rule reads) over the seeds on which ERM learned the majority (every control mean
>= 80 in the record's ``runs.csv``), as the journal's amendment says.

The same over the new centre's cases (``--shifted-test``: the larger test set's anatomies acquired
at site_C, which no training case comes from) goes to ``evidence_intervals_new_centre.csv``, for the
records that scored them.

These are intervals over seeds (training runs). The record's ``p10_intervals*.csv`` resample test
cases with both networks fixed; they leave out run-to-run variance and are not used here.
"""
from __future__ import annotations

import argparse
import ast
import io
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from nnunet_dro.errors import UserError
from nnunet_dro.evaluation.runs import t_interval
from nnunet_dro.lab import calibration, decision_rule, regime
from nnunet_dro.lab.run_summary import majority_learned

RECORD = Path(__file__).resolve().parents[1] / "data_docs" / "benchmark_record"
#: the test cases read -> the table written: the larger test set, and the new centre's cases
PER_CASE = {"large_test": "per_case_large_test.csv", "shifted_test": "per_case_shifted_test.csv"}
OUTPUTS = {"large_test": RECORD / "evidence_intervals.csv",
           "shifted_test": RECORD / "evidence_intervals_new_centre.csv"}
OUTPUT = OUTPUTS["large_test"]

#: (group, region, statistic): the minorities' worst tenth and the majority's means
#: the majority's statistics: a candidate keeps the majority when each stays within a bound
CONTROLS = ("control white_matter mean", "control intra_axial_csf mean", "control cerebellum mean")
STATISTICS = (
    ("spina_bifida", "cerebellum", "p10"),
    ("other", "intra_axial_csf", "p10"),
    ("control", "white_matter", "mean"),
    ("control", "intra_axial_csf", "mean"),
    ("control", "cerebellum", "mean"),
)
#: record arm -> (method, run): arms that are a second run of a method count as that method's runs
RUNS = {
    "ERM_repeat": ("ERM", 2),
    "DROAdaptive_repeat": ("DROAdaptive", 2),
}
#: method -> the row label the docs give it
LABELS = {
    "DROAdaptive": "default `nnUNetTrainerDROAdaptive`",
    "DROAdaptive_fromStart": "`_fromStart` (robust from epoch 1; the default until Nov. 27)",
    "DROAdaptive_trim5": "`nnUNetTrainerDROAdaptive_trim5` (outlier trim)",
    "DiceTopK10": "`nnUNetTrainerDiceTopK10Loss`",
    "TopK10": "`nnUNetTrainerTopk10Loss`",
    "Oversample033": "`nnUNetTrainer_probabilisticOversampling_033`",
    "JTT": "Just Train Twice (`nnunet_dro jtt`)",
    "GroupBalanced": "balanced sampling (knows the groups)",
    "DROAdaptive_f25_noIS_cap5": "f = 0.25 with the cap",
    "DROAdaptive_f25_ermPhase": "candidate `nnUNetTrainerDROAdaptive_f25_ermPhase`",
    "DROLS": "GI-LS `nnUNetTrainerDROLS`",
    "DROLS_DRO": "GI-LS with the default's sampling `nnUNetTrainerDROLS_DRO`",
    "DROLS_ceAscent": "GI-LS, ascent on the CE alone `nnUNetTrainerDROLS_ceAscent`",
    "DROAdaptive_errorSet": "JTT's set in one training `nnUNetTrainerDROAdaptive_errorSet`",
    "DROAdaptive_errorSet_refresh70": "the same, chosen again at 70 % `_errorSet_refresh70`",
}
#: how the docs name a record's table at the new centre (``--cases shifted_test``)
NEW_CENTRE_SUFFIX = "_new_centre"
#: the records the docs quote, with the cohort each was run on
RECORDS = {
    "alternatives177_240": "177 cases, 240 epochs",
    "robustness177_240": "177 cases, 240 epochs",
    "noise177_240": "177 cases (8 wrong labels), 240 epochs",
    "stability40_240": "40 cases, 240 epochs",
    "stability64": "64 cases, 120 epochs",
    "stability64_240": "64 cases, 240 epochs",
    "decision40_24_200": "40 cases of 24^3, 200 epochs (the decision regime)",
}
#: the records whose alternatives are also read against the default, like for like
AGAINST_DEFAULT = ("alternatives177_240", "decision40_24_200")
#: records also tabled over only the seeds on which ERM learned the majority (:func:`learned_seeds`),
#: under this name
LEARNED_ONLY = {"decision40_24_200": "decision40_24_200_erm_learned"}
RECORDS.update({name: f"{RECORDS[record]}, seeds where ERM learned the majority" for record, name in LEARNED_ONLY.items()})
#: the decision regime (journal, December 5, 2026: written before its runs; amended before seeds
#: 35-37 were read, to count only seeds on which ERM learned the majority): the table read, the
#: statistic a candidate must lift, the seeds it needs, and how far each control mean may move
DECISION = {"record": "decision40_24_200_erm_learned", "statistic": "other intra_axial_csf p10", "seeds": 8,
            "controls": 1.0}


def learned_seeds(runs: pd.DataFrame) -> list[int]:
    """The seeds on which the ERM arm's run has every control region's mean Dice >= 80 on the seed's
    test cases (a record's ``runs.csv``; ``majority_learned``, the benchmark's convergence check).

    >>> runs = pd.DataFrame({"arm": ["ERM", "ERM", "JTT"], "seed": [1, 2, 2], "control_mean_dice": [
    ...     "{'white_matter': 97.0, 'cerebellum': 95.0}", "{'white_matter': 93.0, 'cerebellum': 71.3}",
    ...     "{'white_matter': 97.0, 'cerebellum': 96.0}"]})
    >>> learned_seeds(runs)
    [1]
    """
    erm = runs[runs["arm"] == "ERM"]
    return sorted(int(seed) for seed, means in zip(erm["seed"], erm["control_mean_dice"])
                  if majority_learned(ast.literal_eval(means)))


def statistic(values: np.ndarray, name: str) -> float:
    """``p10`` (numpy's linear percentile) or ``mean`` of one group's per-case Dice.

    >>> statistic(np.arange(11.0), "p10"), statistic(np.arange(11.0), "mean")
    (1.0, 5.0)
    """
    return float(np.percentile(values, 10) if name == "p10" else np.mean(values))


def per_run_statistics(per_case: pd.DataFrame) -> pd.DataFrame:
    """One row per (method, run, seed, statistic): the value of that run on that seed."""
    rows = []
    dice = per_case[per_case["metric"] == "dice"]
    for (arm, seed), run_cases in dice.groupby(["method", "seed"]):
        method, run = RUNS.get(arm, (arm, 1))
        for group, region, name in STATISTICS:
            values = run_cases.loc[(run_cases["condition"] == group) & (run_cases["region"] == region), "value"]
            rows.append({"method": method, "run": run, "seed": int(seed),
                         "statistic": f"{group} {region} {name}", "value": statistic(values.to_numpy(), name)})
    return pd.DataFrame(rows)


def interval_over_seeds(gains: np.ndarray) -> tuple[float, float]:
    """95 % t-interval of the mean over seeds (the product's ``nnunet_dro.evaluation.runs.t_interval``,
    which ``nnunet_dro evaluate --paired-runs`` gives); (nan, nan) with fewer than two seeds.

    >>> low, high = interval_over_seeds(np.array([1.0, 2.0, 3.0]))
    >>> round(low, 2), round(high, 2)
    (-0.48, 4.48)
    """
    return t_interval(gains)


def gains_over_seeds(runs: pd.DataFrame, record: str, baseline: str = "ERM") -> list[dict]:
    """Each method's gain over ``baseline`` per seed (each side the mean over its runs on that seed)
    and over seeds; with ERM as the baseline, also the noise floor (ERM's second run minus its first)."""
    by_seed = runs.groupby(["method", "seed", "statistic"])["value"].agg(["mean", "count"]).reset_index()
    base = by_seed[by_seed["method"] == baseline].set_index(["seed", "statistic"])["mean"]
    rows = []

    def add(method: str, comparison: str, per_seed: pd.Series, runs_per_seed: pd.Series) -> None:
        gains = per_seed.to_numpy()
        low, high = interval_over_seeds(gains)
        rows.append({
            "record": record, "cohort": RECORDS[record], "method": method, "comparison": comparison,
            "statistic": statistic_name, "seeds": len(gains),
            "seed_list": " ".join(str(s) for s in per_seed.index),
            "runs_per_seed": " ".join(str(int(n)) for n in runs_per_seed),
            "gain_per_seed": " ".join(f"{g:+.1f}" for g in gains),
            "mean": round(float(np.mean(gains)), 2),
            "ci_seeds_low": round(low, 2), "ci_seeds_high": round(high, 2),
            "signs": "".join("+" if g > 0 else "-" for g in gains),
        })

    for statistic_name in [f"{g} {r} {s}" for g, r, s in STATISTICS]:
        for method in sorted(set(by_seed["method"]) - {"ERM", baseline}):
            own = by_seed[(by_seed["method"] == method) & (by_seed["statistic"] == statistic_name)].set_index("seed")
            seeds = [s for s in own.index if (s, statistic_name) in base.index]
            gain = pd.Series({s: own.loc[s, "mean"] - base[(s, statistic_name)] for s in seeds}, dtype=float)
            add(method, f"minus {baseline}", gain, own.loc[seeds, "count"])
        if baseline != "ERM":
            continue
        pairs = runs[(runs["method"] == "ERM") & (runs["statistic"] == statistic_name)].pivot(
            index="seed", columns="run", values="value").dropna()
        if 2 in pairs.columns and len(pairs):
            add("ERM", "noise floor: ERM's second run minus its first", pairs[2] - pairs[1],
                pd.Series(2, index=pairs.index))
    return rows


#: arms whose runs are still coming into a record, left out of the docs' table until every counting
#: seed has them (journal, December 7, 16:56: issue 79's secondary reading, nothing read before);
#: ``--decision`` reads them once they are added to its family
HELD_BACK: dict[str, tuple[str, ...]] = {}  # issue 79's arms were released on December 7, 22:30 (all 8 seeds in)


def evidence_table(cases: str = "large_test") -> pd.DataFrame:
    """The whole table, every record the docs quote that scored ``cases`` (a key of ``PER_CASE``)."""
    rows = []
    for record in [r for r in RECORDS if r not in LEARNED_ONLY.values()]:
        if cases != "large_test" and not (RECORD / record / PER_CASE[cases]).is_file():
            continue  # only the larger test set is in every record
        per_case = pd.read_csv(RECORD / record / PER_CASE[cases])
        per_case = per_case[~per_case["method"].isin(HELD_BACK.get(record, ()))]
        runs = per_run_statistics(per_case)
        rows.extend(gains_over_seeds(runs, record))
        if record in AGAINST_DEFAULT:  # the alternatives against the default, like for like
            rows.extend(gains_over_seeds(runs, record, baseline="DROAdaptive"))
        if record in LEARNED_ONLY:
            kept = learned_seeds(pd.read_csv(RECORD / record / "runs.csv"))
            rows.extend({**row, "record": LEARNED_ONLY[record], "cohort": RECORDS[LEARNED_ONLY[record]]}
                        for row in gains_over_seeds(runs[runs["seed"].isin(kept)], record))
            if record in AGAINST_DEFAULT:  # the paired interval a claim between an arm and the default needs
                rows.extend({**row, "record": LEARNED_ONLY[record], "cohort": RECORDS[LEARNED_ONLY[record]]}
                            for row in gains_over_seeds(runs[runs["seed"].isin(kept)], record, baseline="DROAdaptive"))
    return pd.DataFrame(rows)


def decision(table: pd.DataFrame, rule: dict = DECISION) -> pd.DataFrame:
    """The December 5 rule (superseded by issue 78's, :func:`rule_verdict`; kept because the record's
    first reading was made by it), per candidate: its gain over ERM on ``rule["statistic"]`` has a 95 %
    interval over at least ``rule["seeds"]`` seeds above 0 and above every other candidate's point
    estimate, and each control region's mean gain has its interval inside +-``rule["controls"]``.
    A candidate that meets all of it may become the default; the table says which part fails.

    >>> rows = []
    >>> for m, (mean, low, high) in {"A": (8, 3, 13), "B": (2, -1, 5)}.items():
    ...     rows.append(dict(record="r", method=m, comparison="minus ERM", statistic="s", seeds=8,
    ...                      mean=mean, ci_seeds_low=low, ci_seeds_high=high))
    ...     rows += [dict(record="r", method=m, comparison="minus ERM", statistic=c, seeds=8,
    ...                   mean=0.1, ci_seeds_low=-0.5, ci_seeds_high=0.6) for c in CONTROLS]
    >>> decision(pd.DataFrame(rows), {"record": "r", "statistic": "s", "seeds": 8, "controls": 1.0})[
    ...     ["method", "meets_rule"]].values.tolist()
    [['A', True], ['B', False]]
    """
    part = table[(table["record"] == rule["record"]) & (table["comparison"] == "minus ERM")]
    gain = part[part["statistic"] == rule["statistic"]].set_index("method")
    rows = []
    for method, r in gain.iterrows():
        others = gain.drop(index=method)["mean"]
        controls = part[(part["method"] == method) & part["statistic"].isin(CONTROLS)]
        checks = {"enough_seeds": int(r["seeds"]) >= rule["seeds"],
                  "above_0": bool(r["ci_seeds_low"] > 0),
                  "above_every_alternative": bool(len(others) == 0 or r["ci_seeds_low"] > others.max()),
                  "controls_within": bool(len(controls) == len(CONTROLS)
                                          and (controls["ci_seeds_low"] >= -rule["controls"]).all()
                                          and (controls["ci_seeds_high"] <= rule["controls"]).all())}
        rows.append({"method": method, "seeds": int(r["seeds"]), "gain": r["mean"],
                     "ci_seeds_low": r["ci_seeds_low"], "ci_seeds_high": r["ci_seeds_high"], **checks,
                     "meets_rule": all(checks.values())})
    return pd.DataFrame(rows)


#: issue 78's rule (nnunet_dro.lab.decision_rule), per record it is applied to: the arms compared
#: (Holm's family), which of them are one training, the default now. On decision40_24_200 it is a
#: secondary reading: those seeds had been read before the rule was written. The family is the five
#: arms the December 5 rule compared (the GI-LS arms were queued after it; with them the verdict is
#: the same, tests/test_figures.py).
RULES = {
    "decision40_24_200": (("DROAdaptive", "DROAdaptive_f25_ermPhase", "DROAdaptive_fromStart", "DiceTopK10", "JTT"),
                          decision_rule.Rule(primary="other intra_axial_csf p10", controls=CONTROLS,
                                             single_training=("DROAdaptive", "DROAdaptive_f25_ermPhase",
                                                              "DROAdaptive_fromStart", "DiceTopK10"),
                                             current_default="DROAdaptive")),
}
#: issue 79's secondary reading (journal, December 7, 16:56 and 20:10, fixed before it): its two arms on the
#: decision regime's counting seeds, read with the December 5 family in Holm's family (seven arms);
#: both are one training each. A reading of a record under another name (:data:`READINGS`).
ISSUE_79_ARMS = ("DROAdaptive_errorSet", "DROAdaptive_errorSet_refresh70")
RULES["decision40_24_200_issue79"] = (RULES["decision40_24_200"][0] + ISSUE_79_ARMS, decision_rule.Rule(
    primary="other intra_axial_csf p10", controls=CONTROLS,
    single_training=RULES["decision40_24_200"][1].single_training + ISSUE_79_ARMS, current_default="DROAdaptive"))
#: a reading's name -> the record it reads (a reading without an entry reads the record of its name)
READINGS = {"decision40_24_200_issue79": "decision40_24_200"}
#: the converged regime's decision (journal, pre-registration of December 6; its budget 1,600 epochs,
#: December 7): Holm's family is the regime's arms but ERM's two runs (the default, `_f25_ermPhase`,
#: JTT, issue 79's trainer and its refresh variant); every one of them but JTT is one training
CONVERGED_FAMILY = tuple(arm for arm in regime.CONVERGED_ARMS if arm not in calibration.ERM_RUNS)
RULES["converged2d_125_1600"] = (CONVERGED_FAMILY, decision_rule.Rule(
    primary="other intra_axial_csf p10", controls=CONTROLS,
    single_training=tuple(arm for arm in CONVERGED_FAMILY if arm != "JTT"), current_default="DROAdaptive"))
#: the size of that family: the design's seeds are computed for it, from the spread of the arms the
#: record already holds of it
CONVERGED_ARMS = len(CONVERGED_FAMILY)
CARRIED_ARMS = ("DROAdaptive", "DROAdaptive_f25_ermPhase", "JTT")


def seed_gains(runs: pd.DataFrame) -> pd.DataFrame:
    """Per method, seed and statistic: the method's value (mean over its runs on the seed) minus
    ERM's (mean over ERM's runs on the seed): the paired gains the decision rule reads."""
    by_seed = runs.groupby(["method", "seed", "statistic"])["value"].mean().reset_index()
    erm = by_seed[by_seed["method"] == "ERM"].set_index(["seed", "statistic"])["value"]
    arms = by_seed[(by_seed["method"] != "ERM")
                   & pd.MultiIndex.from_frame(by_seed[["seed", "statistic"]]).isin(erm.index)].copy()
    arms["gain"] = [value - erm[(seed, name)] for seed, name, value in
                    zip(arms["seed"], arms["statistic"], arms["value"])]
    return arms[["method", "seed", "statistic", "gain"]].reset_index(drop=True)


def counting_seeds(record: str) -> tuple[list[int], dict[int, str]]:
    """The seeds a record's decision counts, and why each other seed does not. A record of the
    converged regime carries its registered exclusion test (both ERM runs' verdicts on nnU-Net's
    validation cases, ``calibration_checks.csv``); the decision regime's record counts the seeds on
    which ERM learned the majority (:func:`learned_seeds`)."""
    checks = RECORD / record / "calibration_checks.csv"
    if checks.is_file():
        return calibration.counting_seeds(pd.read_csv(checks))
    runs = pd.read_csv(RECORD / record / "runs.csv")
    kept = learned_seeds(runs)
    return kept, {int(s): "ERM did not learn the majority" for s in sorted(set(runs["seed"])) if s not in kept}


def record_gains(record: str, cases: str = "large_test") -> pd.DataFrame:
    """A record's paired gains on ``cases`` (the larger test set by default), over its counting seeds."""
    runs = per_run_statistics(pd.read_csv(RECORD / record / PER_CASE[cases]))
    kept, _ = counting_seeds(record)
    return seed_gains(runs[runs["seed"].isin(kept)])


#: the worst tenth of the rare group's HD95 (its 90th percentile: lower is better), the secondary the
#: converged regime registered (journal, December 7)
HD95_SECONDARY = ("other", "intra_axial_csf")


def hd95_gains(record: str) -> pd.DataFrame:
    """Per arm and counting seed: ERM's HD95 90th percentile of the rare group's hardest structure
    minus the arm's (positive: the arm's worst tenth lies closer to the reference), from the record's
    ``hd95_large_test.csv``; ERM's value is the mean over its runs on the seed."""
    table = pd.read_csv(RECORD / record / "hd95_large_test.csv")
    group, region = HD95_SECONDARY
    part = table[(table["group"] == group) & (table["region"] == region)]
    kept, _ = counting_seeds(record)
    runs = pd.DataFrame({"method": [RUNS.get(a, (a, 1))[0] for a in part["method"]], "seed": part["seed"].astype(int),
                         "statistic": f"{group} {region} HD95 p90", "value": part["p90"].astype(float)})
    gains = seed_gains(runs[runs["seed"].isin(kept)])
    gains["gain"] = -gains["gain"]  # lower is better: ERM's minus the arm's
    return gains


def secondary_table(record: str, arms: tuple[str, ...]) -> pd.DataFrame:
    """The secondaries the rule reports beside its verdict, never used to pick: per arm, the paired
    gain over ERM with its unadjusted 95 % t-interval over the counting seeds, for the other
    minority's worst tenth, the rare group's worst tenth at the new centre and (where the record has
    it) the rare group's HD95 worst tenth."""
    parts = [record_gains(record).query("statistic == 'spina_bifida cerebellum p10'")]
    if (RECORD / record / PER_CASE["shifted_test"]).is_file():
        shifted = record_gains(record, "shifted_test").query("statistic == 'other intra_axial_csf p10'").copy()
        shifted["statistic"] = "other intra_axial_csf p10, new centre"
        parts.append(shifted)
    if (RECORD / record / "hd95_large_test.csv").is_file():
        parts.append(hd95_gains(record))
    gains = pd.concat(parts, ignore_index=True)
    rows = []
    for (name, method), per_seed in gains[gains["method"].isin(arms)].groupby(["statistic", "method"], sort=False):
        low, high = interval_over_seeds(per_seed["gain"].to_numpy())
        rows.append({"statistic": name, "method": method, "seeds": len(per_seed),
                     "gain": round(float(per_seed["gain"].mean()), 2), "ci_low": round(low, 2), "ci_high": round(high, 2)})
    return pd.DataFrame(rows)


def rule_verdict(record: str = "decision40_24_200",
                 arms: tuple[str, ...] | None = None) -> tuple[decision_rule.Verdict, decision_rule.Rule]:
    """Issue 78's rule on a record (its counting seeds; ``arms`` replaces the record's family)."""
    if record not in RULES:
        raise UserError(f"--decision: no rule is set for record {record!r} (known: {', '.join(RULES)})")
    family, rule = RULES[record]
    record = READINGS.get(record, record)
    held = sorted(set(arms or family) & set(HELD_BACK.get(record, ())))
    if held:  # nothing of a reading is shown before all its counting seeds are in (the journal's promise)
        raise UserError(f"--decision: {', '.join(held)} on {record} are held back until every counting seed "
                        f"has them (HELD_BACK in scripts/evidence_intervals.py)")
    gains = record_gains(record)
    return decision_rule.decide(gains[gains["method"].isin(arms or family)], rule), rule


def design_lines(gains: pd.DataFrame, primary: str, arms: int = CONVERGED_ARMS) -> list[str]:
    """The design's detectable gain from the spread of per-seed primary gains (the largest over the
    arms), at Holm's strictest level for ``arms`` arms, and the seeds the rule asks for."""
    spread = gains[gains["statistic"] == primary].groupby("method")["gain"].std(ddof=1)
    sd, seeds = float(spread.max()), int(gains["seed"].nunique())
    needed = decision_rule.seeds_needed(sd, arms)
    return [f"per-seed sd of the primary gain: {spread.min():.1f} to {sd:.1f} (largest: {spread.idxmax()})",
            f"detectable with 80 % power at alpha 0.05 / {arms}: +{decision_rule.detectable_gain(sd, seeds, 0.05 / arms):.1f} "
            f"at {seeds} seeds; <= +{decision_rule.TARGET_GAIN:.0f} needs {needed} seeds "
            f"(+{decision_rule.detectable_gain(sd, needed, 0.05 / arms):.1f})"]


#: the dose-response (issue 78, item 1; journal, December 6): the decision regime's arms ERM, the
#: default and JTT's second stage at 1x, 2x and (journal, December 7, 17:58: the last rung) 4x its
#: budget on its first four counting seeds, each later budget read against 1x by
#: ``calibration.dose_response_reading`` on the primary statistic. A later budget is read once its
#: record exists, and then only whole (every seed and arm in it)
DOSE = {"records": {"1x": "decision40_24_200", "2x": "decision40_24_400", "4x": "decision40_24_800"},
        "seeds": (30, 31, 32, 34), "arms": ("DROAdaptive", "JTT"), "epochs": {"2x": 400, "4x": 800}}
PRIMARY = "other intra_axial_csf p10"


def dose_budgets(record: Path = RECORD, dose: dict = DOSE) -> list[str]:
    """The budgets read: 1x and 2x always, each later one whose record folder exists."""
    return [b for b in dose["records"] if b in ("1x", "2x") or (record / dose["records"][b]).is_dir()]


def dose_gains(record_dir: Path, seeds: tuple[int, ...]) -> pd.DataFrame:
    """One record's paired gains on the larger test set over ``seeds`` (every one must be there:
    the reading compares the same seeds at every budget)."""
    runs = per_run_statistics(pd.read_csv(record_dir / PER_CASE["large_test"]))
    missing = sorted(set(seeds) - set(runs.loc[runs["method"] == "ERM", "seed"]))
    if missing:
        raise UserError(f"--dose: {record_dir.name} has no ERM run on seed(s) {missing}")
    return seed_gains(runs[runs["seed"].isin(seeds)])


def dose_table(record: Path = RECORD, dose: dict = DOSE) -> pd.DataFrame:
    """Per arm and statistic: the gains over ERM per seed at each budget, their means, and at each
    budget after 1x, for the primary statistic the registered reading against 1x (holds / shrinks /
    vanishes: ``reading_2x``, ``reading_4x``); for a control region whether its mean gain there stays
    above -1 point (the prediction's "within 1 point")."""
    seeds, budgets = tuple(dose["seeds"]), dose_budgets(record, dose)
    gains = {budget: dose_gains(record / dose["records"][budget], seeds) for budget in budgets}
    rows = []
    for method in dose["arms"]:
        for group, region, name in STATISTICS:
            statistic_name = f"{group} {region} {name}"
            row = {"method": method, "statistic": statistic_name, "seeds": " ".join(map(str, seeds))}
            per_budget = {}
            for budget, table in gains.items():
                part = table[(table["method"] == method) & (table["statistic"] == statistic_name)].set_index("seed")
                absent = [s for s in seeds if s not in part.index]
                if absent:
                    raise UserError(f"--dose: {dose['records'][budget]} has no {method} run on seed(s) {absent}")
                per_budget[budget] = values = part.loc[list(seeds), "gain"].to_numpy(dtype=float)
                row[f"gain_per_seed_{budget}"] = " ".join(f"{g:+.1f}" for g in values)
                row[f"mean_{budget}"] = round(float(values.mean()), 2)
            for budget in budgets[1:]:
                later = per_budget[budget]
                if statistic_name == PRIMARY:
                    reading = calibration.dose_response_reading(per_budget["1x"], later)
                elif group == "control":
                    reading = (f"within 1 point at {budget}" if later.mean() > -decision_rule.MARGIN
                               else f"costs 1 point or more at {budget}")
                else:
                    reading = ""
                row[f"reading_{budget}"] = reading
            rows.append(row)
    return pd.DataFrame(rows)


def dose_fit_table(record: Path = RECORD, dose: dict = DOSE) -> pd.DataFrame:
    """Per arm run and seed: the "other" group's training-set intra-axial CSF Dice (the mean over its
    3 training cases) at the end of the 1x runs, and along each later budget's runs (every network
    kept), with the ERM runs' rise over their last quarter there: the next budget is trained only
    where an ERM run rises by ``calibration.PLATEAU_RISE`` or more (4x is the last)."""
    group, region = calibration.PLATEAU_GROUP, calibration.PLATEAU_REGION
    seeds = list(dose["seeds"])
    one = pd.read_csv(record / dose["records"]["1x"] / "training_fit.csv")
    one = one[(one["group"] == group) & (one["region"] == region) & one["seed"].isin(seeds)]
    curves = {}
    for budget in dose_budgets(record, dose)[1:]:
        curve = pd.read_csv(record / dose["records"][budget] / "training_fit_curve.csv")
        curves[budget] = curve[(curve["group"] == group) & (curve["region"] == region) & curve["seed"].isin(seeds)]
    rows = []
    for method in ("ERM", "ERM_repeat", *dose["arms"]):
        for seed in seeds:
            at_1x = one.loc[(one["method"] == method) & (one["seed"] == seed), "training_mean"]
            along = {b: c[(c["method"] == method) & (c["seed"] == seed)] for b, c in curves.items()}
            if at_1x.empty and all(a.empty for a in along.values()):
                continue
            row = {"method": method, "seed": seed,
                   "fit_1x_end": round(float(at_1x.iloc[0]), 2) if len(at_1x) else np.nan}
            for budget, part in along.items():
                fit = dict(zip(part["epoch"].astype(int), part["mean"].astype(float)))
                row.update({f"fit_{budget}_epoch_{e}": round(v, 2) for e, v in sorted(fit.items())})
                epochs = int(dose["epochs"][budget])
                if fit and epochs in fit:
                    rise = calibration.last_quarter_rise(fit, epochs)
                    row[f"rise_last_quarter_{budget}"] = round(rise, 2)
                    row[f"plateaued_{budget}"] = bool(rise < calibration.PLATEAU_RISE)
            rows.append(row)
    return pd.DataFrame(rows)


def _rising_erm(fit: pd.DataFrame, budget: str) -> list[int]:
    """The seeds whose ERM run still rises over the last quarter at ``budget`` (an error where one
    has no value at its last epoch or at 75 %)."""
    erm = fit[fit["method"] == "ERM"]
    column = f"plateaued_{budget}"
    if column not in erm or erm[column].isna().any():
        raise UserError(f"--dose: an ERM run at {budget} has no training-fit value at its last epoch or at 75 %")
    return [int(s) for s in erm.loc[~erm[column].astype(bool), "seed"]]


def dose_lines(record: Path = RECORD, dose: dict = DOSE) -> list[str]:
    """The dose-response's reading in words and tables (``--dose``)."""
    budgets = dose_budgets(record, dose)
    table, fit = dose_table(record, dose), dose_fit_table(record, dose)
    last, rise = budgets[-1], f"{calibration.PLATEAU_RISE:g} point"
    rising = _rising_erm(fit, last)
    if last == "2x":
        verdict = ("4x is to be trained: ERM's training-set Dice on its rare cases still rises by "
                   f"{rise} or more over the last quarter at 2x on seed(s) " + ", ".join(map(str, rising)) if rising else
                   f"4x is not needed: on every seed ERM's training-set Dice on its rare cases rises by less than "
                   f"{rise} over the last quarter at 2x")
    else:
        verdict = (f"the dose-response is truncated at {last} (the last rung): ERM's training-set Dice on its rare "
                   f"cases still rises by {rise} or more over the last quarter on seed(s) " + ", ".join(map(str, rising))
                   if rising else
                   f"ERM has plateaued at {last}: on every seed its training-set Dice on its rare cases rises by less "
                   f"than {rise} over the last quarter")
    primary = table[table["statistic"] == PRIMARY]
    words = []
    for _, r in primary.iterrows():
        readings = ", ".join(f"{r[f'reading_{b}']} at {b}" for b in budgets[1:])
        means = ", ".join(f"{r[f'mean_{b}']:+.1f} at {b}" for b in budgets)
        words.append(f"{r['method']}: the primary gain {readings} ({means})")
    return [f"dose-response on seeds {' '.join(map(str, dose['seeds']))} ("
            + ", ".join(f"{b} {dose['records'][b]}" for b in budgets)
            + "; gains over ERM on the larger test set, ERM the mean of its runs on the seed)",
            table.to_string(index=False), "",
            "the \"other\" group's training-set intra-axial CSF Dice (mean over its training cases):",
            fit.to_string(index=False), "", *words, verdict]


def short_cell(table: pd.DataFrame, record: str, method: str, statistic: str, baseline: str = "ERM") -> str:
    """``+5.7 (0.2 to 11.2)``: one stored cell, as the pages quote it."""
    rows = table[(table["record"] == record) & (table["method"] == method) & (table["statistic"] == statistic)
                 & (table["comparison"] == f"minus {baseline}")]
    if len(rows) != 1:
        raise UserError(f"evidence table: no single cell for {record} {method} {statistic} minus {baseline}")
    r = rows.iloc[0]
    return f"{r['mean']:+.1f} ({r['ci_seeds_low']:.1f} to {r['ci_seeds_high']:.1f})"


#: a region as the pages write it
REGION_WORDS = {"white_matter": "white matter", "intra_axial_csf": "intra-axial CSF", "cerebellum": "cerebellum"}
#: where the README's bottom line sends the reader for the rule
RULE_LINK = "docs/evidence.md#the-decision-regime-8-counting-seeds-no-arm-meets-the-rule"


def bottom_line(table: pd.DataFrame) -> str:
    """The README's bottom line, one sentence made from issue 78's rule on the decision regime and
    the stored table's cells (tests/test_figures.py checks the README holds exactly this)."""
    verdict, rule = rule_verdict()
    record, default = DECISION["record"], verdict.default
    arms = verdict.arms.set_index("method")
    regime = (f"in the decision regime (40 cases, 200 epochs, {int(arms.loc[default, 'seeds'])} paired seeds, "
              f"[read by the rule]({RULE_LINK}) after those seeds were seen)")
    jtt = short_cell(table, record, rule.two_trainings, rule.primary, baseline=default)
    if verdict.nothing_shown:
        worst = arms.loc[default, "worst_control"]
        region = "controls' " + REGION_WORDS[worst.split()[1]]
        return ("**Bottom line:** use nnU-Net itself (ERM) unless a comparison with ERM on your own folds shows a "
                f"rare group's worst tenth lifted at no cost to the majority: {regime} nothing single-training is "
                "shown to help without risking the majority (the default's gain on the rare group, "
                f"{short_cell(table, record, default, rule.primary)}, is not above 0 after Holm's adjustment, and its "
                f"{region} mean, "
                f"{short_cell(table, record, default, worst)}, is not shown within {rule.margin:g} point), and "
                f"Just Train Twice is {'ahead of' if verdict.jtt_recommended else 'not shown ahead of'} the default "
                f"({jtt}).")
    return (f"**Bottom line:** {regime} `{default}` is the one-training choice "
            f"({short_cell(table, record, default, rule.primary)} on the rare group's worst tenth, every control "
            f"mean's lower bound above -{rule.margin:g}); Just Train Twice is "
            f"{'worth its second training' if verdict.jtt_recommended else 'not shown ahead of it'} ({jtt}).")


def cell(row: pd.Series) -> str:
    """One table cell: mean gain, its 95 % interval over seeds and the sign per seed.

    >>> cell(pd.Series({"mean": 10.6, "ci_seeds_low": 3.0, "ci_seeds_high": 18.2, "signs": "+++", "seeds": 3}))
    '+10.6 (3.0 to 18.2) [+++]'
    >>> cell(pd.Series({"mean": 14.2, "ci_seeds_low": float("nan"), "ci_seeds_high": float("nan"), "signs": "+", "seeds": 1}))
    '+14.2 (one seed) [+]'
    """
    interval = "one seed" if int(row["seeds"]) < 2 else f"{row['ci_seeds_low']:.1f} to {row['ci_seeds_high']:.1f}"
    return f"{row['mean']:+.1f} ({interval}) [{row['signs']}]"


def markdown_table(table: pd.DataFrame, record: str, comparison: str = "ERM",
                   methods: tuple[str, ...] | None = None, title: str | None = None) -> list[str]:
    """The docs' table of one record: a row per method, a column per statistic (tests/test_figures.py
    compares docs/evidence.md's cells with this); ``title`` names it (default: the record)."""
    part = table[(table["record"] == record) & (table["comparison"].str.endswith(comparison)
                                                | table["comparison"].str.startswith("noise floor"))]
    if comparison != "ERM":
        part = part[part["comparison"] == f"minus {comparison}"]
    if methods is not None:
        part = part[part["method"].isin(methods)]
    names = [f"{g} {r} {s}" for g, r, s in STATISTICS]
    lines = [f"| {title or record}: minus {comparison} | seeds | " + " | ".join(names) + " |",
             "|---|---:|" + "---:|" * len(names)]
    for (method, comp), rows in part.groupby(["method", "comparison"], sort=False):
        label = "ERM again (noise floor)" if comp.startswith("noise floor") else LABELS.get(method, method)
        by_name = rows.set_index("statistic")
        lines.append(f"| {label} | {by_name.iloc[0]['seeds']} | "
                     + " | ".join(cell(by_name.loc[n]) for n in names) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the stored table, write nothing")
    parser.add_argument("--decision", nargs="?", const="decision40_24_200", metavar="RECORD",
                        help="issue 78's rule on a record's counting seeds (default: the decision regime, a "
                             "secondary reading of seeds read before the rule was written; "
                             "decision40_24_200_issue79: the same with issue 79's two arms in Holm's family)")
    parser.add_argument("--dose", action="store_true",
                        help="issue 78's dose-response: the default's and JTT's gains at 1x, 2x (and 4x once its record "
                             "exists) the decision regime's budget, read by the registered rule, and ERM's fit of its "
                             "rare training cases")
    parser.add_argument("--bottom-line", action="store_true", help="print the README's bottom line, from the rule")
    parser.add_argument("--markdown", metavar="RECORD[:BASELINE[:METHOD,...]]", help="print one record's docs table")
    parser.add_argument("--cases", choices=tuple(PER_CASE), default="large_test",
                        help="--markdown: the larger test set (default) or the new centre's cases")
    args = parser.parse_args(argv)
    if args.decision:  # the rule was written for the larger test set
        try:
            verdict, rule = rule_verdict(args.decision)
        except UserError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        record = READINGS.get(args.decision, args.decision)
        if record == "decision40_24_200":
            print(f"{args.decision}, counting seeds: a secondary reading (these seeds were read before the rule "
                  "was written)")
        columns = ["method", "seeds", "gain", "ci_low", "ci_high", "holm_rank", "holm_p", "holm_low", "holm_high",
                   "worst_control", "lowest_control_bound", "primary_above_0", "controls_noninferior", "eligible"]
        kept, excluded = counting_seeds(record)
        print(f"counting seeds ({len(kept)}): {' '.join(map(str, kept))}"
              + "".join(f"; seed {seed} excluded: {why}" for seed, why in excluded.items()))
        print(verdict.arms[columns].round(2).to_string(index=False))
        print("\n".join(verdict.lines(rule)))
        print("secondary statistics (reported beside, never used to pick; unadjusted 95 % intervals over seeds):")
        print(secondary_table(record, RULES[args.decision][0]).to_string(index=False))
        gains = record_gains(record)
        print("design of the converged regime, from this record's spread of " + ", ".join(CARRIED_ARMS) + ":")
        print("\n".join(design_lines(gains[gains["method"].isin(CARRIED_ARMS)], rule.primary)))
        return 0
    if args.dose:
        try:
            print("\n".join(dose_lines()))
        except UserError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        return 0
    tables = {cases: evidence_table(cases) for cases in PER_CASE}
    table = tables["large_test"]
    if args.bottom_line:
        print(bottom_line(table))
        return 0
    if args.markdown:
        record, baseline, methods = (args.markdown.split(":") + ["", ""])[:3]
        title = record + (NEW_CENTRE_SUFFIX if args.cases == "shifted_test" else "")
        print("\n".join(markdown_table(tables[args.cases], record, baseline or "ERM",
                                        tuple(methods.split(",")) if methods else None, title)))
        return 0
    if args.check:
        for cases, output in OUTPUTS.items():
            stored = pd.read_csv(output, keep_default_na=False, dtype=str)
            fresh = pd.read_csv(io.StringIO(tables[cases].to_csv(index=False)), keep_default_na=False, dtype=str)
            if not stored.equals(fresh):
                print(f"{output} is not what the record gives: run scripts/evidence_intervals.py", file=sys.stderr)
                return 1
        return 0
    for cases, output in OUTPUTS.items():
        tmp = output.with_suffix(".csv.tmp")
        tables[cases].to_csv(tmp, index=False)
        tmp.replace(output)
    print(table.to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
